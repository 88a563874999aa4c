// Fault drills as processes (the program is tests/runtime/fault_drill.cpp): under threads a rank
// stuck outside any collective while the others wait is a TimeoutError with every rank's state;
// SIGINT and SIGTERM print where the run is (sim, threads) before it ends by the signal; spmdrun
// signals each rank's process group and leaves no child of a rank behind; a run out of memory is
// an OutOfMemoryError naming the op, the shape and the bytes (Note [Out of memory]). Each drill
// asserts the report and a non-zero exit; the ctest timeout is the bound on "it ends".
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;
using testing::run_command_signalled;

// The drill with a clean SPMD_*/launcher environment plus `env` ("VAR=value ...").
std::string drill_command(const std::string& args, const std::string& env = "") {
  return std::string(
             "env -u SPMD_BACKEND -u SPMD_WORLD_SIZE -u SPMD_TRACE -u SPMD_DEBUG -u SPMD_TIMEOUT "
             "-u SPMD_NCCL_TIMEOUT -u SPMD_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "
             "-u SLURM_PROCID -u SLURM_NTASKS ") +
         env + " " + SPMD_FAULT_DRILL + " " + args;
}

CommandResult drill(const std::string& args) {
  return run_command(drill_command(args));
}

using testing::contains;

// ---- threads: a rank that reaches no collective while the others wait ------------------------

TEST(ThreadsTimeout, ARankStuckOutsideAnyCollectiveIsReportedWithEveryRanksState) {
  CommandResult r = drill(
      "--spmd-backend=threads --spmd-world-size=4 --spmd-timeout=2 --drill=stall --drill-rank=3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-2] TimeoutError: barrier over 'all' [0] f32 at "
                       "fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "(call #1 of group ranks [0, 1, 2, 3]): rank ")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "s (--spmd-timeout=2) and the call still lacks rank 3 (running: it has not "
                       "reached this call)\nrank states:\n  rank 0: waits in barrier over 'all' "
                       "[0] f32 at fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "  rank 3: running; its last collective: all_reduce over 'all' [4] f32 "
                       "op=sum at fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[rank 3] still running when the run timed out; the process ends without "
                       "waiting for it"))
      << r.output;
}

TEST(ThreadsTimeout, ARankThatReturnsIsADeadlockAtOnceNotATimeout) {
  CommandResult r = drill(
      "--spmd-backend=threads --spmd-world-size=4 --spmd-timeout=100 --drill=return "
      "--drill-rank=2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0,1,3] DeadlockError: call #1 of group ranks [0, 1, 2, 3] over "
                       "mesh dim 'all' can never complete: rank 2 has finished (returned) without "
                       "making it"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "TimeoutError")) << r.output;
}

TEST(ForeignExceptions, AreReportedWithTheirCppType) {
  // Under sim the program runs once for every rank; under threads the others learn how rank 2
  // ended.
  CommandResult sim = drill("--spmd-world-size=4 --drill=throw --drill-rank=2");
  EXPECT_EQ(sim.exit_code, 1) << sim.output;
  EXPECT_TRUE(contains(sim.output, "[ranks 0-3] std::runtime_error: drill: planted failure"))
      << sim.output;
  CommandResult threads = drill(
      "--spmd-backend=threads --spmd-world-size=4 --spmd-timeout=100 --drill=throw "
      "--drill-rank=2");
  EXPECT_EQ(threads.exit_code, 1) << threads.output;
  EXPECT_TRUE(contains(threads.output, "[rank 2] std::runtime_error: drill: planted failure"))
      << threads.output;
  EXPECT_TRUE(contains(threads.output, "rank 2 has finished (threw std::runtime_error)"))
      << threads.output;
}

TEST(ThreadsTimeout, ACleanRunIsUntouchedByAShortTimeout) {
  CommandResult r = drill("--spmd-backend=threads --spmd-world-size=4 --spmd-timeout=0.5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "drill: done 6")) << r.output;
}

TEST(Timeout, BadValuesAreConfigErrorsNamingTheFlag) {
  CommandResult r = drill("--spmd-timeout=0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "ConfigError: --spmd-timeout=0: the timeout must be a positive number of seconds up to "
            "1000000000, got "
            "'0'\n");
  r = run_command(drill_command("", "SPMD_TIMEOUT=soon"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(
      r.output,
      "ConfigError: SPMD_TIMEOUT=soon: the timeout must be a positive number of seconds up to "
      "1000000000, "
      "got 'soon'\n");
}

// ---- out of memory: the op, the shape and the bytes ------------------------------------------

// The drill's 4 TiB request fails on any machine: an address-space limit makes sure of it where
// the kernel would grant it (overcommit), and under ASan the allocator returns null instead of
// aborting.
std::string oom_command(const std::string& args) {
#if defined(__SANITIZE_ADDRESS__)
  const std::string limit;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  const std::string limit;
#else
  const std::string limit = "ulimit -v 16777216; ";
#endif
#else
  const std::string limit = "ulimit -v 16777216; ";
#endif
  return limit + drill_command(args, "ASAN_OPTIONS=allocator_may_return_null=1");
}

TEST(OutOfMemory, AnOpThatCannotAllocateNamesTheOpTheShapeAndTheBytes) {
  for (const std::string backend : {"sim", "threads"}) {
    CommandResult r =
        run_command(oom_command("--spmd-backend=" + backend + " --spmd-world-size=4 --drill=oom"));
    EXPECT_EQ(r.exit_code, 1) << backend << r.output;
    EXPECT_TRUE(contains(r.output,
                         "OutOfMemoryError: add: out of memory allocating a [1048576, 1048576] "
                         "f32 tensor of 4398046511104 bytes (4 TiB) on cpu"))
        << backend << r.output;
    EXPECT_FALSE(contains(r.output, "bad_alloc")) << backend << r.output;
  }
}

// ---- signals: where the run is, then the conventional exit -----------------------------------

TEST(SignalReport, SigintUnderThreadsPrintsEveryRanksState) {
  // Rank 1 sleeps after the all_reduce while the others wait in the barrier (the timeout is the
  // default 300 s); Ctrl-C comes a second after every rank is ready.
  CommandResult r = run_command_signalled(
      drill_command("--spmd-backend=threads --spmd-world-size=4 --drill=stall --drill-rank=1"),
      "ready", 4, SIGINT, 1.0);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0-3] interrupted by SIGINT; rank states:\n  rank 0: "))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "  rank 1: running; its last collective: all_reduce over 'all' [4] f32 "
                       "op=sum at fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(
      contains(r.output, "  rank 2: waits in barrier over 'all' [0] f32 at fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "which lacks rank 1")) << r.output;
}

TEST(SignalReport, SigtermUnderThreads) {
  CommandResult r = run_command_signalled(
      drill_command("--spmd-backend=threads --spmd-world-size=2 --drill=stall --drill-rank=0"),
      "ready", 2, SIGTERM, 1.0);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0,1] terminated by SIGTERM; rank states:")) << r.output;
}

TEST(SignalReport, SigintUnderSimPrintsTheLastCollectives) {
  CommandResult r = run_command_signalled(
      drill_command("--spmd-world-size=4 --drill=stall --drill-rank=1"), "ready", 4, SIGINT, 1.0);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-3] interrupted by SIGINT outside any collective; the last 1 "
                       "collective(s), oldest first:\n  all_reduce over 'all' [4] f32 op=sum at "
                       "fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, " (completed)\n")) << r.output;
}

// ---- spmdrun: process groups ------------------------------------------------------------------

int read_pid(const std::string& path) {
  std::ifstream in(path);
  int pid = -1;
  in >> pid;
  return pid;
}

// The pid is gone within a few seconds (spmdrun has already returned: this only absorbs the
// kernel's reaping by init).
bool gone_soon(int pid) {
  for (int i = 0; i < 100 && testing::process_alive(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return !testing::process_alive(pid);
}

TEST(SpmdrunGroups, AFailingRanksChildrenAreStoppedWithTheJob) {
  // Each rank starts a background sleep it never waits for; rank 1 fails, which stops rank 0.
  const std::string dir = testing::fresh_temp_dir("spmd_fault_children");
  CommandResult r =
      run_command(std::string(SPMD_SPMDRUN) + " -n 2 -- sh -c 'sleep 1000 & echo $! > " + dir +
                  "/child.$SPMD_RANK; if [ $SPMD_RANK = 1 ]; then exit 3; fi; "
                  "wait'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const int pid = read_pid(dir + "/child." + std::to_string(rank));
    ASSERT_GT(pid, 0) << "rank " << rank << ": " << r.output;
    EXPECT_TRUE(gone_soon(pid)) << "rank " << rank << "'s child " << pid << " outlived the job";
  }
}

TEST(SpmdrunGroups, ChildrenLeftBehindByASuccessfulRunAreStopped) {
  const std::string dir = testing::fresh_temp_dir("spmd_fault_leftover");
  CommandResult r =
      run_command(std::string(SPMD_SPMDRUN) + " -n 2 -- sh -c 'sleep 1000 & echo $! > " + dir +
                  "/child.$SPMD_RANK'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const int pid = read_pid(dir + "/child." + std::to_string(rank));
    ASSERT_GT(pid, 0) << r.output;
    EXPECT_TRUE(gone_soon(pid)) << "rank " << rank << "'s child " << pid << " outlived the job";
  }
}

TEST(SpmdrunGroups, ASignalReachesEveryRanksGroup) {
  // SIGTERM to spmdrun's group, which holds spmdrun alone: it forwards the signal to each rank's
  // group, so the ranks and their children end.
  const std::string dir = testing::fresh_temp_dir("spmd_fault_forward");
  CommandResult r = run_command_signalled("exec " + std::string(SPMD_SPMDRUN) +
                                              " -n 2 -- sh -c 'sleep 1000 & echo $! > " + dir +
                                              "/child.$SPMD_RANK; echo ready; wait'",
                                          "ready", 2, SIGTERM, 0.2);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const int pid = read_pid(dir + "/child." + std::to_string(rank));
    ASSERT_GT(pid, 0) << r.output;
    EXPECT_TRUE(gone_soon(pid)) << "rank " << rank << "'s child " << pid << " outlived the job";
  }
}

TEST(SpmdrunGroups, ForwardedSignalsReachTheRanksReports) {
  // Under spmdrun each sim process simulates the launcher's world (2 ranks); both stall in
  // rank 0's sleep, and each prints where it is when spmdrun forwards Ctrl-C.
  CommandResult r = run_command_signalled("exec env -u SPMD_BACKEND -u SPMD_TIMEOUT " +
                                              std::string(SPMD_SPMDRUN) + " -n 2 --tag-output -- " +
                                              SPMD_FAULT_DRILL + " --drill=stall --drill-rank=0",
                                          "ready", 4, SIGINT, 1.0);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains(r.output, "[" + std::to_string(rank) +
                                       "] [ranks 0,1] interrupted by SIGINT outside any "
                                       "collective; the last 1 collective(s), oldest first:"))
        << r.output;
  }
}

}  // namespace
}  // namespace spmd
