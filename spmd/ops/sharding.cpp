// spmd/ops/sharding.cpp: local shapes and offsets of a ShardingSpec (Note [Uneven sharding]).
#include <spmd/ops/sharding.h>

#include <algorithm>

#include <spmd/core/check.h>

namespace spmd {

ShardingSpec::ShardingSpec(Placements placements, Shape shape, DType dtype,
                           std::vector<int64_t> mesh_shape)
    : placements_(std::move(placements)),
      shape_(std::move(shape)),
      dtype_(dtype),
      mesh_shape_(std::move(mesh_shape)) {
  const int nd = static_cast<int>(shape_.size());
  for (Placement& p : placements_) {
    if (Shard* s = std::get_if<Shard>(&p); s != nullptr && s->dim < 0 && s->dim >= -nd) {
      s->dim += nd;
    }
  }
}

bool ShardingSpec::is_replicated() const {
  return std::all_of(placements_.begin(), placements_.end(),
                     [](const Placement& p) { return is_replicate(p); });
}

bool ShardingSpec::has_partial() const {
  return std::any_of(placements_.begin(), placements_.end(),
                     [](const Placement& p) { return is_partial(p); });
}

int64_t ShardingSpec::num_shards() const {
  int64_t n = 1;
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (is_shard(placements_[i])) n *= mesh_shape_[i];
  }
  return n;
}

bool ShardingSpec::is_even() const {
  Shape logical = shape_;
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&placements_[i])) {
      int64_t& n = logical[static_cast<size_t>(s->dim)];
      if (n % mesh_shape_[i] != 0) return false;
      n /= mesh_shape_[i];
    }
  }
  return true;
}

ShardingSpec ShardingSpec::with_placements(Placements placements) const {
  return ShardingSpec(std::move(placements), shape_, dtype_, mesh_shape_);
}

Shape ShardingSpec::local_shape(const std::vector<int64_t>& coordinate) const {
  SPMD_CHECK_EQ(coordinate.size(), placements_.size());
  Shape local = shape_;
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&placements_[i])) {
      int64_t& n = local[static_cast<size_t>(s->dim)];
      n = shard_size(n, mesh_shape_[i], coordinate[i]);
    }
  }
  return local;
}

Shape ShardingSpec::local_offset(const std::vector<int64_t>& coordinate) const {
  SPMD_CHECK_EQ(coordinate.size(), placements_.size());
  Shape logical = shape_;
  Shape offset(shape_.size(), 0);
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&placements_[i])) {
      const size_t d = static_cast<size_t>(s->dim);
      offset[d] += shard_offset(logical[d], mesh_shape_[i], coordinate[i]);
      logical[d] = shard_size(logical[d], mesh_shape_[i], coordinate[i]);
    }
  }
  return offset;
}

Shape ShardingSpec::padded_local_shape() const {
  Shape local = shape_;
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&placements_[i])) {
      int64_t& n = local[static_cast<size_t>(s->dim)];
      n = shard_capacity(n, mesh_shape_[i]);
    }
  }
  return local;
}

}  // namespace spmd
