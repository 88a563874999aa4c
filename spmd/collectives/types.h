// spmd/collectives/types.h: collective kinds and the options aggregates of each
// collective.
//
// Options are small values with == and hashing (STYLE.md, c10d): backends take them, the trace
// records them, and the threads backend compares them across ranks. Roots (src/dst) are ranks
// *within the group* (0 .. group_size-1), never global ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/format.h>
#include <spmd/sim/per_rank.h>
#include <spmd/tensor/reduce_op.h>

namespace spmd {

enum class CollectiveKind {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllToAllSingle,
  Broadcast,
  Scatter,
  Gather,
  Reduce,
  Permute,
  Barrier,
};
inline constexpr int kNumCollectiveKinds = 11;

// "all_reduce", "all_gather", ... (the names of the functional API).
std::string_view collective_name(CollectiveKind kind);
std::optional<CollectiveKind> parse_collective(std::string_view name);

struct AllReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const AllReduceOptions&) const = default;
};

// Every rank's shard is concatenated along gather_dim, in group order.
struct AllGatherOptions {
  int64_t gather_dim = 0;
  bool operator==(const AllGatherOptions&) const = default;
};

// The reduction is split into group_size equal pieces along scatter_dim (divisible sizes
// only); group rank i keeps piece i.
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  int64_t scatter_dim = 0;
  bool operator==(const ReduceScatterOptions&) const = default;
};

// Group rank i splits its shard into group_size equal pieces along split_dim and sends piece j
// to group rank j; rank j concatenates the pieces it receives along concat_dim in source order.
struct AllToAllOptions {
  int64_t split_dim = 0;
  int64_t concat_dim = 0;
  bool operator==(const AllToAllOptions&) const = default;
};

// Variable all-to-all along dim 0: on rank r, in_splits[j] rows go to group rank j and
// out_splits[i] rows arrive from group rank i. Empty split lists mean an even split.
struct AllToAllSingleOptions {
  PerRank<std::vector<int64_t>> out_splits;
  PerRank<std::vector<int64_t>> in_splits;
  bool operator==(const AllToAllSingleOptions& other) const;
};

// Group rank `src`'s shard is copied to every member.
struct BroadcastOptions {
  int src = 0;
  bool operator==(const BroadcastOptions&) const = default;
};

// Group rank `src`'s shard is split into group_size equal pieces along scatter_dim; rank i gets
// piece i. Every member passes a tensor of src's shape and dtype (only src's values are read), so
// every rank knows the result shape without communication.
struct ScatterOptions {
  int src = 0;
  int64_t scatter_dim = 0;
  bool operator==(const ScatterOptions&) const = default;
};

// Group rank `dst` receives every member's shard concatenated along gather_dim; the other
// members get an empty tensor: the input's shape with gather_dim of size 0.
struct GatherOptions {
  int dst = 0;
  int64_t gather_dim = 0;
  bool operator==(const GatherOptions&) const = default;
};

// Group rank `dst` receives the reduction; the other members get an empty tensor: the input's
// shape with dim 0 of size 0 (so a 0-d input is a CommError: reshape it to [1]).
struct ReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  int dst = 0;
  bool operator==(const ReduceOptions&) const = default;
};

// Group rank i sends its shard to group rank dst_of[i] (-1: sends nothing). Destinations are
// distinct; a rank that receives nothing gets zeros of its own shape (jax.lax.ppermute).
struct PermuteOptions {
  std::vector<int> dst_of;
  bool operator==(const PermuteOptions&) const = default;
};

struct BarrierOptions {
  bool operator==(const BarrierOptions&) const = default;
};

std::size_t hash_value(const AllReduceOptions& o);
std::size_t hash_value(const AllGatherOptions& o);
std::size_t hash_value(const ReduceScatterOptions& o);
std::size_t hash_value(const AllToAllOptions& o);
std::size_t hash_value(const AllToAllSingleOptions& o);
std::size_t hash_value(const BroadcastOptions& o);
std::size_t hash_value(const ScatterOptions& o);
std::size_t hash_value(const GatherOptions& o);
std::size_t hash_value(const ReduceOptions& o);
std::size_t hash_value(const PermuteOptions& o);
std::size_t hash_value(const BarrierOptions& o);

// Short text of an options value for traces and error reports: "op=sum", "src=1",
// "split_dim=0 concat_dim=1", ...
std::string describe(const AllReduceOptions& o);
std::string describe(const AllGatherOptions& o);
std::string describe(const ReduceScatterOptions& o);
std::string describe(const AllToAllOptions& o);
std::string describe(const AllToAllSingleOptions& o);
std::string describe(const BroadcastOptions& o);
std::string describe(const ScatterOptions& o);
std::string describe(const GatherOptions& o);
std::string describe(const ReduceOptions& o);
std::string describe(const PermuteOptions& o);
std::string describe(const BarrierOptions& o);

}  // namespace spmd

#define SPMD_OPTIONS_STD_HASH_(T)                                                  \
  template <>                                                                      \
  struct std::hash<spmd::T> {                                                      \
    std::size_t operator()(const spmd::T& o) const { return spmd::hash_value(o); } \
  };
SPMD_OPTIONS_STD_HASH_(AllReduceOptions)
SPMD_OPTIONS_STD_HASH_(AllGatherOptions)
SPMD_OPTIONS_STD_HASH_(ReduceScatterOptions)
SPMD_OPTIONS_STD_HASH_(AllToAllOptions)
SPMD_OPTIONS_STD_HASH_(AllToAllSingleOptions)
SPMD_OPTIONS_STD_HASH_(BroadcastOptions)
SPMD_OPTIONS_STD_HASH_(ScatterOptions)
SPMD_OPTIONS_STD_HASH_(GatherOptions)
SPMD_OPTIONS_STD_HASH_(ReduceOptions)
SPMD_OPTIONS_STD_HASH_(PermuteOptions)
SPMD_OPTIONS_STD_HASH_(BarrierOptions)
#undef SPMD_OPTIONS_STD_HASH_

SPMD_FORMAT_AS_TEXT(spmd::CollectiveKind, spmd::collective_name(value))
