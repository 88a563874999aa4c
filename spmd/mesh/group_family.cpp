// spmd/mesh/group_family.cpp: RankMap validation and GroupFamily over a dim layout.
#include <spmd/mesh/group_family.h>

#include <mutex>
#include <utility>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {

std::shared_ptr<const RankMap> RankMap::make(std::vector<int64_t> ranks, int64_t world_size,
                                             std::string_view op) {
  auto map = std::make_shared<RankMap>();
  int64_t largest = -1;
  for (size_t p = 0; p < ranks.size(); ++p) {
    int64_t r = ranks[p];
    if (r < 0) throw_error<MeshError>("{}: rank {} at position {} is negative", op, r, p);
    if (world_size > 0 && r >= world_size) {
      throw_error<MeshError>("{}: rank {} at position {} is not in the world of {} ranks", op, r, p,
                             world_size);
    }
    largest = std::max(largest, r);
  }
  map->position_of.assign(static_cast<size_t>(largest + 1), -1);
  for (size_t p = 0; p < ranks.size(); ++p) {
    int64_t& slot = map->position_of[static_cast<size_t>(ranks[p])];
    if (slot != -1) {
      throw_error<MeshError>("{}: rank {} appears twice, at positions {} and {}", op, ranks[p],
                             slot, p);
    }
    slot = static_cast<int64_t>(p);
  }
  map->content_hash = hash_range(ranks);
  map->ranks = std::move(ranks);
  return map;
}

struct GroupFamily::State {
  Layout layout;
  Layout canonical;   // coalesce(layout): equality and hashing
  Layout complement;  // one offset per group, ascending
  std::shared_ptr<const RankMap> rank_map;
  std::once_flag once;
  std::vector<std::vector<int>> groups;
};

GroupFamily::GroupFamily(Layout dim_layout, std::shared_ptr<const RankMap> rank_map,
                         std::string dim_name)
    : dim_name_(std::move(dim_name)) {
  if (!rank_map) throw_error<MeshError>("GroupFamily '{}': no rank map", dim_name_);
  int64_t positions = rank_map->size();
  if (!is_tractable(dim_layout)) {
    throw_error<MeshError>(
        "GroupFamily '{}': layout {} is not tractable (it overlaps, or its modes do not nest), so "
        "it does not partition the {} ranks into groups",
        dim_name_, dim_layout, positions);
  }
  Layout c = complement(dim_layout, positions);
  if (size(c) * size(dim_layout) != positions) {
    throw_error<MeshError>(
        "GroupFamily '{}': layout {} does not tile the {} ranks of the rank map (its groups would "
        "need {} positions)",
        dim_name_, dim_layout, positions, size(c) * size(dim_layout));
  }
  state_ = std::make_shared<State>();
  state_->canonical = coalesce(dim_layout);
  state_->layout = std::move(dim_layout);
  state_->complement = std::move(c);
  state_->rank_map = std::move(rank_map);
}

GroupFamily::GroupFamily(std::shared_ptr<State> state, std::string dim_name)
    : state_(std::move(state)), dim_name_(std::move(dim_name)) {}

const Layout& GroupFamily::layout() const {
  return state_->layout;
}

const std::shared_ptr<const RankMap>& GroupFamily::rank_map() const {
  return state_->rank_map;
}

GroupFamily GroupFamily::with_dim_name(std::string dim_name) const {
  return GroupFamily(state_, std::move(dim_name));
}

int64_t GroupFamily::group_size() const {
  return size(state_->layout);
}

int64_t GroupFamily::num_groups() const {
  return size(state_->complement);
}

std::vector<int> GroupFamily::group(int64_t g) const {
  if (g < 0 || g >= num_groups()) {
    throw_error<MeshError>("GroupFamily '{}': group {} is out of range, there are {} groups",
                           dim_name_, g, num_groups());
  }
  const Layout& l = state_->layout;
  const std::vector<int64_t>& ranks = state_->rank_map->ranks;
  int64_t base = state_->complement(g);
  int64_t n = size(l);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int>(ranks[base + l(i)]));
  return out;
}

std::optional<GroupFamily::Location> GroupFamily::locate(int rank) const {
  int64_t p = state_->rank_map->position(rank);
  if (p < 0) return std::nullopt;
  return Location{radix_index(state_->complement, p), radix_index(state_->layout, p)};
}

const std::vector<std::vector<int>>& GroupFamily::groups() const {
  State& s = *state_;
  std::call_once(s.once, [&s] {
    std::vector<int64_t> inner = codomain(s.layout);
    std::vector<int64_t> outer = codomain(s.complement);
    const std::vector<int64_t>& ranks = s.rank_map->ranks;
    s.groups.reserve(outer.size());
    for (int64_t base : outer) {
      std::vector<int>& group = s.groups.emplace_back();
      group.reserve(inner.size());
      for (int64_t l : inner) group.push_back(static_cast<int>(ranks[base + l]));
    }
  });
  return s.groups;
}

bool GroupFamily::operator==(const GroupFamily& other) const {
  if (state_ == other.state_) return true;
  const auto& a = state_->rank_map;
  const auto& b = other.state_->rank_map;
  return state_->canonical == other.state_->canonical &&
         (a == b || (a->content_hash == b->content_hash && *a == *b));
}

std::size_t GroupFamily::hash() const {
  std::size_t seed = state_->canonical.hash();
  hash_combine(seed, state_->rank_map->content_hash);
  return seed;
}

}  // namespace spmd
