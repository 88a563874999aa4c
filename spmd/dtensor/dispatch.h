// spmd/dtensor/dispatch.h: the one path every DTensor op takes: sharding propagation (which
// placements the inputs need and which the output gets, the cheapest by the cost model), its
// cache, the redistributions, the local computation, and the observers of dtensor/hooks.h.
//
// An op is an OpDef: four plain functions (output meta, candidate strategies, the computation
// on the pieces, the same op on full tensors). dispatch(op, inputs, args):
//   1. looks up (op, input specs, static args) in the sharding cache (Note [Sharding cache]);
//   2. on a miss asks op.strategies for candidates, costs each one as the sum of the
//      redistribute plans its inputs need (dtensor/redistribute.h), keeps the cheapest (ties:
//      fewer steps, then the order given), and caches the decision with those plans;
//   3. redistributes the inputs that need it, runs op.local on the pieces, wraps the output;
//   4. tells the observers (op name, inputs, output, args, and op.reference to recompute it on
//      full tensors) when any are registered.
//
// Note [Sharding cache]
// The cache is the C++ form of PyTorch's lru_cache over OpSchema (seed 003): the key is the op,
// each input's DTensorSpec (mesh, placements, global shape, dtype; hashes computed once per
// spec) and the static arguments (dims, keepdim, scalars, shapes). A warm lookup hashes a few
// precomputed values and compares specs (pointer equality first), so a cached op costs a map
// lookup plus the shard-by-shard math. The cache is process-wide and thread-safe; hits and
// misses are counted (sharding_cache_stats()). Like PyTorch's lru_cache(None) it is unbounded,
// and its entries keep their specs (so their meshes and worlds) alive: clear_sharding_cache()
// (and clear_redistribute_cache() for plans) drops them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/redistribute.h>

namespace spmd {

// The non-tensor arguments of an op that decide its sharding (dims, flags, scalars, shapes).
struct OpArgs {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  bool operator==(const OpArgs&) const = default;
  std::size_t hash() const;
  // "ints=[0, 1] reals=[2]" (empty parts left out).
  std::string to_string() const;
};

// One way to run an op: the placements each input must have and the output's placements.
struct OpStrategy {
  std::vector<Placements> inputs;
  Placements output;
};

// Global shape and dtype of an op's output.
struct OpMeta {
  Shape shape;
  DType dtype = DType::F32;
};

using SpecList = std::span<const DTensorSpec* const>;

// The pieces an op computes on, by input position (a view: no LocalTensor is copied).
class LocalInputs {
 public:
  LocalInputs(const LocalTensor* const* items, std::size_t n) : items_(items), size_(n) {}
  const LocalTensor& operator[](std::size_t i) const { return *items_[i]; }
  std::size_t size() const { return size_; }

 private:
  const LocalTensor* const* items_;
  std::size_t size_;
};

struct OpDef {
  std::string_view name;
  // The output's global shape and dtype; throws (ShapeError, Unsupported) for bad inputs with a
  // message naming the op and the shapes.
  OpMeta (*meta)(SpecList inputs, const OpArgs& args);
  // Candidate strategies for these input specs; each must be correct for the op. At least one.
  std::vector<OpStrategy> (*strategies)(SpecList inputs, const OpArgs& args, const OpMeta& out);
  // The computation on the pieces, given inputs already laid out as the chosen strategy says.
  LocalTensor (*local)(LocalInputs inputs, const OpArgs& args, const DTensorSpec& out);
  // The same op on full tensors.
  Tensor (*reference)(std::span<const Tensor> inputs, const OpArgs& args);
};

// The decision sharding propagation made for one cache key.
struct OutputSharding {
  SpecPtr output;
  std::vector<SpecPtr> input_specs;  // what each input is redistributed to (null if unchanged)
  std::vector<std::shared_ptr<const RedistributePlan>> plans;  // null where nothing moves
  double cost_us = 0.0;
};

// Runs `op` on `inputs` (1 to 4 DTensors on one mesh; PlacementError naming the op, the meshes,
// placements and shapes otherwise).
DTensor dispatch(const OpDef& op, std::span<const DTensor* const> inputs, const OpArgs& args = {});
DTensor dispatch(const OpDef& op, std::initializer_list<const DTensor*> inputs,
                 const OpArgs& args = {});

// The (cached) decision for these input specs.
std::shared_ptr<const OutputSharding> propagate_sharding(const OpDef& op, SpecList inputs,
                                                         const OpArgs& args);

CacheStats sharding_cache_stats();
void clear_sharding_cache();

// ---- helpers for writing strategies ---------------------------------------------------------

// One mesh dim's option: each input's placement on that dim and the output's.
struct DimOption {
  std::vector<Placement> inputs;
  Placement output;
};
// Strategies from per-mesh-dim options (the same list for every mesh dim): on each mesh dim the
// options where some input already has its required placement, plus the all-Replicate option
// (which `options` must contain), combined over the mesh dims.
std::vector<OpStrategy> expand_dim_options(SpecList inputs, const std::vector<DimOption>& options);

// The dtype `reference` gives on inputs of these dtypes and dim counts (run on tensors of
// size-1 dims, or 0 where the global dim is empty, so it also rejects bad dims as the op does).
DType probe_dtype(const OpDef& op, SpecList inputs, const OpArgs& args);

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
