// spmd/dtensor/dispatch.h: the one path every DTensor op takes: sharding propagation (which
// placements the inputs need and which the output gets, the cheapest by the cost model), its
// cache, the redistributions, the computation on the pieces, and the observers of dtensor/hooks.h.
//
// An op is an entry of the op table (ops/op.h): its meta, strategies and math. dispatch(op, inputs,
// args):
//   1. looks up (op, input specs, static args) in the sharding cache (Note [Sharding cache]);
//   2. on a miss runs op.meta on the inputs' global shapes, asks op.strategies for candidates,
//      costs each one as the sum of the redistribute plans its inputs need
//      (dtensor/redistribute.h), keeps the cheapest (ties: fewer steps, then the order given), and
//      caches the decision with those plans;
//   3. redistributes the inputs that need it, runs the op on every held rank's pieces
//      (compute_piece), wraps the output;
//   4. tells the observers (op name, inputs, output, args, and the op's reference to recompute it
//      on full tensors) when any are registered.
//
// Note [Sharding cache]
// The cache is the C++ form of PyTorch's lru_cache over OpSchema (seed 003): the key is the op,
// each input's DTensorSpec (mesh, placements, global shape, dtype; hashes computed once per
// spec) and the static arguments (dims, keepdim, scalars, shapes). A warm lookup hashes a few
// precomputed values and compares specs (pointer equality first), so a cached op costs a map
// lookup plus the shard-by-shard math. The cache is process-wide and thread-safe; hits and
// misses are counted (sharding_cache_stats()). Like PyTorch's lru_cache(None) it has no size
// bound, and its entries keep their specs (so their meshes and worlds) alive; each new world
// drops them (Note [Caches and worlds] in world/world.h), and so does clear_sharding_cache() (and
// clear_redistribute_cache() for plans), which also resets the counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/ops/op.h>

namespace spmd {

using SpecList = std::span<const DTensorSpec* const>;

// The decision sharding propagation made for one cache key.
struct OutputSharding {
  SpecPtr output;
  std::vector<SpecPtr> input_specs;  // what each input is redistributed to (null if unchanged)
  std::vector<std::shared_ptr<const RedistributePlan>> plans;  // null where nothing moves
  double cost_us = 0.0;
};

// An operand of a DTensor op: a DTensor, or a plain Tensor, which is a PlacementError unless
// ImplicitReplication is active (then it is Replicate on the other operands' mesh).
class DOperand {
 public:
  DOperand(const DTensor& t) : dtensor_(&t) {}  // NOLINT: implicit by design
  DOperand(const Tensor& t) : tensor_(&t) {}    // NOLINT: implicit by design
  const DTensor* dtensor() const { return dtensor_; }
  const Tensor* tensor() const { return tensor_; }

 private:
  const DTensor* dtensor_ = nullptr;
  const Tensor* tensor_ = nullptr;
};

// Runs `op` on `inputs` (operands on one mesh, at least one a DTensor; PlacementError naming the
// op, the meshes, placements and shapes otherwise). `loc` is the user's call site (Note [User call
// sites]): the op's redistributions, observers and tape node report it.
DTensor dispatch(const OpDef& op, std::initializer_list<DOperand> inputs, const OpArgs& args = {},
                 SourceLocation loc = SourceLocation::current());
DTensor dispatch(const OpDef& op, std::span<const DTensor* const> inputs, const OpArgs& args = {},
                 SourceLocation loc = SourceLocation::current());
// Any number of DTensor inputs (cat, stack).
DTensor dispatch(const OpDef& op, std::span<const DTensor> inputs, const OpArgs& args = {},
                 SourceLocation loc = SourceLocation::current());

// The (cached) decision for these input specs.
std::shared_ptr<const OutputSharding> propagate_sharding(const OpDef& op, SpecList inputs,
                                                         const OpArgs& args);

CacheStats sharding_cache_stats();
void clear_sharding_cache();

// ---- mixing DTensors with plain Tensors -----------------------------------------------------

// Whether a plain Tensor operand of a DTensor op is taken as Replicate (else PlacementError).
// Off by default, as PyTorch's _allow_implicit_replication; per thread.
bool implicit_replication_enabled();
// Enables implicit replication for its lifetime on this thread.
class ImplicitReplication {
 public:
  ImplicitReplication();
  ~ImplicitReplication();
  ImplicitReplication(const ImplicitReplication&) = delete;
  ImplicitReplication& operator=(const ImplicitReplication&) = delete;
};

}  // namespace spmd
