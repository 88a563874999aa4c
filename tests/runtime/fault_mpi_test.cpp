// Fault drills under real mpirun jobs (label mpi; the program is tests/runtime/fault_drill.cpp):
// a rank stuck outside any collective ends the job after --spmd-timeout with every rank's report
// (the waiting ranks' TimeoutError and flight recorder, the stuck rank's state on SIGTERM); a rank
// that returns while the others wait is reported at once (Note [Exit notices]) with or without
// fingerprint mode, and only to the groups that need it; one that dies ends the job (mpirun) and
// the others say where they are.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;

CommandResult mpirun(int n, const std::string& args, const std::string& env = "") {
  return testing::run_mpirun(SPMD_MPIEXEC, n, SPMD_FAULT_DRILL, "--spmd-backend=mpi " + args, env);
}

using testing::contains;

TEST(MpiWatchdog, ARankStuckOutsideAnyCollectiveEndsTheJobWithEveryRanksReport) {
  const std::string dir = testing::fresh_temp_dir("spmd_fault_mpi_watchdog");
  CommandResult r = mpirun(4, "--spmd-timeout=2 --drill=stall --drill-rank=3",
                           "SPMD_FLIGHT_RECORDER_FILE=" + dir + "/fr.json");
  EXPECT_NE(r.exit_code, 0) << r.output;
  // At least one waiting rank's watchdog reports and dumps; whichever is first ends the job.
  EXPECT_TRUE(contains(r.output,
                       "] TimeoutError: barrier over mesh dim 'all' (group ranks [0, 1, 2, 3]) at "
                       "fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "s (--spmd-timeout=2) in the signature exchange: a member of the group has "
                       "not made this call"))
      << r.output;
  EXPECT_TRUE(contains(r.output, " barrier 'all' group [0, 1, 2, 3] [0] f32 at fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "(pending)")) << r.output;
  // The stuck rank, stopped by mpirun, says where it is and dumps its own recorder.
  EXPECT_TRUE(contains(r.output,
                       "[rank 3] terminated by SIGTERM while running outside any collective (the "
                       "last one ended "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 3] flight recorder (terminated by SIGTERM): 1 collective"))
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/fr.rank3.json")) << r.output;
}

TEST(MpiFlightRecorder, DumpsAreNamedPerJobSoRunsDoNotOverwriteEachOther) {
  // Rank 1 throws a std::runtime_error (reported with its C++ type); it dumps its recorder, twice
  // over two runs, into two files.
  const std::string dir = testing::fresh_temp_dir("spmd_fault_mpi_jobs");
  for (int run = 0; run < 2; ++run) {
    CommandResult r = mpirun(2, "--spmd-timeout=120 --drill=throw --drill-rank=1",
                             "SPMD_FLIGHT_RECORDER_DIR=" + dir);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "[rank 1] std::runtime_error: drill: planted failure"))
        << r.output;
    EXPECT_TRUE(contains(r.output,
                         "[rank 1] flight recorder (std::runtime_error: drill: planted "
                         "failure): 1 collective record(s) of the last 1 written to " +
                             dir + "/spmd_flight_recorder.ompi"))
        << r.output;
  }
  int rank1_dumps = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name.starts_with("spmd_flight_recorder.ompi")) << name;
    if (name.find(".rank1.") != std::string::npos) ++rank1_dumps;
  }
  EXPECT_EQ(rank1_dumps, 2);
}

TEST(MpiWatchdog, ARankThatDiesEndsTheJobAndTheOthersSayWhereTheyAre) {
  // Rank 2 is killed (SIGKILL) while the others wait in the barrier: mpirun sees it die and
  // stops the others, each of which prints its state and flight recorder on the SIGTERM. The
  // timeout of 120 s cannot be what ends the job.
  CommandResult r = mpirun(4, "--spmd-timeout=120 --drill=die --drill-rank=2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "] terminated by SIGTERM while waiting ")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "s in barrier over mesh dim 'all' (group ranks [0, 1, 2, 3]) at "
                       "fault_drill.cpp:"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "TimeoutError")) << r.output;
}

TEST(MpiExitNotices, ARankThatReturnsIsReportedAtOnce) {
  // A timeout of 120 s: a report naming the returned rank can only come from its notice.
  for (const std::string mode : {"", " --spmd-debug=fingerprint"}) {
    CommandResult r = mpirun(4, "--spmd-timeout=120 --drill=return --drill-rank=3" + mode);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output,
                         "] DeadlockError: barrier over mesh dim 'all' (group ranks [0, 1, 2, 3]) "
                         "at fault_drill.cpp:"))
        << mode << r.output;
    EXPECT_TRUE(contains(r.output,
                         "can never complete: rank 3 returned from the program after 1 call(s) on "
                         "this communicator, without making this one (call #1); its last "
                         "collective: seq 0 all_reduce 'all' group [0, 1, 2, 3] [4] f32 op=sum at "
                         "fault_drill.cpp:"))
        << mode << r.output;
    EXPECT_FALSE(contains(r.output, "TimeoutError")) << mode << r.output;
  }
}

TEST(MpiExitNotices, ARankThatReturnsBeforeTheCommunicatorExists) {
  CommandResult r = mpirun(3, "--spmd-timeout=120 --drill=return-first --drill-rank=1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "] DeadlockError: creating the communicator of mesh dim 'all' "
                       "(MPI_Comm_split, which takes every process) can never complete: rank 1 "
                       "returned from the program after creating 0 communicator(s); it made no "
                       "collective call"))
      << r.output;
}

TEST(MpiExitNotices, ReturnedRanksDoNotFailGroupsWithoutThem) {
  // Ranks 2 and 3 return; ranks 0 and 1 go on in their own 'pair' group and end cleanly.
  CommandResult r = mpirun(4, "--spmd-timeout=120 --drill=return-pair --drill-rank=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "drill: pair done 2")) << r.output;
}

TEST(MpiExitNotices, ACleanRunIsUntouched) {
  CommandResult r = mpirun(4, "--spmd-timeout=5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "drill: done 6")) << r.output;
}

}  // namespace
}  // namespace spmd
