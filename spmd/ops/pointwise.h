// spmd/ops/pointwise.h: op-table entries made from the elementwise functors of
// tensor/element_ops.h, and the ops with a scalar operand.
//
// unary_op<F, rule>() and binary_op<F, rule>() are constant OpDefs: the meta applies F's domain
// and Note [Type promotion] (and broadcasting for binary ops), compute runs F's kernel on the
// inputs' device, the strategies keep shards (a broadcast dim is not sharded) and pass Partial
// placements as `rule` says (ops/strategy.h), and the SPMD types keep a pending sum where the rule
// passes P(sum) (partial_use_of). ops/ops.h declares one line per op with them.
#pragma once

#include <array>
#include <span>
#include <string_view>

#include <spmd/ops/autograd.h>
#include <spmd/ops/op.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/element_ops.h>

namespace spmd {
namespace pointwise {

// t converted to `dtype` and broadcast to `shape`; t itself (no new handle) when it already is.
Tensor as_operand(const Tensor& t, DType dtype, const Shape& shape);

OpMeta unary_meta(std::string_view name, element::Domain domain, const InputMeta& in);
Tensor unary_compute(std::string_view name, int index, const Tensor& in, const OpMeta& out);
// A comparison (`predicate`) gives Bool; its inputs compute in their promoted dtype.
OpMeta binary_meta(std::string_view name, element::Domain domain, bool predicate,
                   const InputMeta& a, const InputMeta& b);
Tensor binary_compute(std::string_view name, int index, bool predicate, const Tensor& a,
                      const Tensor& b, const OpMeta& out);

template <class F>
OpMeta unary_meta_of(std::span<const InputMeta> in, const OpArgs&) {
  return unary_meta(F::name, F::domain, in[0]);
}
template <class F>
Tensor unary_compute_of(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return unary_compute(F::name, element::index_of<F, element::UnaryOps>, in[0], out);
}
template <PartialRule rule>
std::vector<OpStrategy> unary_strategies_of(ShardingInputs in, const OpArgs&, const OpMeta&) {
  return unary_pointwise_strategies(in, rule);
}

template <class F>
OpMeta binary_meta_of(std::span<const InputMeta> in, const OpArgs&) {
  return binary_meta(F::name, F::domain, element::is_predicate<F>, in[0], in[1]);
}
template <class F>
Tensor binary_compute_of(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return binary_compute(F::name, element::index_of<F, element::BinaryOps>, element::is_predicate<F>,
                        in[0], in[1], out);
}
template <PartialRule rule>
std::vector<OpStrategy> binary_strategies_of(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  return binary_pointwise_strategies(in, out, rule);
}

// ---- derivatives --------------------------------------------------------------------------------
// The backward of an elementwise op is itself an elementwise op (so it runs on every kind of value
// and device): grad * F::df(x, y) for a unary op, F::da / F::db (grad, a, b) for a binary one,
// computed by the DeviceOps' derivative kernels. It is linear in the gradient.

// F::name followed by Suffix::value, as a constant.
template <class F, class Suffix>
struct JoinedName {
  static constexpr std::array<char, F::name.size() + Suffix::value.size()> chars = [] {
    std::array<char, F::name.size() + Suffix::value.size()> out{};
    size_t i = 0;
    for (char c : F::name) out[i++] = c;
    for (char c : Suffix::value) out[i++] = c;
    return out;
  }();
  static constexpr std::string_view value{chars.data(), chars.size()};
};
struct BackwardSuffix {
  static constexpr std::string_view value = "_backward";
};
struct BackwardASuffix {
  static constexpr std::string_view value = "_backward_a";
};
struct BackwardBSuffix {
  static constexpr std::string_view value = "_backward_b";
};

// The dtype a tensor of dtype `out` computes in with a scalar operand (x * c) or a scale per
// element (dropout's mask): BF16/F16 keep the scalar's F32 precision, computing in F32 and
// rounding the result once.
inline DType scalar_compute_dtype(DType out) {
  return out == DType::BF16 || out == DType::F16 ? DType::F32 : out;
}

// Inputs (grad, ...) broadcast to grad's shape; the output has grad's shape and dtype.
OpMeta derivative_meta(std::span<const InputMeta> in, const OpArgs&);
std::vector<OpStrategy> derivative_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out);
Tensor unary_derivative(std::string_view name, int index, std::span<const Tensor> in,
                        const OpMeta& out);
Tensor binary_derivative(std::string_view name, int index, int wrt, std::span<const Tensor> in,
                         const OpMeta& out);

template <class F>
Tensor unary_derivative_of(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return unary_derivative(JoinedName<F, BackwardSuffix>::value,
                          element::index_of<F, element::UnaryOps>, in, out);
}
template <class F, int wrt>
Tensor binary_derivative_of(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  using Name = JoinedName<F, std::conditional_t<wrt == 0, BackwardASuffix, BackwardBSuffix>>;
  return binary_derivative(Name::value, element::index_of<F, element::BinaryOps>, wrt, in, out);
}

// "exp_backward": (grad, x, y) -> grad * exp'(x).
template <class F>
inline constexpr OpDef kUnaryDerivative{
    .name = JoinedName<F, BackwardSuffix>::value,
    .meta = &derivative_meta,
    .compute = &unary_derivative_of<F>,
    .strategies = &derivative_strategies,
};
// "mul_backward_a" / "mul_backward_b": (grad, a, b) -> the gradient of a / b before it is summed
// down to a's / b's shape.
template <class F, int wrt>
inline constexpr OpDef kBinaryDerivative{
    .name = JoinedName<F, std::conditional_t<wrt == 0, BackwardASuffix, BackwardBSuffix>>::value,
    .meta = &derivative_meta,
    .compute = &binary_derivative_of<F, wrt>,
    .strategies = &derivative_strategies,
};

template <class F>
void unary_backward_of(BackwardContext& c) {
  if (c.needs_grad(0))
    c.set_grad(0, apply(kUnaryDerivative<F>, {c.grad(), c.input(0), c.output()}));
}
// The gradient of operand `wrt` before it is summed down to the operand's shape.
template <class F, int wrt>
Var binary_operand_grad(const BackwardContext& c) {
  constexpr element::GradPass pass = element::grad_pass<F, wrt>;
  if constexpr (pass == element::GradPass::Identity) {
    return c.grad();
  } else if constexpr (pass == element::GradPass::Negate) {
    return -c.grad();
  } else {
    return apply(kBinaryDerivative<F, wrt>, {c.grad(), c.input(0), c.input(1)});
  }
}

template <class F>
void binary_backward_of(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, sum_to(binary_operand_grad<F, 0>(c), var_shape(c.input(0))));
  if (c.needs_grad(1)) c.set_grad(1, sum_to(binary_operand_grad<F, 1>(c), var_shape(c.input(1))));
}

// How an elementwise op whose Partial placements pass as `rule` says treats a pending sum under
// SPMD types: it is linear there exactly when P(sum) passes through it.
constexpr PartialUse partial_use_of(PartialRule rule) {
  switch (rule) {
    case PartialRule::Negation:
      return PartialUse::Unary;
    case PartialRule::Additive:
    case PartialRule::Subtractive:
      return PartialUse::All;
    case PartialRule::Multiplicative:
      return PartialUse::One;
    case PartialRule::Divisive:
      return PartialUse::Numerator;
    case PartialRule::None:
    case PartialRule::NonDecreasing:
    case PartialRule::Max:
    case PartialRule::Min:
      return PartialUse::None;
  }
  return PartialUse::None;
}

}  // namespace pointwise

// The values F's derivative reads (Note [Saved values]): its df_reads, or input and output.
template <class F>
constexpr uint32_t unary_saves() {
  if constexpr (requires { F::df_reads; }) {
    uint32_t mask = kSavesNone;
    if ((static_cast<int>(F::df_reads) & static_cast<int>(element::DfReads::X)) != 0) mask |= 1u;
    if ((static_cast<int>(F::df_reads) & static_cast<int>(element::DfReads::Y)) != 0) {
      mask |= kSaveOutput;
    }
    return mask;
  } else {
    return kSavesAll;
  }
}

// The entry of the unary elementwise op whose math is functor F (in element::UnaryOps).
template <class F, PartialRule rule>
constexpr OpDef unary_op() {
  return OpDef{
      .name = F::name,
      .meta = &pointwise::unary_meta_of<F>,
      .compute = &pointwise::unary_compute_of<F>,
      .strategies = &pointwise::unary_strategies_of<rule>,
      .backward = &pointwise::unary_backward_of<F>,
      .partial_use = pointwise::partial_use_of(rule),
      .saves = unary_saves<F>(),
  };
}

// The entry of the binary elementwise op (with broadcasting) whose math is functor F (in
// element::BinaryOps). Comparisons (Bool results) have no backward. It follows its first input's
// placements where it can (Note [Following the first input], dtensor/dispatch.cpp).
template <class F, PartialRule rule>
constexpr OpDef binary_op() {
  BackwardFn backward = nullptr;
  if constexpr (!element::is_predicate<F>) backward = &pointwise::binary_backward_of<F>;
  return OpDef{
      .name = F::name,
      .meta = &pointwise::binary_meta_of<F>,
      .compute = &pointwise::binary_compute_of<F>,
      .strategies = &pointwise::binary_strategies_of<rule>,
      .backward = backward,
      .follow_first_input = true,
      .partial_use = pointwise::partial_use_of(rule),
      // a + b and a - b need no values for their gradients.
      .saves = rule == PartialRule::Additive || rule == PartialRule::Subtractive ? kSavesNone
                                                                                 : kSavesInputs,
  };
}

}  // namespace spmd
