// spmd/tensor/factory.cpp: the factories of tensor/factory.h.
#include <spmd/tensor/factory.h>

#include <algorithm>

#include <spmd/core/error.h>
#include <spmd/tensor/meta.h>

namespace spmd {

Tensor empty(const Shape& shape, DType dtype, Device device) {
  const int64_t numel = checked_numel(shape, "empty");
  if (device.is_cpu() && meta_tensors()) device = meta_device();
  auto storage = Storage::allocate(static_cast<std::size_t>(numel) * itemsize(dtype), device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor out = empty(shape, dtype, device);
  out.fill_(value);
  return out;
}

Tensor arange(int64_t n, DType dtype) {
  if (n < 0) throw_error<ShapeError>("arange: n must be non-negative, got {}", n);
  if (dtype == DType::Bool) throw_error<Unsupported>("arange: dtype bool is not supported");
  Tensor out = empty({n}, dtype);
  if (out.is_meta()) return out;
  dispatch_dtype(dtype, [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = convert_element<T>(i);
  });
  return out;
}

Tensor scalar_tensor(double value, DType dtype) {
  return full({}, value, dtype);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  const Shape actual = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  const int64_t numel = checked_numel(actual, "from_vector");
  if (static_cast<std::size_t>(numel) != values.size()) {
    throw_error<ShapeError>("from_vector: {} values do not fill shape {} ({} elements)",
                            values.size(), shape_str(actual), numel);
  }
  Tensor out = empty(actual, dtype_of<T>());
  if (out.is_meta()) return out;
  std::copy(values.begin(), values.end(), out.data<T>());
  return out;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&);

}  // namespace spmd
