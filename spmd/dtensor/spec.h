// spmd/dtensor/spec.h: DTensorSpec, everything about a DTensor but its data: the mesh, one
// placement per mesh dim, the global shape and the dtype.
//
// Specs key the redistribute-plan cache and the sharding-propagation cache, so the hash is
// computed once at construction and equality checks the cheap fields first. Per-rank facts
// (which held ranks the mesh contains, their coordinates, local shapes and offsets) are computed
// on first use and kept with the spec; they are pure functions of the spec and the world, so no
// communication is needed to know any rank's piece (Note [Uneven sharding]).
//
//   DTensorSpec spec(mesh, {Shard{0}, Replicate{}}, {5, 4}, DType::F32);   // mesh (2, 2)
//   spec.local_shape({1, 0});    // [2, 4]: coordinate 1 of 2 holds rows [3, 5)
//   spec.to_string();            // "DTensorSpec(S(0),R, [5, 4] f32, DeviceMesh(...))"
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/core/format.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/placement.h>
#include <spmd/ops/sharding.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/shape.h>

namespace spmd {

class DTensorSpec : public ShardingSpec {
 public:
  // Validates and normalizes (negative Shard dims count from the end). PlacementError naming the
  // mesh, the placements and the shape when the mesh is undefined, the number of placements is
  // not the mesh's ndim, a Shard dim is out of range, or a Partial carries a bitwise op;
  // ShapeError for a negative size or an element count (or byte count) beyond int64; Unsupported
  // for a DType that is not one. Messages start with `op`, the operation that makes the spec.
  DTensorSpec(DeviceMesh mesh, Placements placements, Shape shape, DType dtype,
              std::string_view op = "DTensorSpec");
  DTensorSpec(const DTensorSpec& other);
  DTensorSpec& operator=(const DTensorSpec& other);

  const DeviceMesh& mesh() const { return mesh_; }

  std::size_t hash() const { return hash_; }
  bool operator==(const DTensorSpec& other) const;

  // The same spec with other placements (validated; errors start with `op`).
  DTensorSpec with_placements(Placements placements, std::string_view op = "DTensorSpec") const;

  // The held ranks of the mesh's world that the mesh contains (the ranks a DTensor of this spec
  // holds), with each one's coordinate, local shape and offset. Computed once (and under
  // --spmd-tensors=meta shared by every equal spec: a dry run over many ranks keeps one copy).
  struct RankInfo {
    std::vector<int> ranks;
    std::vector<std::vector<int64_t>> coordinates;
    std::vector<Shape> local_shapes;
    std::vector<Shape> local_offsets;
    bool uniform_shapes = true;  // every held rank's local shape is the same
    // Note [Shard classes] (world/local_tensor.h): the ranks grouped by local shape: the class of
    // each rank (by position) and each class's local shape. A shape-only DTensor of this spec
    // holds one shard per class.
    std::shared_ptr<const std::vector<int>> shared_ranks;
    std::shared_ptr<const std::vector<uint32_t>> shape_classes;
    std::vector<Shape> class_shapes;
    // Index of `rank` in `ranks`.
    std::size_t index_of(int rank) const;
  };
  const RankInfo& rank_info() const;

  // "DTensorSpec(S(0),R, [5, 4] f32, DeviceMesh((2, 2), stride=(2, 1)))".
  std::string to_string() const;

 private:
  DeviceMesh mesh_;
  std::size_t hash_ = 0;
  // Computed on first use; copies start without it.
  mutable std::mutex rank_info_mutex_;
  mutable std::atomic<const RankInfo*> rank_info_{nullptr};
  mutable std::shared_ptr<const RankInfo> rank_info_owner_;
};

using SpecPtr = std::shared_ptr<const DTensorSpec>;

std::ostream& operator<<(std::ostream& os, const DTensorSpec& spec);

}  // namespace spmd

template <>
struct std::hash<spmd::DTensorSpec> {
  std::size_t operator()(const spmd::DTensorSpec& spec) const noexcept { return spec.hash(); }
};

template <>
struct fmt::formatter<spmd::DTensorSpec> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const spmd::DTensorSpec& spec, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", spec.to_string());
  }
};
