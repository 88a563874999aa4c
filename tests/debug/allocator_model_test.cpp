// tests/debug/allocator_model_test.cpp: the caching allocator model (debug/allocator_model.h)
// against the closed forms of PyTorch's rules (Note [Allocator model]): rounding, pools and
// segment sizes, best fit and splitting, merging, expandable segments, the release before an
// out-of-memory error; and a random sequence against a brute-force replay of the same rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include <spmd/debug/allocator_model.h>
#include <spmd/spmd.h>

namespace spmd {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr MetaStream kCompute = MetaStream::compute;
constexpr MetaStream kReduceScatter = MetaStream::reduce_scatter;

TEST(AllocatorModel, RoundsRequestsAndSizesSegmentsByPool) {
  CachingAllocatorModel m;
  m.allocated(1, 100, kCompute);  // small pool: 512 B of a 2 MiB segment
  EXPECT_EQ(m.stats().allocated, 512);
  EXPECT_EQ(m.stats().reserved, 2 * kMiB);
  m.allocated(2, 1000, kCompute);  // the same segment: 1024 B
  EXPECT_EQ(m.stats().allocated, 512 + 1024);
  EXPECT_EQ(m.stats().reserved, 2 * kMiB);
  m.allocated(3, 3 * kMiB, kCompute);  // large, under 10 MiB: a 20 MiB segment
  EXPECT_EQ(m.stats().reserved, 22 * kMiB);
  m.allocated(4, 13 * kMiB + 1,
              kCompute);  // best fit: the 17 MiB rest of that segment, split again
  EXPECT_EQ(m.stats().reserved, 22 * kMiB);
  m.allocated(5, 13 * kMiB + 1, kCompute);  // nothing fits: 10 MiB or more, rounded up to 2 MiB
  EXPECT_EQ(m.stats().reserved, 22 * kMiB + 14 * kMiB);
  // 13 MiB + 1 rounds to 13 MiB + 512; the 14 MiB segment's rest (1 MiB - 512) is at most 1 MiB,
  // so it is not split off: the block handed out is the whole segment.
  EXPECT_EQ(m.stats().allocated, 512 + 1024 + 3 * kMiB + (13 * kMiB + 512) + 14 * kMiB);
  EXPECT_EQ(m.stats().segments, 3);
}

TEST(AllocatorModel, BestFitSplitsAndMerges) {
  CachingAllocatorModel m;
  m.allocated(1, 3 * kMiB, kCompute);  // a 20 MiB segment: [3 used | 17 free]
  m.allocated(2, 5 * kMiB, kCompute);  // best fit: the 17 MiB rest, split: [3 | 5 | 12 free]
  EXPECT_EQ(m.stats().reserved, 20 * kMiB);
  EXPECT_EQ(m.stats().allocated, 8 * kMiB);
  m.freed(1, 3 * kMiB);
  m.freed(2, 5 * kMiB);  // merges with both neighbours: one 20 MiB free block
  EXPECT_EQ(m.stats().allocated, 0);
  m.allocated(3, 19 * kMiB + kMiB / 2,
              kCompute);  // fits the merged block; the 0.5 MiB rest is not split
  EXPECT_EQ(m.stats().reserved, 20 * kMiB);
  EXPECT_EQ(m.stats().allocated, 20 * kMiB);
  EXPECT_EQ(m.stats().peak_allocated, 20 * kMiB);
  EXPECT_EQ(m.stats().peak_reserved, 20 * kMiB);
}

TEST(AllocatorModel, FragmentationAndExpandableSegments) {
  // Two 12 MiB tensors, the second freed, then a 14 MiB one: cached segments cannot serve it, an
  // expandable segment reuses the freed end.
  for (bool expandable : {false, true}) {
    CachingAllocatorModel m({.expandable_segments = expandable});
    m.allocated(1, 12 * kMiB, kCompute);
    m.allocated(2, 12 * kMiB, kCompute);
    m.freed(2, 12 * kMiB);
    m.allocated(3, 14 * kMiB, kCompute);
    EXPECT_EQ(m.stats().allocated, 26 * kMiB);
    EXPECT_EQ(m.stats().peak_reserved, expandable ? 26 * kMiB : 38 * kMiB) << expandable;
  }
  // An expandable segment maps 2 MiB pages: 3 MiB + 512 B reserves 4 MiB.
  CachingAllocatorModel m({.expandable_segments = true});
  m.allocated(1, 3 * kMiB + 1, kCompute);
  EXPECT_EQ(m.stats().reserved, 4 * kMiB);
}

// Note [Allocation streams]: a block freed on one stream serves only that stream. FSDP2's
// gradients, made on the reduce-scatter stream and freed by zero_grad, stay reserved while the
// next forward's activations grow the compute stream's pool.
TEST(AllocatorModel, StreamsKeepTheirOwnPools) {
  for (bool expandable : {false, true}) {
    CachingAllocatorModel m({.expandable_segments = expandable});
    m.allocated(1, 12 * kMiB, kReduceScatter);  // a gradient
    m.freed(1, 12 * kMiB);                      // zero_grad
    m.allocated(2, 12 * kMiB, kCompute);        // an activation of the same size: a new segment
    EXPECT_EQ(m.stats().reserved, 24 * kMiB) << expandable;
    EXPECT_EQ(m.stats().stream_reserved[0], 12 * kMiB) << expandable;
    EXPECT_EQ(m.stats().stream_reserved[1], 12 * kMiB) << expandable;
    EXPECT_EQ(m.stats().stream_reserved_at_peak[1], 12 * kMiB) << expandable;
    m.allocated(3, 12 * kMiB, kReduceScatter);  // the next step's gradient reuses its block
    EXPECT_EQ(m.stats().reserved, 24 * kMiB) << expandable;
    m.freed(2, 12 * kMiB);
    m.freed(3, 12 * kMiB);
    EXPECT_EQ(m.stats().allocated, 0);
    EXPECT_EQ(m.stats().peak_allocated, 24 * kMiB);
  }
  // The release before an out-of-memory error frees any stream's wholly free segments.
  CachingAllocatorModel m({.capacity = 30 * kMiB});
  m.allocated(1, 12 * kMiB, kReduceScatter);
  m.freed(1, 12 * kMiB);
  m.allocated(2, 20 * kMiB, kCompute);  // 32 > 30: the reduce-scatter stream's segment goes
  EXPECT_EQ(m.stats().reserved, 20 * kMiB);
  EXPECT_EQ(m.stats().stream_reserved[1], 0);
  EXPECT_EQ(m.stats().ooms, 0);
}

TEST(AllocatorModel, ReleasesFreeSegmentsBeforeRunningOutOfMemory) {
  CachingAllocatorModel m({.capacity = 30 * kMiB});
  m.allocated(1, 12 * kMiB, kCompute);
  m.freed(1, 12 * kMiB);                // its 12 MiB segment stays cached
  m.allocated(2, 14 * kMiB, kCompute);  // too large for it: a 14 MiB segment, 26 MiB reserved
  EXPECT_EQ(m.stats().reserved, 26 * kMiB);
  m.allocated(3, 18 * kMiB,
              kCompute);  // 44 > 30: the free 12 MiB segment goes first, 32 is still over
  EXPECT_EQ(m.stats().reserved, 32 * kMiB);
  EXPECT_EQ(m.stats().ooms, 1);  // a real run stops here
  m.freed(2, 14 * kMiB);
  m.allocated(4, 10 * kMiB, kCompute);  // fits the freed 14 MiB block: no new segment, no new error
  EXPECT_EQ(m.stats().reserved, 32 * kMiB);
  EXPECT_EQ(m.stats().ooms, 1);
}

// What was alive before the model listened is one seeded block; frees of those storages return
// bytes from it, which later requests reuse without reserving more.
TEST(AllocatorModel, SeedGivesBackWhatWasAliveBefore) {
  CachingAllocatorModel m;
  m.seed(30 * kMiB);
  EXPECT_EQ(m.stats().allocated, 30 * kMiB);
  EXPECT_EQ(m.stats().reserved, 30 * kMiB);
  m.freed(77, 12 * kMiB);  // never seen: carved off the seed
  EXPECT_EQ(m.stats().allocated, 18 * kMiB);
  m.allocated(1, 12 * kMiB, kCompute);  // fits the carved block
  EXPECT_EQ(m.stats().reserved, 30 * kMiB);
  m.freed(1, 12 * kMiB);
  m.freed(78, 18 * kMiB);  // the rest of the seed: one free 30 MiB block
  EXPECT_EQ(m.stats().allocated, 0);
  m.allocated(2, 30 * kMiB, kCompute);
  EXPECT_EQ(m.stats().reserved, 30 * kMiB);
}

// The same rules replayed by brute force: every block of every segment in a flat list, best fit
// by scanning all of them.
struct BruteForce {
  struct B {
    int64_t seg, offset, size;
    bool free;
  };
  std::vector<B> blocks;
  std::map<int64_t, std::pair<bool, MetaStream>> segment_pool;  // small, stream
  int64_t next_seg = 0, reserved = 0, allocated = 0, peak_reserved = 0;
  std::map<MetaStream, int64_t> stream_reserved;

  void alloc(uint64_t id, int64_t bytes, MetaStream stream) {
    const int64_t size = std::max<int64_t>(512, (bytes + 511) / 512 * 512);
    const bool small = size <= kMiB;
    int best = -1;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const B& b = blocks[i];
      if (!b.free || segment_pool[b.seg] != std::pair{small, stream} || b.size < size) continue;
      if (best < 0) {
        best = static_cast<int>(i);
        continue;
      }
      const B& c = blocks[static_cast<size_t>(best)];
      if (std::tie(b.size, b.seg, b.offset) < std::tie(c.size, c.seg, c.offset)) {
        best = static_cast<int>(i);
      }
    }
    if (best < 0) {
      const int64_t seg_size = small              ? 2 * kMiB
                               : size < 10 * kMiB ? 20 * kMiB
                                                  : (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
      segment_pool[next_seg] = {small, stream};
      blocks.push_back({next_seg++, 0, seg_size, true});
      reserved += seg_size;
      stream_reserved[stream] += seg_size;
      best = static_cast<int>(blocks.size()) - 1;
    }
    B b = blocks[static_cast<size_t>(best)];
    const int64_t rest = b.size - size;
    if (small ? rest >= 512 : rest > kMiB) {
      blocks.push_back({b.seg, b.offset + size, rest, true});
      b.size = size;
    }
    b.free = false;
    blocks[static_cast<size_t>(best)] = b;
    allocated += b.size;
    peak_reserved = std::max(peak_reserved, reserved);
    live_ids[id] = {b.seg, b.offset};
  }
  void free(uint64_t id) {
    const auto [seg, offset] = live_ids.at(id);
    live_ids.erase(id);
    for (B& b : blocks) {
      if (b.seg == seg && b.offset == offset) {
        b.free = true;
        allocated -= b.size;
      }
    }
    // Merge adjacent free blocks of each segment.
    std::sort(blocks.begin(), blocks.end(), [](const B& x, const B& y) {
      return std::tie(x.seg, x.offset) < std::tie(y.seg, y.offset);
    });
    std::vector<B> merged;
    for (const B& b : blocks) {
      if (!merged.empty() && merged.back().seg == b.seg && merged.back().free && b.free) {
        merged.back().size += b.size;
      } else {
        merged.push_back(b);
      }
    }
    blocks = merged;
  }
  std::map<uint64_t, std::pair<int64_t, int64_t>> live_ids;
};

TEST(AllocatorModel, AgreesWithABruteForceReplayOnRandomSequences) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    CachingAllocatorModel m;
    BruteForce ref;
    std::vector<std::pair<uint64_t, int64_t>> alive;
    uint64_t next_id = 1;
    for (int step = 0; step < 300; ++step) {
      const bool free_one = !alive.empty() && rng() % 5 < 2;
      if (free_one) {
        const size_t i = rng() % alive.size();
        m.freed(alive[i].first, alive[i].second);
        ref.free(alive[i].first);
        alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        // Sizes across both pools and both large-segment rules.
        const int64_t choices[] = {1,        700,      4096,      600 * 1024,   kMiB + 1,
                                   3 * kMiB, 9 * kMiB, 11 * kMiB, 25 * kMiB + 3};
        const int64_t bytes = choices[rng() % 9] + static_cast<int64_t>(rng() % 2048);
        // Each allocation on one of two streams, whose pools never share a block.
        const MetaStream stream = rng() % 3 == 0 ? kReduceScatter : kCompute;
        m.allocated(next_id, bytes, stream);
        ref.alloc(next_id, bytes, stream);
        alive.emplace_back(next_id++, bytes);
      }
      ASSERT_EQ(m.stats().allocated, ref.allocated) << "trial " << trial << " step " << step;
      ASSERT_EQ(m.stats().reserved, ref.reserved) << "trial " << trial << " step " << step;
      ASSERT_EQ(m.stats().stream_reserved[1], ref.stream_reserved[kReduceScatter])
          << "trial " << trial << " step " << step;
    }
    EXPECT_EQ(m.stats().peak_reserved, ref.peak_reserved);
  }
}

// Every meta storage reaches an installed listener, by id, in order; uncounted ones do not.
TEST(AllocatorModel, ListensToShapeOnlyStorages) {
  const MetaTensorsScope meta(true);
  CachingAllocatorModel m;
  MetaAllocationListener* previous = set_meta_allocation_listener(&m);
  const int64_t before = meta_live_bytes();
  {
    const Tensor a = zeros({1024, 1024}, DType::F32);  // 4 MiB: a 20 MiB segment
    EXPECT_EQ(m.stats().allocated, 4 * kMiB);
    EXPECT_EQ(m.stats().reserved, 20 * kMiB);
    Tensor b;
    {
      const MetaUncountedScope uncounted;
      b = zeros({1024, 1024}, DType::F32);
    }
    EXPECT_EQ(m.stats().allocated, 4 * kMiB);  // not counted
    EXPECT_EQ(meta_live_bytes(), before + 4 * kMiB);
    b = Tensor();  // nor is its free
    EXPECT_EQ(meta_live_bytes(), before + 4 * kMiB);
    EXPECT_EQ(m.stats().allocated, 4 * kMiB);
  }
  EXPECT_EQ(m.stats().allocated, 0);
  set_meta_allocation_listener(previous);
}

}  // namespace
}  // namespace spmd
