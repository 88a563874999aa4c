// spmd/mesh/group_family.h: RankMap (positions -> ranks, shared by a root mesh and everything
// derived from it) and GroupFamily (the partition of those ranks into the groups along one mesh
// dim).
//
// A collective along a mesh dim runs once per group of that dim. The groups come from the dim's
// layout L over the rank map's positions: group g holds rank_map[C(g) + L(i)] for every i, with
// C = complement(L, rank map size). A GroupFamily is what a backend receives: the sim backend
// walks every group, a real backend finds its own with locate(rank). Building one is O(modes);
// only groups() lists ranks, once, on first use.
//
//   auto map = RankMap::make({0, 1, 2, 3, 4, 5, 6, 7});
//   GroupFamily cp(Layout(2, 2), map, "cp");   // dim cp of a (dp=2, cp=2, tp=2) mesh
//   cp.groups();                               // [[0,2],[1,3],[4,6],[5,7]]
//   cp.locate(6);                              // {group 2, index 1}
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/mesh/layout.h>

namespace spmd {

// The rank map shared by a root mesh and every mesh derived from it.
struct RankMap {
  std::vector<int64_t> ranks;        // position -> rank
  std::vector<int64_t> position_of;  // rank -> position or -1; sized max rank + 1
  std::size_t content_hash = 0;      // hash of `ranks`, for mesh hashing

  // Validates `ranks` (none negative, none repeated, each below `world_size` when that is > 0)
  // and fills position_of and content_hash. MeshError starting with `op` names the first bad
  // rank and its positions.
  static std::shared_ptr<const RankMap> make(std::vector<int64_t> ranks, int64_t world_size = 0,
                                             std::string_view op = "RankMap");
  int64_t size() const { return static_cast<int64_t>(ranks.size()); }
  // The position of `rank`, or -1 when the map does not hold it.
  int64_t position(int64_t rank) const {
    return rank >= 0 && rank < static_cast<int64_t>(position_of.size()) ? position_of[rank] : -1;
  }
  bool operator==(const RankMap& other) const { return ranks == other.ranks; }
};

// The partition of the rank map's ranks into the groups along one mesh dim.
class GroupFamily {
 public:
  // @pre dim_layout is tractable and tiles the rank map (size(complement) * size(layout) equals
  //      the rank map size); otherwise MeshError naming the dim.
  GroupFamily(Layout dim_layout, std::shared_ptr<const RankMap> rank_map, std::string dim_name);

  const Layout& layout() const;
  const std::shared_ptr<const RankMap>& rank_map() const;
  // For messages: "tp", or "dim 1" when unnamed.
  const std::string& dim_name() const { return dim_name_; }
  // The same family under another name; shares the materialized groups.
  GroupFamily with_dim_name(std::string dim_name) const;

  // size(layout): ranks per group.
  int64_t group_size() const;
  // size(complement(layout, rank map size)).
  int64_t num_groups() const;
  // Ranks of group g, in coordinate order. O(group size). MeshError when g is out of range.
  std::vector<int> group(int64_t g) const;

  struct Location {
    int64_t group;  // which group holds the rank
    int64_t index;  // the rank's coordinate along the dim (its position within the group)
    bool operator==(const Location&) const = default;
  };
  // Where `rank` sits. O(modes); nullopt when the rank map does not hold it.
  std::optional<Location> locate(int rank) const;

  // All groups, in the complement's lexicographic order (PyTorch's global_ranks order), each in
  // coordinate order. Materialized once on first use (thread-safe) and shared by copies.
  const std::vector<std::vector<int>>& groups() const;

  // Same layout (as functions: coalesced) over the same rank map (same object or contents).
  bool operator==(const GroupFamily& other) const;
  std::size_t hash() const;

 private:
  struct State;
  GroupFamily(std::shared_ptr<State> state, std::string dim_name);

  std::shared_ptr<State> state_;
  std::string dim_name_;
};

}  // namespace spmd

template <>
struct std::hash<spmd::GroupFamily> {
  std::size_t operator()(const spmd::GroupFamily& family) const noexcept { return family.hash(); }
};
