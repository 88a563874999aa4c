// spmd/dtensor/spec.cpp: DTensorSpec validation, hashing, local shapes and per-rank facts.
#include <spmd/dtensor/spec.h>

#include <algorithm>
#include <ostream>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {

namespace {
std::vector<int64_t> shape_of(const DeviceMesh& mesh) {
  return mesh.defined() ? mesh.shape() : std::vector<int64_t>{};
}
}  // namespace

DTensorSpec::DTensorSpec(DeviceMesh mesh, Placements placements, Shape shape, DType dtype,
                         std::string_view op)
    : ShardingSpec(std::move(placements), std::move(shape), dtype, shape_of(mesh)),
      mesh_(std::move(mesh)) {
  if (!mesh_.defined()) {
    throw_error<PlacementError>("{}: the mesh is undefined (placements {}, shape {})", op,
                                spmd::to_string(placements_), shape_str(shape_));
  }
  if (static_cast<int>(placements_.size()) != mesh_.ndim()) {
    throw_error<PlacementError>(
        "{}: {} placements {} for the {}-d mesh {} (one placement per mesh dim), shape "
        "{}",
        op, placements_.size(), spmd::to_string(placements_), mesh_.ndim(), mesh_.to_string(),
        shape_str(shape_));
  }
  check_dtype(dtype_, op);
  for (int64_t s : shape_) {
    if (s < 0) {
      throw_error<ShapeError>("{}: negative size in shape {} (placements {}, mesh {})", op,
                              shape_str(shape_), spmd::to_string(placements_), mesh_.to_string());
    }
  }
  try {
    checked_numel(shape_, op);
  } catch (const ShapeError&) {
    throw_error<ShapeError>(
        "{}: shape {} has too many elements for an int64 count of its {} bytes "
        "(placements {}, mesh {})",
        op, shape_str(shape_), dtype_, spmd::to_string(placements_), mesh_.to_string());
  }
  const int64_t nd = static_cast<int64_t>(shape_.size());
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&placements_[i])) {
      if (s->dim < 0 || s->dim >= nd) {
        throw_error<PlacementError>(
            "{}: placement {} on mesh dim {} ({}) shards dim {} of a {}-d tensor of "
            "shape {} (placements {}, mesh {})",
            op, spmd::to_string(placements_[i]), i, mesh_.dim_name(static_cast<int>(i)), s->dim, nd,
            shape_str(shape_), spmd::to_string(placements_), mesh_.to_string());
      }
    } else if (const Partial* p = std::get_if<Partial>(&placements_[i])) {
      if (!is_partial_op(p->op)) {
        throw_error<PlacementError>(
            "{}: Partial({}) on mesh dim {} is not a valid Partial (sum, avg, product, "
            "min or max), shape {}, mesh {}",
            op, reduce_op_str(p->op), i, shape_str(shape_), mesh_.to_string());
      }
    }
  }
  hash_ = mesh_.hash();
  hash_combine(hash_, hash_value(placements_));
  for (int64_t s : shape_) hash_combine(hash_, s);
  hash_combine(hash_, static_cast<int>(dtype_));
}

DTensorSpec::DTensorSpec(const DTensorSpec& other)
    : ShardingSpec(other), mesh_(other.mesh_), hash_(other.hash_) {}

DTensorSpec& DTensorSpec::operator=(const DTensorSpec& other) {
  if (this == &other) return *this;
  ShardingSpec::operator=(other);
  mesh_ = other.mesh_;
  hash_ = other.hash_;
  std::lock_guard<std::mutex> lock(rank_info_mutex_);
  rank_info_.store(nullptr, std::memory_order_release);
  rank_info_owner_.reset();
  return *this;
}

bool DTensorSpec::operator==(const DTensorSpec& other) const {
  if (this == &other) return true;
  return hash_ == other.hash_ && dtype_ == other.dtype_ && shape_ == other.shape_ &&
         placements_ == other.placements_ && mesh_ == other.mesh_;
}

DTensorSpec DTensorSpec::with_placements(Placements placements, std::string_view op) const {
  return DTensorSpec(mesh_, std::move(placements), shape_, dtype_, op);
}

std::size_t DTensorSpec::RankInfo::index_of(int rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end() || *it != rank) {
    throw_error<PlacementError>("DTensorSpec: rank {} is not a held rank of the mesh (held: {})",
                                rank, ranks_str(ranks));
  }
  return static_cast<size_t>(it - ranks.begin());
}

const DTensorSpec::RankInfo& DTensorSpec::rank_info() const {
  if (const RankInfo* ready = rank_info_.load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(rank_info_mutex_);
  if (!rank_info_owner_) {
    auto info = std::make_unique<RankInfo>();
    for (int r : mesh_.world().held_ranks()) {
      auto coordinate = mesh_.coordinate_of(r);
      if (!coordinate) continue;
      info->ranks.push_back(r);
      info->local_shapes.push_back(local_shape(*coordinate));
      info->local_offsets.push_back(local_offset(*coordinate));
      info->coordinates.push_back(std::move(*coordinate));
      if (info->local_shapes.back() != info->local_shapes.front()) info->uniform_shapes = false;
    }
    rank_info_owner_ = std::move(info);
    rank_info_.store(rank_info_owner_.get(), std::memory_order_release);
  }
  return *rank_info_owner_;
}

std::string DTensorSpec::to_string() const {
  return fmt::format("DTensorSpec({}, {} {}, {})", spmd::to_string(placements_), shape_str(shape_),
                     dtype_, mesh_.to_string());
}

std::ostream& operator<<(std::ostream& os, const DTensorSpec& spec) {
  return os << spec.to_string();
}

}  // namespace spmd
