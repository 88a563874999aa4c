// spmd/dtensor/redistribute.h: turning one placement of a DTensor into another: the plan (a
// printable list of per-mesh-dim steps with their collective, bytes and estimated time), two
// planners that make it, the plan cache, and the executor that runs a plan with the functional
// collectives.
//
//   DTensorSpec from(mesh, {Shard{0}, Replicate{}}, {8, 8}, DType::F32);
//   DTensorSpec to = from.with_placements({Replicate{}, Shard{0}});
//   fmt::print("{}\n", plan_redistribute(from, to));
//   // RedistributePlan S(0),R -> R,S(0) [8, 8] f32 on DeviceMesh((2, 4), ...): greedy, ...
//   //   mesh dim 0: S(0) -> R     all_gather   256 B   7.2 us
//   //   mesh dim 1: R -> S(0)     local chunk    0 B   0.0 us
//
// Note [Redistribute steps]
// A step changes the placement of one mesh dim i. With k ranks along i and L the size of the
// affected tensor dim after the mesh dims before i have sharded it (this rank's logical size,
// which differs between ranks under uneven sharding):
//   S(d) -> R      pad d to ceil(L/k) -> all_gather(d) -> keep the first L rows
//   R -> S(d)      local narrow to this rank's chunk (no communication)
//   S(a) -> S(b)   pad a to ceil(La/k) and b to k*ceil(Lb/k) -> all_to_all(split b, concat a)
//                  -> keep the first La rows of a and this rank's chunk size of b
//   P -> R         all_reduce(op)
//   P -> S(d)      pad d to k*ceil(L/k) -> reduce_scatter(op, d) -> keep this rank's chunk size
//   R -> P(op)     local partition: sum divides by k (integer dtypes: group rank 0 keeps the
//                  value, the others hold 0); product: group rank 0 keeps it, the others hold 1;
//                  avg, min and max keep the value
//   S(d) -> P(sum) local zero-fill (no communication): this rank's chunk at its offset in a
//                  piece of L along d whose other elements are the additive identity (-0.0 for
//                  floating dtypes, so that x + -0.0 is x bit for bit, -0.0 included; 0 for the
//                  others). Every element has one non-identity term, so the sum is exact.
// S -> P(avg, product, min, max) and P(a) -> P(b) go through R. (Zero-filling towards avg would
// need k times the chunk, which rounds or overflows; PyTorch has no direct S -> P step at all and
// prices it as impossible.) A step on mesh dim i is only valid when no mesh dim after i shards a
// tensor dim the step touches (nested sharding splits outer mesh dims first, Note [Uneven
// sharding]); a step reducing a Partial on mesh dim i only when every Partial after i reduces
// compatibly (Partials reduce innermost first; an op commutes with itself and sum with avg,
// except that an integer avg truncates and commutes with nothing); and a partition only when the
// Partials after i keep it exact (dividing by k breaks an inner product, ones break an inner
// sum). A zero-fill keeps any inner Partial exact: the ranks of an inner group share the
// coordinate along i, so they hold identities at the same elements. Steps on mesh dims of size 1
// change nothing and are left out.
//
// Note [Greedy and min-cost planners]
// The greedy planner is PyTorch's: walk mesh dims inner -> outer, sending a dim to Replicate
// first when its target is Shard(d) but the outer mesh dims sharding d differ between source and
// target (misaligned nesting, e.g. (S(0), S(0)) -> (R, S(0))); then walk outer -> inner to reach
// the targets, partitioning (R -> P) only on this second walk. (If that order would reduce
// Partials of incompatible ops out of order, or partition over incompatible Partials, all
// Partials are first reduced innermost first.) The min-cost planner runs Dijkstra over placement
// states (R, S(d) for every tensor dim, the Partial ops of source and target, on each mesh dim),
// with the valid steps above as edges scored by the cost model (collectives/cost_model.h, the link
// of each mesh dim from the world's topology), so it finds cheaper routes the greedy order
// misses, such as (S(0), R) -> (R, S(0)) by two all_to_alls instead of a full all_gather.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/dtensor/spec.h>
#include <spmd/ops/placement.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

enum class RedistributePlanner { Greedy, MinCost };

// "greedy", "min_cost".
std::string_view planner_name(RedistributePlanner planner);

// The planner plan_redistribute, DTensor::redistribute and sharding propagation use when none is
// named. Greedy unless set (or SPMD_REDISTRIBUTE_PLANNER=min_cost in the environment).
RedistributePlanner default_redistribute_planner();
void set_default_redistribute_planner(RedistributePlanner planner);

enum class StepKind {
  AllGather,
  AllReduce,
  ReduceScatter,
  AllToAll,
  LocalChunk,
  LocalPartition,
  LocalZeroFill,
};

// "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "local chunk", "local partition",
// "local zero-fill".
std::string_view step_kind_name(StepKind kind);

struct RedistributeStep {
  int mesh_dim = 0;
  Placement from;
  Placement to;
  StepKind kind = StepKind::LocalChunk;
  // S of Note [Cost model] (the padded per-rank bytes; gathered bytes for all_gather); 0 for
  // local steps.
  int64_t bytes = 0;
  double cost_us = 0.0;
  bool operator==(const RedistributeStep&) const = default;
};

struct RedistributePlan {
  RedistributePlanner planner = RedistributePlanner::Greedy;
  Placements from;
  Placements to;
  std::vector<RedistributeStep> steps;
  double cost_us = 0.0;  // sum of the steps' estimates
  SpecPtr source;        // the spec planned from (its mesh, shape and dtype)
  // One header line (placements, shape, dtype, mesh, planner, total) and one line per step:
  // mesh dim (and name), from -> to, collective, bytes, estimated microseconds.
  std::string to_string() const;
};

// The steps from `from` to `to` (same mesh, shape and dtype, else PlacementError naming both).
// Cached by (from, to, planner, topology): see redistribute_cache_stats(). Each new world drops
// the cached plans (Note [Caches and worlds] in world/world.h).
RedistributePlan plan_redistribute(const DTensorSpec& from, const DTensorSpec& to);
RedistributePlan plan_redistribute(const DTensorSpec& from, const DTensorSpec& to,
                                   RedistributePlanner planner);
// The cached plan itself (no copy).
std::shared_ptr<const RedistributePlan> cached_redistribute_plan(const DTensorSpec& from,
                                                                 const DTensorSpec& to,
                                                                 RedistributePlanner planner);
// Estimated microseconds of the default planner's plan.
double redistribute_cost(const DTensorSpec& from, const DTensorSpec& to);

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t size = 0;  // entries held
};
CacheStats redistribute_cache_stats();
void clear_redistribute_cache();

// Note [Ranks outside the mesh] (dtensor/dtensor.h): a process outside the plan's mesh runs none
// of its steps, but creates the communicators of its collective steps, since creating one takes
// every process under mpi and nccl (the mesh's ranks create them when they run the plan).
void create_plan_communicators(const RedistributePlan& plan);

// Runs `plan` on `local`, which holds the pieces of a DTensor of spec `from` (every rank of the
// mesh the world holds). The same code runs under every backend: pads and offsets are computed
// per held rank from its coordinate.
LocalTensor execute_redistribute(const LocalTensor& local, const DTensorSpec& from,
                                 const RedistributePlan& plan);

// The piece a rank at `coordinate` holds of a DTensor of `spec` whose global value is `global`
// (the R -> P partition of Note [Redistribute steps] applied on Partial mesh dims). `global`
// must be the block of the tensor at spec.local_offset(coordinate) of spec.local_shape(...)
// already narrowed: this applies only the partition.
Tensor partition_local(const Tensor& block, const DTensorSpec& spec,
                       const std::vector<int64_t>& coordinate);

std::ostream& operator<<(std::ostream& os, const RedistributePlan& plan);

}  // namespace spmd

template <>
struct fmt::formatter<spmd::RedistributePlan> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const spmd::RedistributePlan& plan, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", plan.to_string());
  }
};
