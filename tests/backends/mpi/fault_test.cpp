// Fault drills under real mpirun jobs (label mpi; the program is tests/runtime/fault_drill.cpp):
// a rank stuck outside any collective ends the job after --spmd-timeout with every rank's report
// (the waiting ranks' TimeoutError and flight recorder, the stuck rank's state on SIGTERM); a rank
// that returns while the others wait is reported at once (Note [Exit notices]) with or without
// fingerprint mode, and only to the groups that need it; one that dies ends the job (mpirun) and
// the others say where they are.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
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
  // The waiting ranks' roll call (Note [Roll call]) finds rank 3 missing and the others waiting.
  EXPECT_TRUE(contains(r.output,
                       "s (--spmd-timeout=2) in the signature exchange: rank 3 has not made this "
                       "call: it did not answer a roll call within 1.0 s"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "; waiting in it when the roll call began: rank ")) << r.output;
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

// The seconds of the first "has waited S s" in `output`, or -1.
double waited_seconds(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("has waited ([0-9.]+) s"))) return -1.0;
  return std::stod(m[1].str());
}

TEST(MpiWatchdog, AStoppedRankIsNamedWithHowLongTheOthersWaited) {
  // Rank 3 stops itself (SIGSTOP) while the others wait in the barrier. Their roll call gets no
  // answer from it: the TimeoutError names it and the others' waits, within the timeout + 5 s.
  // mpirun then continues and terminates rank 3, which says it did not run for a while.
  const std::string dir = testing::fresh_temp_dir("spmd_fault_mpi_stop");
  CommandResult r =
      mpirun(4, "--spmd-timeout=2 --drill=stop --drill-rank=3", "SPMD_FLIGHT_RECORDER_DIR=" + dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "] TimeoutError: barrier over mesh dim 'all' (group ranks [0, 1, 2, 3]) at "
                       "fault_drill.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "in the signature exchange: rank 3 has not made this call: it did not "
                       "answer a roll call within 1.0 s (it is stopped, e.g. by SIGSTOP"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "waiting in it when the roll call began: rank ")) << r.output;
  EXPECT_TRUE(contains(r.output, " (this one) for ")) << r.output;
  const double waited = waited_seconds(r.output);
  EXPECT_GE(waited, 2.0) << r.output;
  EXPECT_LE(waited, 2.0 + 5.0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 3] terminated by SIGTERM while ")) << r.output;
  EXPECT_TRUE(contains(r.output, "this process did not run for ")) << r.output;
  // The dumps are named per job, in the directory given, and the report names them.
  EXPECT_TRUE(contains(r.output, "written to " + dir + "/spmd_flight_recorder.ompi")) << r.output;
  EXPECT_TRUE(contains(r.output, "every rank's dump of this job: spmd trace summary " + dir +
                                     "/spmd_flight_recorder.ompi"))
      << r.output;
}

TEST(MpiWatchdog, ARankWaitingElsewhereIsNamedWithItsWait) {
  // Rank 1 creates a new mesh dim's communicator (which takes every process) while the others
  // wait in the barrier: each side's roll call finds the other in its own wait.
  CommandResult r = mpirun(4, "--spmd-timeout=2 --drill=elsewhere --drill-rank=1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "in the signature exchange: rank 1 has not made this call: it is waiting "))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "s to create the communicator of mesh dim 'pair' (MPI_Comm_split, which "
                       "takes every process)"))
      << r.output;
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
