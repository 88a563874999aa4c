// SPMD_TEST and the test world (spmd/testing/spmd_test.h): the body gets the world of the run's
// backend (once per rank thread under threads), a rank's failure names the rank and leaves no peer
// waiting, and --spmd-list-tests says which tests are SPMD tests. The SpmdTestFailure tests fail on
// purpose (DISABLED_, run only by the process tests here and in mpi_test.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/ops.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/tensor/factory.h>
#include <spmd/testing.h>
#include "tests/support/run_command.h"
#include "tests/testing/capture.h"

namespace spmd {
namespace {

using testing::failures_of;

using testing::contains;

SPMD_TEST(SpmdTest, BodyGetsTheWorldOfTheBackend) {
  const LaunchOptions options = testing::test_options();
  EXPECT_EQ(world.backend_name(), options.backend);
  if (options.world_size) EXPECT_EQ(world.size(), *options.world_size);
  const size_t held = options.backend == "sim" ? static_cast<size_t>(world.size()) : 1u;
  EXPECT_EQ(world.held_ranks().size(), held);
  // The ranks meet in one all_reduce: the sum of the ranks, n(n-1)/2, on every held rank.
  const DeviceMesh mesh = init_device_mesh(world, {world.size()});
  const LocalTensor ranks = LocalTensor::from_fn(world, [](int rank) { return full({1}, rank); });
  const LocalTensor total = all_reduce(ranks, mesh, 0);
  for (int rank : world.held_ranks()) {
    EXPECT_EQ(total.shard(rank).item<float>(), world.size() * (world.size() - 1) / 2)
        << "rank " << rank;
  }
}

// Runs run_test_body under threads with `size` rank threads, then restores the options.
void under_threads(int size, const std::function<void(World&)>& body) {
  const LaunchOptions saved = testing::test_options();
  LaunchOptions threads = saved;
  threads.backend = "threads";
  threads.world_size = size;
  testing::set_test_options(threads);
  testing::run_test_body(body);
  testing::set_test_options(saved);
}

TEST(SpmdTest, UnderThreadsTheBodyRunsOncePerRankThread) {
  std::mutex mutex;
  std::vector<int> ranks;
  under_threads(3, [&](World& world) {
    EXPECT_EQ(world.size(), 3);
    EXPECT_EQ(world.backend_name(), "threads");
    std::lock_guard lock(mutex);
    ranks.push_back(world.held_ranks().front());
  });
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2}));
}

TEST(SpmdTest, UnderThreadsARankThatThrowsIsAFailureNamingItAndItsPeersAreNotLeftWaiting) {
  const std::string failures = failures_of([] {
    under_threads(3, [](World& world) {
      const DeviceMesh mesh = init_device_mesh(world, {3});
      if (world.held_ranks().front() == 1) throw CommError("rank 1 gives up");
      all_reduce(LocalTensor::from_fn(world, [](int) { return ones({2}); }), mesh, 0);
    });
  });
  EXPECT_TRUE(contains(failures, "[rank 1] CommError: rank 1 gives up")) << failures;
  EXPECT_TRUE(contains(failures, "[ranks 0,2] DeadlockError: ")) << failures;
}

TEST(SpmdTest, TestWorldUnderSimIsOnePerSize) {
  const LaunchOptions options = testing::test_options();
  if (options.backend != "sim" || options.world_size) {
    GTEST_SKIP() << "SPMD_WORLD_SIZE decides every size";
  }
  EXPECT_EQ(testing::test_world(3).size(), 3);
  EXPECT_EQ(testing::test_world(5).size(), 5);
  EXPECT_EQ(testing::test_world(3), testing::test_world(3));
  EXPECT_EQ(testing::test_world().size(), 8);
}

TEST(SpmdTest, TestWorldOutsideARankThreadIsAConfigErrorUnderThreads) {
  const LaunchOptions saved = testing::test_options();
  LaunchOptions threads = saved;
  threads.backend = "threads";
  testing::set_test_options(threads);
  testing::expect_throws<ConfigError>([] { testing::test_world(); }, {"rank threads"});
  testing::set_test_options(saved);
}

// ---- failing on purpose (run by the process tests below and by mpi_test.cpp) -------------------

// Rank 1 stops at a fatal assertion while its peers wait for it in an all_reduce.
SPMD_TEST(SpmdTestFailure, DISABLED_FatalOnOneRank) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()});
  for (int rank : world.held_ranks()) {
    if (world.held_ranks().size() == 1) ASSERT_NE(rank, 1) << "rank 1 stops here";
  }
  all_reduce(LocalTensor::from_fn(world, [](int) { return ones({2}); }), mesh, 0);
}

// A DTensor that differs from the expected full tensor in one element.
SPMD_TEST(SpmdTestFailure, DISABLED_DTensorsDiffer) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const Tensor want = arange(32).reshape({8, 4});
  const DTensor y =
      distribute_tensor(want, mesh, {Shard{0}}) * 2.0 - distribute_tensor(want, mesh, {Shard{0}});
  Tensor off = want.clone();
  off.narrow(0, 5, 1).narrow(1, 2, 1).fill_(22.5);
  EXPECT_DTENSOR_EQ(y, off);
}

// ---- the test program, run as a process
// ----------------------------------------------------------

std::string this_program() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : std::string();
}

TEST(SpmdTestProcess, ListsItsTestsAsSpmdOrGtestHonouringTheFilter) {
  const testing::CommandResult r =
      testing::run_command(this_program() + " --spmd-list-tests '--gtest_filter=SpmdTest.*'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "spmd SpmdTest.BodyGetsTheWorldOfTheBackend\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "gtest SpmdTest.UnderThreadsTheBodyRunsOncePerRankThread\n"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "DTensorEq")) << r.output;
  EXPECT_FALSE(contains(r.output, "DISABLED_")) << r.output;
  const testing::CommandResult negative = testing::run_command(
      this_program() + " --spmd-list-tests '--gtest_filter=SpmdTest*:DTensorEq.*-*Threads*:*Sim*'");
  EXPECT_TRUE(contains(negative.output, "spmd DTensorEq.EqualFullTensorsPass\n"))
      << negative.output;
  EXPECT_TRUE(contains(negative.output, "gtest SpmdTestProcess.")) << negative.output;
  EXPECT_FALSE(contains(negative.output, "Threads")) << negative.output;
  EXPECT_FALSE(contains(negative.output, "Sim")) << negative.output;
}

TEST(SpmdTestProcess, ABadSpmdFlagEndsTheRunWithCode2) {
  const testing::CommandResult r = testing::run_command(this_program() + " --spmd-world-size=0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ConfigError: ")) << r.output;
}

TEST(SpmdTestProcess, UnderThreadsAFatalFailureOnOneRankEndsItsPeersWaitWithADeadlockError) {
  const testing::CommandResult r = testing::run_command(
      "SPMD_BACKEND=threads SPMD_WORLD_SIZE=3 " + this_program() +
      " --gtest_also_run_disabled_tests --gtest_filter=SpmdTestFailure.DISABLED_FatalOnOneRank");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 stops here")) << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0,2] DeadlockError: ")) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
}

TEST(SpmdTestProcess, UnderThreadsADTensorDifferenceIsPrintedOnceInFull) {
  const testing::CommandResult r = testing::run_command(
      "SPMD_BACKEND=threads SPMD_WORLD_SIZE=4 " + this_program() +
      " --gtest_also_run_disabled_tests --gtest_filter=SpmdTestFailure.DISABLED_DTensorsDiffer");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Once in full (its second line names the ranks holding the element), three times referred to.
  auto count = [&](const std::string& part) {
    size_t n = 0;
    for (size_t at = r.output.find(part); at != std::string::npos;
         at = r.output.find(part, at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(count("is on rank 2"), 1u) << r.output;
  EXPECT_EQ(count("the same failure as rank"), 3u) << r.output;
  EXPECT_TRUE(contains(r.output, "index [5, 2] is on rank 2")) << r.output;
}

}  // namespace
}  // namespace spmd
