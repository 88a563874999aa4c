// Tests for tensor/shape.h and tensor/storage.h: shape arithmetic, broadcasting, dim
// normalisation, and the CPU caching allocator (alignment, reuse, bound, release, threads).
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include <spmd/tensor/shape.h>
#include <spmd/tensor/storage.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(Shape, NumelStridesAndPrinting) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({2, 0, 4}), 0);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({2, 0, 4}), (Strides{4, 4, 1}));
  EXPECT_EQ(contiguous_strides({}), Strides{});
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(shape_str({}), "[]");
}

TEST(Shape, UnravelIndexIsRowMajor) {
  // Every flat index of [2, 3, 4] maps back to itself through the strides.
  const Shape shape = {2, 3, 4};
  const Strides strides = contiguous_strides(shape);
  for (int64_t flat = 0; flat < shape_numel(shape); ++flat) {
    const std::vector<int64_t> index = unravel_index(flat, shape);
    ASSERT_EQ(index.size(), 3u);
    EXPECT_EQ(index[0] * strides[0] + index[1] * strides[1] + index[2] * strides[2], flat);
    for (size_t d = 0; d < 3; ++d) EXPECT_LT(index[d], shape[d]);
  }
  EXPECT_EQ(unravel_index(23, shape), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(unravel_index(0, {}), std::vector<int64_t>{});
  EXPECT_EQ(unravel_index(0, {3, 0}), (std::vector<int64_t>{0, 0}));
}

TEST(Shape, CheckedNumelRejectsNegativeAndOverflow) {
  EXPECT_EQ(checked_numel({3, 0, int64_t{1} << 62}, "zeros"), 0);
  expect_throws<ShapeError>(
      [] {
        checked_numel({2, -1}, "zeros");
      },
      {"zeros", "negative size -1", "[2, -1]"});
  expect_throws<ShapeError>(
      [] {
        checked_numel({int64_t{1} << 40, int64_t{1} << 40}, "empty");
      },
      {"empty", "too many elements"});
}

TEST(Shape, NormalizeDim) {
  EXPECT_EQ(normalize_dim(-1, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(0, 3, "op"), 0);
  EXPECT_EQ(normalize_dim(-3, 3, "op"), 0);
  expect_throws<ShapeError>(
      [] {
        normalize_dim(3, 3, "narrow", {2, 3, 4});
      },
      {"narrow", "dim 3", "[2, 3, 4]"});
  expect_throws<ShapeError>([] { normalize_dim(-4, 3, "sum", {2, 3, 4}); }, {"sum", "dim -4"});
  expect_throws<ShapeError>([] { normalize_dim(0, 0, "select", {}); }, {"select", "0-d"});
}

TEST(Shape, BroadcastShapes) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "add"), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5}, "add"), (Shape{5}));
  EXPECT_EQ(broadcast_shapes({0, 1}, {1, 3}, "add"), (Shape{0, 3}));
  EXPECT_EQ(broadcast_shapes({1}, {0}, "add"), (Shape{0}));
  expect_throws<ShapeError>(
      [] {
        broadcast_shapes({2, 3}, {4, 3}, "mul");
      },
      {"mul", "[2, 3]", "[4, 3]", "2 vs 4"});
  expect_throws<ShapeError>([] { broadcast_shapes({2}, {0}, "add"); }, {"add", "[2]", "[0]"});
}

TEST(Storage, CpuBuffersAreAlignedAndWritable) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{1} << 20,
                        (std::size_t{5} << 20) + 3}) {
    auto s = Storage::allocate(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s->data()) % 64, 0u) << n;
    EXPECT_EQ(s->nbytes(), n);
    EXPECT_TRUE(s->device().is_cpu());
    if (n > 0) {
      static_cast<char*>(s->data())[0] = 1;
      static_cast<char*>(s->data())[n - 1] = 2;
    }
  }
}

TEST(Storage, CachingAllocatorReusesLargeBlocksAndReleases) {
  cpu_allocator_release_cached();
  EXPECT_EQ(cpu_allocator_cached_bytes(), 0u);
  void* first;
  {
    auto s = Storage::allocate(std::size_t{8} << 20);
    first = s->data();
  }
  EXPECT_GE(cpu_allocator_cached_bytes(), std::size_t{8} << 20);
  {
    // Same size class (within a quarter of the next power of two): the cached block comes back.
    auto s = Storage::allocate((std::size_t{8} << 20) - 1000);
    EXPECT_EQ(s->data(), first);
    EXPECT_EQ(cpu_allocator_cached_bytes(), 0u);
  }
  {
    auto small = Storage::allocate(1000);  // small blocks are not cached
  }
  EXPECT_EQ(cpu_allocator_cached_bytes(), std::size_t{8} << 20);
  cpu_allocator_release_cached();
  EXPECT_EQ(cpu_allocator_cached_bytes(), 0u);
}

TEST(Storage, CacheStaysBounded) {
  cpu_allocator_release_cached();
  {
    std::vector<std::shared_ptr<Storage>> blocks;
    for (int i = 0; i < 12; ++i) blocks.push_back(Storage::allocate(std::size_t{128} << 20));
  }
  EXPECT_LE(cpu_allocator_cached_bytes(), std::size_t{1} << 30);
  EXPECT_GT(cpu_allocator_cached_bytes(), 0u);
  cpu_allocator_release_cached();
}

TEST(Storage, ConcurrentAllocationIsSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        auto s =
            Storage::allocate((std::size_t{1} << 18) * static_cast<std::size_t>(1 + (i + t) % 5));
        static_cast<char*>(s->data())[s->nbytes() - 1] = static_cast<char>(i);
      }
    });
  }
  for (auto& th : threads) th.join();
  cpu_allocator_release_cached();
  EXPECT_EQ(cpu_allocator_cached_bytes(), 0u);
}

TEST(Storage, DevicesWithoutAllocatorAreUnsupported) {
  EXPECT_EQ(device_str(cpu()), "cpu");
  EXPECT_EQ(device_str(cuda(1)), "cuda:1");
  EXPECT_EQ(fmt::format("{}", cuda(0)), "cuda:0");
  EXPECT_EQ(device_allocator(DeviceType::CUDA), nullptr);
  expect_throws<Unsupported>([] { Storage::allocate(16, cuda(0)); },
                             {"Storage::allocate", "cuda:0"});
  expect_throws<Unsupported>([] { register_device_allocator(DeviceType::CPU, nullptr); },
                             {"register_device_allocator"});
}

}  // namespace
}  // namespace spmd
