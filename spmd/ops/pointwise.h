// spmd/ops/pointwise.h: op-table entries made from the elementwise functors of
// tensor/element_ops.h, and the ops with a scalar operand.
//
// unary_op<F, rule>() and binary_op<F, rule>() are constant OpDefs: the meta applies F's domain
// and Note [Type promotion] (and broadcasting for binary ops), compute runs F's kernel on the
// inputs' device, the strategies keep shards (a broadcast dim is not sharded) and pass Partial
// placements as `rule` says (ops/strategy.h). ops/ops.h declares one line per op with them.
#pragma once

#include <span>

#include <spmd/ops/op.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/element_ops.h>

namespace spmd {
namespace pointwise {

OpMeta unary_meta(std::string_view name, element::Domain domain, const InputMeta& in);
Tensor unary_compute(std::string_view name, int index, const Tensor& in, const OpMeta& out);
OpMeta binary_meta(std::string_view name, element::Domain domain, const InputMeta& a,
                   const InputMeta& b);
Tensor binary_compute(std::string_view name, int index, const Tensor& a, const Tensor& b,
                      const OpMeta& out);

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
  return binary_meta(F::name, F::domain, in[0], in[1]);
}
template <class F>
Tensor binary_compute_of(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  return binary_compute(F::name, element::index_of<F, element::BinaryOps>, in[0], in[1], out);
}
template <PartialRule rule>
std::vector<OpStrategy> binary_strategies_of(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  return binary_pointwise_strategies(in, out, rule);
}

}  // namespace pointwise

// The entry of the unary elementwise op whose math is functor F (in element::UnaryOps).
template <class F, PartialRule rule>
constexpr OpDef unary_op() {
  return OpDef{F::name, &pointwise::unary_meta_of<F>, &pointwise::unary_compute_of<F>,
               &pointwise::unary_strategies_of<rule>};
}

// The entry of the binary elementwise op (with broadcasting) whose math is functor F (in
// element::BinaryOps).
template <class F, PartialRule rule>
constexpr OpDef binary_op() {
  return OpDef{F::name, &pointwise::binary_meta_of<F>, &pointwise::binary_compute_of<F>,
               &pointwise::binary_strategies_of<rule>};
}

}  // namespace spmd
