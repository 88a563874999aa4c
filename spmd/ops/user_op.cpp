// spmd/ops/user_op.cpp: the host loops behind user-defined elementwise ops (ops/user_op.h).
#include <spmd/ops/user_op.h>

#include <vector>

#include <spmd/tensor/factory.h>

namespace spmd::user_op {
namespace {

// `t` as contiguous F64 on the host.
Tensor host_f64(const Tensor& t) {
  return t.detach().to(cpu()).to(DType::F64).contiguous();
}

}  // namespace

Tensor map(const Tensor& in, double (*f)(double), DType dtype) {
  const Tensor x = host_f64(in);
  const double* px = x.data<double>();
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = f(px[i]);
  return from_vector(out, {x.numel()}).reshape(in.shape()).to(dtype).to(in.device());
}

Tensor map_derivative(std::span<const Tensor> grad_x_y, double (*df)(double, double), DType dtype) {
  const Shape& shape = grad_x_y[0].shape();
  const Tensor g = host_f64(grad_x_y[0]);
  const Tensor x = host_f64(grad_x_y[1].expand(shape));
  const Tensor y = host_f64(grad_x_y[2].expand(shape));
  const double* pg = g.data<double>();
  const double* px = x.data<double>();
  const double* py = y.data<double>();
  std::vector<double> out(static_cast<size_t>(g.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = pg[i] * df(px[i], py[i]);
  return from_vector(out, {g.numel()}).reshape(shape).to(dtype).to(grad_x_y[0].device());
}

}  // namespace spmd::user_op
