// spmd/debug/allocator_model.cpp: the caching allocator model (Note [Allocator model]).
#include <spmd/debug/allocator_model.h>

#include <algorithm>
#include <limits>

namespace spmd {
namespace {

int64_t round_request(int64_t bytes) {
  const int64_t b = std::max<int64_t>(bytes, 1);
  return (b + CachingAllocatorModel::kMinBlock - 1) / CachingAllocatorModel::kMinBlock *
         CachingAllocatorModel::kMinBlock;
}

int64_t round_up(int64_t bytes, int64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

CachingAllocatorModel::CachingAllocatorModel(AllocatorConfig config) : config_(config) {
  expandable_.fill(-1);
}

void CachingAllocatorModel::add_free(int64_t seg, int64_t offset) {
  const Segment& s = segments_.at(seg);
  free_[static_cast<size_t>(s.pool)].insert({s.blocks.at(offset).size, seg, offset});
}

void CachingAllocatorModel::remove_free(int64_t seg, int64_t offset) {
  const Segment& s = segments_.at(seg);
  free_[static_cast<size_t>(s.pool)].erase({s.blocks.at(offset).size, seg, offset});
}

int64_t CachingAllocatorModel::take(int64_t seg, int64_t offset, int64_t size) {
  Segment& s = segments_.at(seg);
  remove_free(seg, offset);
  Block& b = s.blocks.at(offset);
  const int64_t rest = b.size - size;
  const bool split = s.small ? rest >= kMinBlock : rest > kSmallSize;
  if (split) {
    b.size = size;
    s.blocks[offset + size] = Block{rest, true};
    add_free(seg, offset + size);
  }
  s.blocks.at(offset).free = false;
  return s.blocks.at(offset).size;
}

int64_t CachingAllocatorModel::segment_reserved(const Segment& s) const {
  return round_up(s.size, kRoundLarge);
}

void CachingAllocatorModel::add_reserved(const Segment& s, int64_t bytes) {
  stats_.reserved += bytes;
  stats_.stream_reserved[static_cast<size_t>(s.pool / 2)] += bytes;
}

void CachingAllocatorModel::update_reserved() {
  if (stats_.reserved > stats_.peak_reserved) {
    stats_.peak_reserved = stats_.reserved;
    stats_.stream_reserved_at_peak = stats_.stream_reserved;
  }
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.segments = static_cast<int64_t>(segments_.size());
}

int64_t CachingAllocatorModel::new_segment(int pool, int64_t size) {
  const int64_t id = next_segment_++;
  Segment s;
  s.pool = pool;
  s.small = pool % 2 == 1;
  s.size = size;
  s.blocks[0] = Block{size, true};
  add_reserved(s, size);
  segments_.emplace(id, std::move(s));
  add_free(id, 0);
  return id;
}

void CachingAllocatorModel::release_free_segments() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    const Segment& s = it->second;
    const bool expandable = it->first == expandable_[static_cast<size_t>(s.pool)];
    if (!expandable && s.blocks.size() == 1 && s.blocks.begin()->second.free) {
      remove_free(it->first, 0);
      add_reserved(s, -s.size);
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocatorModel::allocated(uint64_t id, int64_t bytes, MetaStream stream) {
  const int64_t size = round_request(bytes);
  const bool small = size <= kSmallSize;
  const int pool = pool_of(stream, small);
  ++stats_.allocations;
  // Best fit: the smallest free block of the pool that holds the request.
  const std::set<FreeKey>& free = free_[static_cast<size_t>(pool)];
  auto it = free.lower_bound(
      {size, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min()});
  int64_t seg = -1;
  int64_t offset = 0;
  if (it != free.end()) {
    seg = std::get<1>(*it);
    offset = std::get<2>(*it);
  } else if (config_.expandable_segments && !small) {
    // Grow the pool's one segment at its end (reusing a free block there).
    int64_t& expandable = expandable_[static_cast<size_t>(pool)];
    if (expandable < 0) {
      const int64_t sid = next_segment_++;
      Segment s;
      s.pool = pool;
      s.small = small;
      segments_.emplace(sid, std::move(s));
      expandable = sid;
    }
    seg = expandable;
    Segment& s = segments_.at(seg);
    const int64_t before = segment_reserved(s);
    if (!s.blocks.empty() && s.blocks.rbegin()->second.free) {
      offset = s.blocks.rbegin()->first;
      remove_free(seg, offset);
      s.blocks.at(offset).size = size;
    } else {
      offset = s.size;
      s.blocks[offset] = Block{size, true};
    }
    s.size = offset + size;
    const int64_t grown = segment_reserved(s) - before;
    if (config_.capacity > 0 && stats_.reserved + grown > config_.capacity) {
      release_free_segments();
      if (stats_.reserved + grown > config_.capacity) ++stats_.ooms;
    }
    add_reserved(s, grown);
    add_free(seg, offset);
  } else {
    const int64_t segment_size = small                   ? kSmallBuffer
                                 : size < kMinLargeAlloc ? kLargeBuffer
                                                         : round_up(size, kRoundLarge);
    if (config_.capacity > 0 && stats_.reserved + segment_size > config_.capacity) {
      release_free_segments();
      if (stats_.reserved + segment_size > config_.capacity) ++stats_.ooms;
    }
    seg = new_segment(pool, segment_size);
    offset = 0;
  }
  stats_.allocated += take(seg, offset, size);
  live_[id] = {seg, offset};
  update_reserved();
}

void CachingAllocatorModel::seed(int64_t bytes) {
  if (bytes <= 0) return;
  const int64_t size = round_up(bytes, kRoundLarge);
  seed_segment_ = new_segment(pool_of(MetaStream::compute, false), size);
  stats_.allocated += take(seed_segment_, 0, size);
  update_reserved();
}

void CachingAllocatorModel::freed(uint64_t id, int64_t bytes) {
  const auto found = live_.find(id);
  if (found == live_.end()) {
    // Allocated before the model listened: carve its bytes off the end of the seed's block.
    if (seed_segment_ < 0) return;
    Segment& s = segments_.at(seed_segment_);
    Block& b = s.blocks.at(0);
    const int64_t give = std::min(round_request(bytes), b.size);
    if (b.free || give <= 0) return;
    b.size -= give;
    stats_.allocated -= give;
    const int64_t offset = b.size;
    auto next = s.blocks.upper_bound(offset);
    int64_t size = give;
    if (next != s.blocks.end() && next->second.free) {
      remove_free(seed_segment_, next->first);
      size += next->second.size;
      s.blocks.erase(next);
    }
    s.blocks[offset] = Block{size, true};  // replaces the seed's block when nothing is left of it
    add_free(seed_segment_, offset);
    update_reserved();
    return;
  }
  auto [seg, offset] = found->second;
  live_.erase(found);
  Segment& s = segments_.at(seg);
  Block& b = s.blocks.at(offset);
  stats_.allocated -= b.size;
  b.free = true;
  // Merge with the free neighbours.
  auto it = s.blocks.find(offset);
  auto next = std::next(it);
  if (next != s.blocks.end() && next->second.free) {
    remove_free(seg, next->first);
    it->second.size += next->second.size;
    s.blocks.erase(next);
  }
  if (it != s.blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      remove_free(seg, prev->first);
      prev->second.size += it->second.size;
      s.blocks.erase(it);
      it = prev;
    }
  }
  add_free(seg, it->first);
  update_reserved();
}

}  // namespace spmd
