// spmd/ops/user_op.h: elementwise ops that user code defines: a per-element function and its
// derivative become an op-table entry with the sharding strategies and the backward of any
// elementwise op, usable on Tensors (call), LocalTensors (local_call) and DTensors (dispatch).
//
//   struct Softplus {
//     static constexpr std::string_view name = "softplus";
//     static double f(double x) { return std::log1p(std::exp(x)); }
//     static double df(double x, double y) { return 1.0 / (1.0 + std::exp(-x)); }  // y = f(x)
//   };
//   inline const OpDef softplus = user_unary_op<Softplus, PartialRule::NonDecreasing>();
//
//   Tensor y = call(softplus, {x});
//   DTensor z = dispatch(softplus, {d});        // S(0) stays S(0); P(max) passes (non-decreasing)
//   backward(sum(z));                           // d.grad() = grad * Softplus::df(x, y)
//
// The rule says which Partial placements pass (ops/strategy.h): None is always correct. The
// function runs on the host in double for every floating dtype (integer inputs give F32), one
// element at a time: tensors on another device are copied to the host and back. The built-in ops
// (tensor/element_ops.h) are the fast path; this is for what they lack.
#pragma once

#include <span>
#include <string_view>

#include <spmd/ops/autograd.h>
#include <spmd/ops/op.h>
#include <spmd/ops/pointwise.h>
#include <spmd/ops/strategy.h>

namespace spmd {
namespace user_op {

// f applied to every element of `in`, as `dtype`.
Tensor map(const Tensor& in, double (*f)(double), DType dtype);
// grad * df(x, y) elementwise (all of grad's shape and dtype, y = f(x)).
Tensor map_derivative(std::span<const Tensor> grad_x_y, double (*df)(double, double), DType dtype);

template <class F>
OpMeta meta(std::span<const InputMeta> in, const OpArgs&) {
  return pointwise::unary_meta(F::name, element::Domain::Floating, in[0]);
}
template <class F>
Tensor compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return map(in[0], &F::f, out.dtype);
}
template <class F>
Tensor derivative(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return map_derivative(in, &F::df, out.dtype);
}
// "softplus_backward": (grad, x, y) -> grad * F::df(x, y), linear in grad.
template <class F>
inline constexpr OpDef kDerivative{
    .name = pointwise::JoinedName<F, pointwise::BackwardSuffix>::value,
    .meta = &pointwise::derivative_meta,
    .compute = &derivative<F>,
    .strategies = &pointwise::derivative_strategies,
};
template <class F>
void backward(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, apply(kDerivative<F>, {c.grad(), c.input(0), c.output()}));
}

}  // namespace user_op

// The entry of the elementwise op whose per-element function is F::f with derivative F::df (see
// the banner); `rule` says which Partial placements pass through it.
template <class F, PartialRule rule = PartialRule::None>
constexpr OpDef user_unary_op() {
  return OpDef{
      .name = F::name,
      .meta = &user_op::meta<F>,
      .compute = &user_op::compute<F>,
      .strategies = &pointwise::unary_strategies_of<rule>,
      .backward = &user_op::backward<F>,
  };
}

}  // namespace spmd
