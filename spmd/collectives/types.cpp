// spmd/collectives/types.cpp: names, hashing and descriptions of collectives and their
// options.
#include <spmd/collectives/types.h>

#include <array>

#include <spmd/core/hash.h>

namespace spmd {
namespace {

constexpr std::array<std::string_view, kNumCollectiveKinds> kCollectiveNames = {
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_single",
    "broadcast",  "scatter",    "gather",         "reduce",     "permute",
    "barrier"};

std::string splits_str(const PerRank<std::vector<int64_t>>& splits) {
  if (splits.empty()) return "even";
  return splits.to_string();
}

}  // namespace

std::string_view collective_name(CollectiveKind kind) {
  return kCollectiveNames[static_cast<size_t>(kind)];
}

std::optional<CollectiveKind> parse_collective(std::string_view name) {
  for (size_t i = 0; i < kCollectiveNames.size(); ++i) {
    if (kCollectiveNames[i] == name) return static_cast<CollectiveKind>(i);
  }
  return std::nullopt;
}

bool AllToAllSingleOptions::operator==(const AllToAllSingleOptions& other) const {
  auto same = [](const PerRank<std::vector<int64_t>>& a, const PerRank<std::vector<int64_t>>& b) {
    if (a.empty() || b.empty()) return a.empty() == b.empty();
    if (a.is_uniform() != b.is_uniform()) return false;
    if (a.is_uniform()) return *a.uniform() == *b.uniform();
    if (a.ranks() != b.ranks()) return false;
    for (int r : a.ranks()) {
      if (a.at(r) != b.at(r)) return false;
    }
    return true;
  };
  return same(out_splits, other.out_splits) && same(in_splits, other.in_splits);
}

std::size_t hash_value(const AllReduceOptions& o) {
  return std::hash<int>{}(static_cast<int>(o.op));
}
std::size_t hash_value(const AllGatherOptions& o) {
  return std::hash<int64_t>{}(o.gather_dim);
}
std::size_t hash_value(const ReduceScatterOptions& o) {
  std::size_t seed = static_cast<std::size_t>(o.op);
  hash_combine(seed, o.scatter_dim);
  return seed;
}
std::size_t hash_value(const AllToAllOptions& o) {
  std::size_t seed = std::hash<int64_t>{}(o.split_dim);
  hash_combine(seed, o.concat_dim);
  return seed;
}
std::size_t hash_value(const AllToAllSingleOptions& o) {
  std::size_t seed = 0;
  for (const auto* splits : {&o.out_splits, &o.in_splits}) {
    if (splits->empty()) {
      hash_combine(seed, -1);
      continue;
    }
    if (splits->is_uniform()) {
      hash_combine(seed, hash_range(*splits->uniform()));
      continue;
    }
    for (int r : splits->ranks()) {
      hash_combine(seed, r);
      hash_combine(seed, hash_range(splits->at(r)));
    }
  }
  return seed;
}
std::size_t hash_value(const BroadcastOptions& o) {
  return std::hash<int>{}(o.src);
}
std::size_t hash_value(const ScatterOptions& o) {
  std::size_t seed = std::hash<int>{}(o.src);
  hash_combine(seed, o.scatter_dim);
  return seed;
}
std::size_t hash_value(const GatherOptions& o) {
  std::size_t seed = std::hash<int>{}(o.dst);
  hash_combine(seed, o.gather_dim);
  return seed;
}
std::size_t hash_value(const ReduceOptions& o) {
  std::size_t seed = static_cast<std::size_t>(o.op);
  hash_combine(seed, o.dst);
  return seed;
}
std::size_t hash_value(const PermuteOptions& o) {
  return hash_range(o.dst_of);
}
std::size_t hash_value(const BarrierOptions&) {
  return 0;
}

std::string describe(const AllReduceOptions& o) {
  return fmt::format("op={}", o.op);
}
std::string describe(const AllGatherOptions& o) {
  return fmt::format("gather_dim={}", o.gather_dim);
}
std::string describe(const ReduceScatterOptions& o) {
  return fmt::format("op={} scatter_dim={}", o.op, o.scatter_dim);
}
std::string describe(const AllToAllOptions& o) {
  return fmt::format("split_dim={} concat_dim={}", o.split_dim, o.concat_dim);
}
std::string describe(const AllToAllSingleOptions& o) {
  return fmt::format("out_splits={} in_splits={}", splits_str(o.out_splits),
                     splits_str(o.in_splits));
}
std::string describe(const BroadcastOptions& o) {
  return fmt::format("src={}", o.src);
}
std::string describe(const ScatterOptions& o) {
  return fmt::format("src={} scatter_dim={}", o.src, o.scatter_dim);
}
std::string describe(const GatherOptions& o) {
  return fmt::format("dst={} gather_dim={}", o.dst, o.gather_dim);
}
std::string describe(const ReduceOptions& o) {
  return fmt::format("op={} dst={}", o.op, o.dst);
}
std::string describe(const PermuteOptions& o) {
  return fmt::format("dst_of={}", o.dst_of);
}
std::string describe(const BarrierOptions&) {
  return "";
}

}  // namespace spmd
