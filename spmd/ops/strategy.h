// spmd/ops/strategy.h: helpers for writing an op's sharding strategies (OpDef::strategies).
//
// A strategy says, for every mesh dim, which placement each input must have and which placement
// the output then has. Most ops decide mesh dim by mesh dim from a short list of options (shard
// both inputs' dim d -> shard the output's dim d; a Partial that passes through; all Replicate),
// which expand_dim_options turns into strategies; one-input ops derive the output placement from
// the input's (derived_strategies). The dispatcher (dtensor/dispatch.h) prices every candidate by
// the redistributions its inputs need and runs the cheapest.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <spmd/ops/op.h>

namespace spmd {

// One mesh dim's option: each input's placement on that dim and the output's.
struct DimOption {
  std::vector<Placement> inputs;
  Placement output;
};

// Strategies from per-mesh-dim options (the same list for every mesh dim): on each mesh dim the
// options where some input already has its required placement, plus the all-Replicate option
// (which `options` must contain), combined over the mesh dims (at most 4096 strategies).
std::vector<OpStrategy> expand_dim_options(ShardingInputs inputs,
                                           const std::vector<DimOption>& options);

// Every input and the output Replicate on every mesh dim: always correct.
OpStrategy replicate_strategy(ShardingInputs inputs);

// For a one-input op: `map` gives the output placement for an input placement, or nullopt when
// that mesh dim must be Replicate first. Returns that strategy and the all-Replicate one.
std::vector<OpStrategy> derived_strategies(
    ShardingInputs inputs, const std::function<std::optional<Placement>(const Placement&)>& map);

// The dim of input shape `in` that lines up (broadcasting, right-aligned) with dim o of the
// result shape `out`, or -1 when the input lacks it or broadcasts it from size 1.
int aligned_dim(const Shape& in, const Shape& out, int o);

inline bool is_min_max(ReduceOp op) {
  return op == ReduceOp::Max || op == ReduceOp::Min;
}
// Sum and Avg: the reductions a linear map commutes with.
inline bool is_linear(ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Avg;
}
inline Partial swap_min_max(ReduceOp op) {
  return Partial{op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max};
}

// How an elementwise op treats Partial inputs: which Partial placements pass through it.
enum class PartialRule {
  None,            // every Partial is reduced first
  Negation,        // unary: keeps P(sum) and P(avg), swaps P(max) and P(min)    (neg)
  NonDecreasing,   // unary: keeps P(max) and P(min)                              (exp, tanh, relu)
  Additive,        // binary: P(s)+P(s), P(a)+P(a); P(a|max|min)+R and R+P(a|max|min)  (add)
  Subtractive,     // binary: as Additive, but R-P(max) is P(min) and R-P(min) is P(max)  (sub)
  Multiplicative,  // binary: P(sum|avg)*R and R*P(sum|avg)                       (mul)
  Divisive,        // binary: P(sum|avg)/R                                        (div)
  Max,             // binary: P(max) with P(max) or R                             (maximum)
  Min,             // binary: P(min) with P(min) or R                             (minimum)
};

// The strategies of an elementwise op: unary (one input) or binary with broadcasting (a
// broadcast dim is not sharded), Partial placements as `rule` says.
std::vector<OpStrategy> unary_pointwise_strategies(ShardingInputs inputs, PartialRule rule);
std::vector<OpStrategy> binary_pointwise_strategies(ShardingInputs inputs, const OpMeta& out,
                                                    PartialRule rule);
// The per-mesh-dim options of an elementwise op of any number of inputs broadcast to out's shape:
// all Replicate, and for each output dim the inputs that have it sharded along it (a broadcast
// input Replicate). Partial options are the caller's to add before expand_dim_options.
std::vector<DimOption> pointwise_shard_options(ShardingInputs inputs, const OpMeta& out);
// An elementwise op of any number of inputs (broadcast to out's shape) that is linear in its
// first input, as derivatives are (grad * f'(x)): shards pass as for binary ops, and a P(sum) or
// P(avg) first input passes when every other input is Replicate.
std::vector<OpStrategy> linear_pointwise_strategies(ShardingInputs inputs, const OpMeta& out);

}  // namespace spmd
