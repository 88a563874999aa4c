// spmd/ops/sharding.h: ShardingSpec, how a global tensor is cut over a mesh of a given shape: one
// placement per mesh dim, the global shape and the dtype. No mesh object, no ranks, no data.
//
// It is the vocabulary of the op table's sharding strategies (ops/op.h): a strategy sees its
// inputs' ShardingSpecs and says which placements each must have and which the output gets.
// DTensorSpec (dtensor/spec.h) is a ShardingSpec on a concrete DeviceMesh. Every per-rank fact is
// a pure function of the spec and the rank's mesh coordinate (Note [Uneven sharding]).
//
//   ShardingSpec s({Shard{0}, Replicate{}}, {5, 4}, DType::F32, /*mesh_shape=*/{2, 2});
//   s.local_shape({1, 0});    // [2, 4]: coordinate 1 of 2 holds rows [3, 5)
//   s.local_offset({1, 0});   // [3, 0]
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <spmd/ops/placement.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/shape.h>

namespace spmd {

class ShardingSpec {
 public:
  // Negative Shard dims in range count from the end and are normalized; nothing is validated here
  // (DTensorSpec validates, naming the mesh and its dims in its messages).
  ShardingSpec(Placements placements, Shape shape, DType dtype, std::vector<int64_t> mesh_shape);

  const Placements& placements() const { return placements_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  const std::vector<int64_t>& mesh_shape() const { return mesh_shape_; }
  int mesh_ndim() const { return static_cast<int>(placements_.size()); }

  // Every placement is Replicate.
  bool is_replicated() const;
  bool has_partial() const;
  // Product of the mesh sizes of the Shard placements.
  int64_t num_shards() const;
  // True when every sharded tensor dim splits evenly at every level of its nesting, so every
  // rank's piece has the same shape.
  bool is_even() const;
  // The same sharding with other placements (normalized, not validated).
  ShardingSpec with_placements(Placements placements) const;

  // The piece of the rank at mesh `coordinate` (Note [Uneven sharding], nesting outer first).
  Shape local_shape(const std::vector<int64_t>& coordinate) const;
  Shape local_offset(const std::vector<int64_t>& coordinate) const;
  // The largest local shape: each sharded dim padded to its chunk capacity, level by level.
  Shape padded_local_shape() const;

 protected:
  Placements placements_;
  Shape shape_;
  DType dtype_;
  std::vector<int64_t> mesh_shape_;
};

}  // namespace spmd
