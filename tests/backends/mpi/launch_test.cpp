// launch() under real mpirun jobs (label mpi): one failing rank ends the whole job, collectives
// whose ranks disagree fail on every rank instead of hanging, a world size that disagrees with
// mpirun is refused, and --spmd-trace writes one file per rank.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;

CommandResult mpirun(int n, const std::string& args) {
  return testing::run_mpirun(SPMD_MPIEXEC, n, SPMD_LAUNCH_PROBE, "--spmd-backend=mpi " + args);
}

using testing::contains;

TEST(LaunchMpi, EveryProcessHoldsItsRank) {
  CommandResult r = mpirun(3, "x");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "probe: backend=mpi size=3 held=1 coordinator=1 args=[x]"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "probe: backend=mpi size=3 held=1 coordinator=0 args=[x]"))
      << r.output;
}

TEST(LaunchMpi, OneFailingRankEndsTheJob) {
  // Rank 2 throws while ranks 0, 1, 3 wait in a barrier that can never complete.
  CommandResult r = mpirun(4, "--probe-fail-rank=2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] CommError: probe: rank 2 fails on purpose")) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
}

TEST(LaunchMpi, ShapesThatDifferAcrossTheGroupFailOnEveryRank) {
  CommandResult r = mpirun(3, "--probe-mismatch=shape");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output,
               "CommError: all_reduce over mesh dim 'all' (group ranks [0, 1, 2]): inputs "
               "differ within the group: rank 0: [4] f32, rank 1: [5] f32, rank 2: [4] f32"))
      << r.output;
}

TEST(LaunchMpi, DifferentCollectivesFailOnEveryRank) {
  CommandResult r = mpirun(2, "--probe-mismatch=kind --spmd-debug=fingerprint");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "CollectiveMismatchError: ")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "rank 1: all_gather [4] f32 gather_dim=0 (call #0 at "
                       "launch_probe.cpp:"))
      << r.output;
}

TEST(LaunchMpi, WorldSizeThatDisagreesWithMpirun) {
  CommandResult r = mpirun(2, "--spmd-world-size=4");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[rank 0] ConfigError: --spmd-world-size=4 disagrees with the launcher: "
                       "mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2)"))
      << r.output;
}

TEST(LaunchMpi, TraceFilePerRank) {
  const std::string base = ::testing::TempDir() + "/launch_mpi_trace";
  for (int r = 0; r < 2; ++r) std::remove((base + ".rank" + std::to_string(r) + ".json").c_str());
  CommandResult r = mpirun(2, "--spmd-trace=" + base + ".json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(base + ".rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(in) << "rank " << rank;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"all_reduce\""), std::string::npos);
    EXPECT_NE(text.find("\"rank " + std::to_string(rank) + "\""), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace spmd
