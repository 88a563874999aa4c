// Tests for core/parallel.h: every index visited once, exceptions propagate, nesting is safe.
#include <spmd/core/parallel.h>

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace spmd {
namespace {

TEST(ParallelFor, VisitsEveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ParallelFor, RethrowsTheFirstException) {
  EXPECT_THROW(parallel_for(1000, 1,
                            [](int64_t begin, int64_t) {
                              if (begin == 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
}

TEST(ParallelFor, NestedCallsRunInline) {
  std::atomic<int64_t> total{0};
  parallel_for(100, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      parallel_for(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
    }
  });
  EXPECT_EQ(total.load(), 1000);
}

TEST(ParallelFor, ConcurrentCallersAllComplete) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        parallel_for(1000, 10, [&](int64_t b, int64_t e) { total += e - b; });
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

}  // namespace
}  // namespace spmd
