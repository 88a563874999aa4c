// spmd/tensor/compare.cpp: the comparisons of tensor/compare.h, on the inputs' device.
#include <spmd/tensor/compare.h>

#include <spmd/core/error.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {

bool equal(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("equal", {&a, &b});
  if (a.shape() != b.shape()) return false;
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.equal(a.to(dtype), b.to(dtype));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  DeviceOps& kernels = kernels_for("allclose", {&a, &b});
  if (!(rtol >= 0.0) || !(atol >= 0.0)) {
    throw_error<Unsupported>(
        "allclose: tolerances must be non-negative numbers, got rtol {} and atol {} (shapes {} "
        "and {})",
        rtol, atol, shape_str(a.shape()), shape_str(b.shape()));
  }
  if (a.shape() != b.shape()) return false;
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.allclose(a.to(dtype), b.to(dtype), rtol, atol);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("max_abs_diff", {&a, &b});
  if (a.shape() != b.shape()) {
    throw_error<ShapeError>("max_abs_diff: shapes {} and {} differ", shape_str(a.shape()),
                            shape_str(b.shape()));
  }
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.max_abs_diff(a.to(dtype), b.to(dtype));
}

bool has_nonfinite(const Tensor& t) {
  return kernels_for("has_nonfinite", {&t}).has_nonfinite(t);
}

}  // namespace spmd
