// spmd/debug/allocator_model.h: a model of PyTorch's CUDA caching allocator, fed with a dry
// run's shape-only allocations in program order, so the report can say what a real run reserves
// on the device and not only what its tensors hold.
//
//   CachingAllocatorModel model({.expandable_segments = false});
//   model.allocated(1, 3 << 20, MetaStream::compute);  // what set_meta_allocation_listener(&model)
//   model.freed(1, 3 << 20);                           // does for a run
//   model.stats().peak_reserved;   // 20 MiB: one large segment
//
// Note [Allocator model]
// The rules are those of PyTorch's CUDACachingAllocator (c10/cuda) with its defaults:
// - a request is rounded up to a multiple of 512 bytes (at least 512);
// - requests of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger ones
//   from the large pool, whose segments are 20 MiB for requests under 10 MiB and the request
//   rounded up to 2 MiB otherwise;
// - a request takes the smallest free block of its pool that fits (best fit, then the lowest
//   segment and offset); the rest of the block is split off when it is at least 512 bytes (small
//   pool) or more than 1 MiB (large pool), and otherwise stays part of the allocation;
// - a freed block merges with free neighbours in its segment; segments are kept (cached), not
//   returned, so reserved memory only grows, except:
// - when a new segment would take reserved memory past `capacity` (the device's memory less the
//   CUDA context and NCCL buffers), every segment that is wholly free is released first
//   (empty_cache); if it still does not fit, the run would stop with an out-of-memory error: the
//   model counts it (ooms) and goes on.
// - every stream has pools of its own (Note [Allocation streams] in tensor/meta.h): a request
//   is served from its stream's blocks only, and a freed block returns to the stream it was
//   made on; so what one stream freed stays reserved while another grows.
// With expandable_segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torchtitan's
// default) each pool is one segment that grows at its end: a request no free block fits extends
// the segment (a free block at its end is reused and extended), and the segment maps memory in
// 2 MiB pages, so reserved is its end rounded up to 2 MiB.
// Allocated counts the blocks handed out (rounded sizes, splits that were not split included),
// as torch.cuda.memory_allocated does; reserved counts segments, as memory_reserved does. Both
// peaks are torch's max_memory_allocated and max_memory_reserved.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <spmd/tensor/meta.h>

namespace spmd {

struct AllocatorConfig {
  bool expandable_segments = false;
  int64_t capacity = 0;  // bytes the allocator may reserve; 0: no limit
};

class CachingAllocatorModel : public MetaAllocationListener {
 public:
  explicit CachingAllocatorModel(AllocatorConfig config = {});

  void allocated(uint64_t id, int64_t bytes, MetaStream stream) override;
  void freed(uint64_t id, int64_t bytes) override;
  // What was alive before the model listened: `bytes` in one segment of their own. A later free
  // of a storage the model never saw returns its bytes from there (they stay reserved and
  // reusable), as the real allocator would have kept them.
  void seed(int64_t bytes);

  struct Stats {
    int64_t allocated = 0;
    int64_t reserved = 0;
    int64_t peak_allocated = 0;
    int64_t peak_reserved = 0;
    int64_t segments = 0;  // now
    int64_t allocations = 0;
    int64_t ooms = 0;  // requests that did not fit under capacity even after releasing
    // Reserved per stream (by MetaStream), now and when reserved peaked.
    std::array<int64_t, kMetaStreams> stream_reserved{};
    std::array<int64_t, kMetaStreams> stream_reserved_at_peak{};
  };
  Stats stats() const { return stats_; }
  const AllocatorConfig& config() const { return config_; }

  // PyTorch's constants (Note [Allocator model]).
  static constexpr int64_t kMinBlock = 512;
  static constexpr int64_t kSmallSize = int64_t{1} << 20;
  static constexpr int64_t kSmallBuffer = int64_t{2} << 20;
  static constexpr int64_t kLargeBuffer = int64_t{20} << 20;
  static constexpr int64_t kMinLargeAlloc = int64_t{10} << 20;
  static constexpr int64_t kRoundLarge = int64_t{2} << 20;

 private:
  struct Block {
    int64_t size = 0;
    bool free = true;
  };
  struct Segment {
    int pool = 0;  // pool_of(stream, small)
    bool small = false;
    int64_t size = 0;                 // for an expandable segment, its end
    std::map<int64_t, Block> blocks;  // by offset
  };
  using FreeKey = std::tuple<int64_t, int64_t, int64_t>;  // size, segment, offset

  void add_free(int64_t seg, int64_t offset);
  void remove_free(int64_t seg, int64_t offset);
  // Takes `size` bytes from the free block at (seg, offset), splitting off the rest if the pool
  // splits it; returns the bytes handed out.
  int64_t take(int64_t seg, int64_t offset, int64_t size);
  // The pools: two per stream, [0] large and [1] small.
  static int pool_of(MetaStream stream, bool small) {
    return static_cast<int>(stream) * 2 + (small ? 1 : 0);
  }
  int64_t new_segment(int pool, int64_t size);
  void add_reserved(const Segment& s, int64_t bytes);
  void release_free_segments();
  int64_t segment_reserved(const Segment& s) const;
  void update_reserved();

  AllocatorConfig config_;
  std::map<int64_t, Segment> segments_;
  int64_t next_segment_ = 0;
  std::array<std::set<FreeKey>, 2 * kMetaStreams> free_;  // by pool_of
  std::array<int64_t, 2 * kMetaStreams> expandable_;      // a pool's expandable segment, or -1
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> live_;  // id -> segment, offset
  int64_t seed_segment_ = -1;  // seed(): its segment, its block at offset 0
  Stats stats_;
};

}  // namespace spmd
