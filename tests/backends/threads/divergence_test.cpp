// examples/divergence as users run it: under threads it must fail within 2 seconds with a report
// that names both buggy source lines; under sim it stops at the rank-dependent branch; with the
// bugs fixed both backends print the same digest.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

CommandResult divergence(const std::string& args) {
  return run_command(
      "env -u SPMD_BACKEND -u SPMD_WORLD_SIZE -u SPMD_TRACE -u SPMD_DEBUG -u SPMD_TOPOLOGY "
      "-u SPMD_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE " +
      std::string(SPMD_DIVERGENCE) + " " + args);
}

// "divergence.cpp:N" for the source line of examples/divergence.cpp that contains `marker`.
std::string line_of(const std::string& marker) {
  std::ifstream source(SPMD_DIVERGENCE_SOURCE);
  std::string line;
  for (int n = 1; std::getline(source, line); ++n) {
    if (line.find(marker) != std::string::npos) return "divergence.cpp:" + std::to_string(n);
  }
  ADD_FAILURE() << "no line with '" << marker << "' in " << SPMD_DIVERGENCE_SOURCE;
  return "?";
}

using testing::contains;

std::string digest_of(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex("digest: [0-9a-f]+")) ? m.str() : "";
}

TEST(Divergence, ThreadsReportsBothSourceLinesWithinTwoSeconds) {
  const std::string loss = line_of("// the loss all_reduce");
  const std::string gradient = line_of("// the gradient all_reduce");
  CommandResult r = divergence("--spmd-backend=threads");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 2.0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-7] CollectiveMismatchError: call #0 of group ranks "
                       "[0, 1, 2, 3, 4, 5, 6, 7] over mesh dim 'dp'"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: all_reduce over 'dp' [1] f32 op=avg at " + loss))
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 2: all_reduce over 'dp' [2] f32 op=avg at " + loss))
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 7: all_reduce over 'dp' [4, 8] f32 op=avg at " + gradient))
      << r.output;
  EXPECT_FALSE(contains(r.output, "digest:")) << r.output;
}

TEST(Divergence, SimStopsAtTheBranch) {
  CommandResult r = divergence("");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0-7] DivergenceError: PerRank comparison `!=`"))
      << r.output;
}

TEST(Divergence, FixedPrintsTheSameDigestUnderSimAndThreads) {
  CommandResult sim = divergence("--fixed");
  CommandResult threads = divergence("--fixed --spmd-backend=threads");
  EXPECT_EQ(sim.exit_code, 0) << sim.output;
  EXPECT_EQ(threads.exit_code, 0) << threads.output;
  EXPECT_NE(digest_of(sim.output), "") << sim.output;
  EXPECT_EQ(digest_of(sim.output), digest_of(threads.output)) << threads.output;
}

}  // namespace
}  // namespace spmd
