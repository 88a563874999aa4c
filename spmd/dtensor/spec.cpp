// spmd/dtensor/spec.cpp: DTensorSpec validation, hashing, local shapes and per-rank facts.
#include <spmd/dtensor/spec.h>

#include <algorithm>
#include <ostream>
#include <unordered_map>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/tensor/meta.h>

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

namespace {

// One list object per distinct rank list, so that LocalTensors over the same ranks share it and
// compare their ranks by pointer (a dry run's thousands of ranks are otherwise compared per op).
std::shared_ptr<const std::vector<int>> shared_rank_list(const std::vector<int>& ranks) {
  static std::mutex mutex;
  static auto* lists = new std::vector<std::weak_ptr<const std::vector<int>>>();
  std::lock_guard<std::mutex> lock(mutex);
  std::erase_if(*lists, [](const auto& w) { return w.expired(); });
  for (const auto& w : *lists) {
    if (auto list = w.lock(); list && *list == ranks) return list;
  }
  auto list = std::make_shared<const std::vector<int>>(ranks);
  lists->push_back(list);
  return list;
}

std::shared_ptr<const DTensorSpec::RankInfo> compute_rank_info(const DTensorSpec& spec) {
  auto info = std::make_shared<DTensorSpec::RankInfo>();
  const DeviceMesh& mesh = spec.mesh();
  auto classes = std::make_shared<std::vector<uint32_t>>();
  for (int r : mesh.world().held_ranks()) {
    auto coordinate = mesh.coordinate_of(r);
    if (!coordinate) continue;
    info->ranks.push_back(r);
    info->local_shapes.push_back(spec.local_shape(*coordinate));
    info->local_offsets.push_back(spec.local_offset(*coordinate));
    info->coordinates.push_back(std::move(*coordinate));
    const Shape& shape = info->local_shapes.back();
    if (shape != info->local_shapes.front()) info->uniform_shapes = false;
    auto it = std::find(info->class_shapes.begin(), info->class_shapes.end(), shape);
    if (it == info->class_shapes.end()) {
      info->class_shapes.push_back(shape);
      it = info->class_shapes.end() - 1;
    }
    classes->push_back(static_cast<uint32_t>(it - info->class_shapes.begin()));
  }
  info->shared_ranks = shared_rank_list(info->ranks);
  info->shape_classes = std::move(classes);
  return info;
}

struct RankInfoCache {
  std::mutex mutex;
  std::unordered_map<DTensorSpec, std::shared_ptr<const DTensorSpec::RankInfo>> map;
};

RankInfoCache& rank_info_cache() {
  static RankInfoCache* cache = [] {
    // Each new world drops the entries (Note [Caches and worlds] in world/world.h): they hold
    // their specs' meshes and, at 16384 ranks, every rank's coordinates, shapes and offsets.
    add_new_world_listener([] { drop_cache_entries(rank_info_cache()); });
    return new RankInfoCache();  // never destroyed
  }();
  return *cache;
}

// Under --spmd-tensors=meta, equal specs share one RankInfo (Note [Shape-only tensors]): a dry
// run at 16384 ranks makes many spec objects of few distinct values.
std::shared_ptr<const DTensorSpec::RankInfo> shared_rank_info(const DTensorSpec& spec) {
  RankInfoCache& cache = rank_info_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.map.find(spec);
    if (it != cache.map.end()) return it->second;
  }
  auto info = compute_rank_info(spec);
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.map.emplace(spec, std::move(info)).first->second;
}

}  // namespace

const DTensorSpec::RankInfo& DTensorSpec::rank_info() const {
  if (const RankInfo* ready = rank_info_.load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(rank_info_mutex_);
  if (!rank_info_owner_) {
    rank_info_owner_ = meta_tensors() ? shared_rank_info(*this) : compute_rank_info(*this);
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
