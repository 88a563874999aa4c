// spmd::testing under real mpirun jobs (label mpi): a rank that fails a fatal assertion ends the
// whole job instead of leaving its peers waiting in a collective, and a failing DTensor comparison
// fails on every rank, printed in full once (the other ranks' lines prefixed with their rank).
#include <gtest/gtest.h>

#include <string>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;

CommandResult mpirun(int n, const std::string& test) {
  return testing::run_mpirun(SPMD_MPIEXEC, n, SPMD_TESTING_TEST,
                             "--gtest_also_run_disabled_tests --gtest_filter=" + test,
                             "SPMD_BACKEND=mpi");
}

using testing::contains;

TEST(TestingMpi, AFatalFailureOnOneRankEndsTheJob) {
  // Rank 1 stops at an ASSERT while ranks 0 and 2 wait for it in an all_reduce.
  const CommandResult r = mpirun(3, "SpmdTestFailure.DISABLED_FatalOnOneRank");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] ")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 stops here")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[rank 1] SpmdTestFailure.DISABLED_FatalOnOneRank: a fatal assertion failed "
                       "on this rank; ending the job, so that no rank waits for this one in a "
                       "collective"))
      << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
}

TEST(TestingMpi, ADTensorDifferenceFailsOnEveryRankAndIsPrintedInFullOnce) {
  const CommandResult r = mpirun(4, "SpmdTestFailure.DISABLED_DTensorsDiffer");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "The full tensors of y and off differ at 1 of 32 elements; the "
                       "first is index [5, 2]:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "index [5, 2] is on rank 2")) << r.output;
  // In full once, by the lowest rank of the mesh; the other ranks refer to it.
  EXPECT_TRUE(contains(
      r.output, "[rank 3] the same failure as rank 0: the full tensors of y and off differ\n"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 3] [  FAILED  ] SpmdTestFailure.DISABLED_DTensorsDiffer"))
      << r.output;
}

}  // namespace
}  // namespace spmd
