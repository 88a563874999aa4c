// spmdrun as a process: the ranks' environment, tagged output, exit codes, stopping every rank
// when one fails or a signal arrives, and usage errors.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

CommandResult spmdrun(const std::string& args) {
  return run_command(std::string(SPMD_SPMDRUN) + " " + args);
}

using testing::contains;

TEST(Spmdrun, EveryRankGetsItsEnvironment) {
  CommandResult r = spmdrun(
      "-n 3 --tag-output -- sh -c 'echo rank=$SPMD_RANK size=$SPMD_WORLD_SIZE "
      "local=$SPMD_LOCAL_RANK/$SPMD_LOCAL_WORLD_SIZE'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(r.output, "[" + std::to_string(rank) + "] rank=" + std::to_string(rank) +
                                       " size=3 local=" + std::to_string(rank) + "/3\n"))
        << r.output;
  }
}

TEST(Spmdrun, StaleLauncherVariablesAreReplaced) {
  CommandResult r = run_command("SPMD_RANK=7 SPMD_WORLD_SIZE=9 " + std::string(SPMD_SPMDRUN) +
                                " -n 1 sh -c 'echo $SPMD_RANK/$SPMD_WORLD_SIZE'");
  EXPECT_EQ(r.output, "0/1\n");
}

TEST(Spmdrun, EveryRankGetsTheLaunchsJobId) {
  // The flight recorder names its dumps by it (Note [Flight recorder]): one id per launch, the
  // same on every rank; one left behind by an outer launch is replaced.
  CommandResult r = run_command("SPMD_JOB_ID=stale " + std::string(SPMD_SPMDRUN) +
                                " -n 2 sh -c 'echo job=$SPMD_JOB_ID'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t first = r.output.find("job=spmdrun-");
  ASSERT_NE(first, std::string::npos) << r.output;
  const std::string line = r.output.substr(first, r.output.find('\n', first) - first);
  EXPECT_EQ(r.output, line + "\n" + line + "\n");
}

TEST(Spmdrun, TagOutputPrefixesEveryLineOfBothStreamsAndKeepsUnterminatedLines) {
  CommandResult r = spmdrun("-n 2 --tag-output sh -c 'printf \"a\\nb\\n\"; printf c >&2'");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* line : {"[0] a\n", "[0] b\n", "[0] c\n", "[1] a\n", "[1] b\n", "[1] c\n"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << " in " << r.output;
  }
}

TEST(Spmdrun, WithoutTagOutputTheRanksWriteDirectly) {
  CommandResult r = spmdrun("-n 2 sh -c 'echo hi'");
  EXPECT_EQ(r.output, "hi\nhi\n");
}

TEST(Spmdrun, AFailingRankStopsTheOthersAndSetsTheExitCode) {
  // Rank 1 fails at once; the others would sleep for a minute.
  CommandResult r =
      spmdrun("-n 4 -- sh -c 'if [ $SPMD_RANK = 1 ]; then exit 3; fi; exec sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "spmdrun: rank 1 exited with code 3; stopped the other ranks"))
      << r.output;
}

TEST(Spmdrun, ARankKilledByASignal) {
  CommandResult r = spmdrun(
      "-n 2 -- sh -c 'if [ $SPMD_RANK = 0 ]; then kill -9 $$; fi; exec "
      "sleep 60'");
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "rank 0 was killed by signal 9")) << r.output;
}

TEST(Spmdrun, SignalsAreForwardedToTheRanks) {
  // spmdrun gets SIGTERM after 0.5 s; the ranks, told by it, end their sleep at once.
  CommandResult r = run_command(std::string(SPMD_SPMDRUN) +
                                " -n 2 --tag-output -- sh -c 'trap \"echo got TERM; exit 0\" "
                                "TERM; sleep 60 & wait' & pid=$!; sleep 0.5; kill -TERM $pid; "
                                "wait $pid");
  EXPECT_EQ(r.exit_code, 128 + 15) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "[0] got TERM")) << r.output;
  EXPECT_TRUE(contains(r.output, "[1] got TERM")) << r.output;
}

TEST(Spmdrun, Timeout) {
  CommandResult r = spmdrun("-n 2 --timeout 0.3 -- sleep 60");
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "timed out after 0.3 s")) << r.output;
}

TEST(Spmdrun, AllRanksSucceed) {
  EXPECT_EQ(spmdrun("-n 5 true").exit_code, 0);
}

TEST(Spmdrun, ProgramThatCannotStart) {
  CommandResult r = spmdrun("-n 2 ./no_such_program_here");
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_TRUE(contains(r.output, "cannot start './no_such_program_here'")) << r.output;
}

TEST(Spmdrun, HelpAndUsageErrors) {
  CommandResult help = spmdrun("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.output, "usage: spmdrun -n N")) << help.output;
  CommandResult r = spmdrun("true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "-n N is required")) << r.output;
  EXPECT_EQ(spmdrun("-n 0 true").exit_code, 2);
  EXPECT_EQ(spmdrun("-n 2").exit_code, 2);
  EXPECT_EQ(spmdrun("-n 2 --bogus true").exit_code, 2);
}

}  // namespace
}  // namespace spmd
