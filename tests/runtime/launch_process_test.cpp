// launch() as users meet it: the probe program (tests/runtime/launch_probe.cpp) run as a
// process, checking each bad launch's exit code and message, and the flags' effects.
#include <gtest/gtest.h>

#include <string>

#include <spmd/config.h>
#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

// The probe with a clean SPMD_*/launcher environment plus `env`.
CommandResult probe(const std::string& args, const std::string& env = "") {
  return run_command(
      "env -u SPMD_BACKEND -u SPMD_WORLD_SIZE -u SPMD_TRACE -u SPMD_DEBUG -u SPMD_TOPOLOGY -u "
      "SPMD_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS " +
      env + " " + SPMD_LAUNCH_PROBE + " " + args);
}

using testing::contains;

TEST(LaunchProcess, SimByDefaultWithEightRanksAndTheFlagsRemoved) {
  CommandResult r = probe("a --spmd-debug=nan b");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "probe: backend=sim size=8 held=8 coordinator=1 args=[a b]"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "digest: ")) << r.output;
}

TEST(LaunchProcess, WorldSizeFromFlagOrEnvironment) {
  EXPECT_TRUE(contains(probe("--spmd-world-size=3").output, "size=3 held=3"));
  EXPECT_TRUE(contains(probe("", "SPMD_WORLD_SIZE=5").output, "size=5 held=5"));
  EXPECT_TRUE(contains(probe("--spmd-world-size=2", "SPMD_WORLD_SIZE=5").output, "size=2 held=2"));
}

TEST(LaunchProcess, ProgramExitCodeIsReturned) {
  EXPECT_EQ(probe("--probe-exit=5").exit_code, 5);
}

TEST(LaunchProcess, UnknownBackend) {
  CommandResult r = probe("--spmd-backend=gloo");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "ConfigError: unknown backend 'gloo' (--spmd-backend=gloo); valid backends: sim, "
            "threads, mpi, nccl\n");
  r = probe("", "SPMD_BACKEND=gloo");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "unknown backend 'gloo' (SPMD_BACKEND=gloo)")) << r.output;
}

TEST(LaunchProcess, UnknownFlag) {
  CommandResult r = probe("--spmd-world=4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "ConfigError: unknown flag '--spmd-world=4'")) << r.output;
}

TEST(LaunchProcess, BackendThisBuildLacks) {
  CommandResult r = probe("--spmd-backend=nccl");
  EXPECT_EQ(r.exit_code, 2);
#if !SPMD_HAVE_NCCL
  EXPECT_EQ(r.output,
            "Unsupported: this build has no NCCL backend; configure with -DSPMD_WITH_NCCL=ON\n");
#endif
#if !SPMD_HAVE_MPI
  r = probe("--spmd-backend=mpi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "Unsupported: this build has no MPI backend; configure with -DSPMD_WITH_MPI=ON\n");
#endif
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(LaunchProcess, ThreadsRunsTheProgramOncePerRankThread) {
  CommandResult r = probe("a --spmd-backend=threads b");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "probe: backend=threads size=8 held=1 coordinator=1 args=[a b]"), 1)
      << r.output;
  EXPECT_EQ(count(r.output, "probe: backend=threads size=8 held=1 coordinator=0 args=[a b]"), 7)
      << r.output;
  EXPECT_EQ(count(r.output, "digest: "), 1) << r.output;
  // The same digest as sim's: the threads backend computes each group as sim does.
  const std::string sim = probe("").output;
  const size_t at = sim.find("digest: ");
  ASSERT_NE(at, std::string::npos) << sim;
  EXPECT_TRUE(contains(r.output, sim.substr(at, 24))) << r.output << sim;
  EXPECT_TRUE(
      contains(probe("--spmd-backend=threads --spmd-world-size=3").output, "size=3 held=1"));
}

TEST(LaunchProcess, ThreadsExitCodes) {
  EXPECT_EQ(probe("--spmd-backend=threads --probe-exit=5").exit_code, 5);
  CommandResult r = probe("--spmd-backend=threads --spmd-world-size=4 --probe-throw");
  EXPECT_EQ(r.exit_code, 1);
  // Every rank threw the same error: printed once, with all its ranks.
  EXPECT_EQ(count(r.output, "CommError"), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0-3] CommError: probe: failing on purpose")) << r.output;
}

TEST(LaunchProcess, ThreadsARankThrowsWhileTheOthersWait) {
  CommandResult r = probe("--spmd-backend=threads --spmd-world-size=4 --probe-fail-rank=2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 5.0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] CommError: probe: rank 2 fails on purpose")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0,1,3] DeadlockError: call #0 of group ranks [0, 1, 2, "
                       "3] over mesh dim 'all' can never complete: rank 2 has finished "
                       "(threw CommError) without making it"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: barrier over 'all' [0] f32 at launch_probe.cpp:"))
      << r.output;
  // The failing rank is reported first.
  EXPECT_LT(r.output.find("[rank 2]"), r.output.find("[ranks 0,1,3]")) << r.output;
}

TEST(LaunchProcess, ThreadsMismatchedCollectives) {
  CommandResult r = probe("--spmd-backend=threads --spmd-world-size=4 --probe-mismatch=shape");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-3] CollectiveMismatchError: call #0 of group ranks [0, "
                       "1, 2, 3] over mesh dim 'all': the ranks issued different "
                       "collectives (they differ in shape)"))
      << r.output;
  EXPECT_TRUE(
      contains(r.output, "rank 1: all_reduce over 'all' [5] f32 op=sum at launch_probe.cpp:"))
      << r.output;
  r = probe("--spmd-backend=threads --spmd-world-size=4 --probe-mismatch=kind");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "(they differ in op)")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "rank 1: all_gather over 'all' [4] f32 gather_dim=0 at "
                       "launch_probe.cpp:"))
      << r.output;
}

#if SPMD_HAVE_MPI
TEST(LaunchProcess, RealBackendWithoutALauncher) {
  CommandResult r = probe("--spmd-backend=mpi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "ConfigError: --spmd-backend=mpi needs a launcher: run it with mpirun -n N ...\n");
}

TEST(LaunchProcess, WorldSizeThatDisagreesWithTheLauncher) {
  // mpirun's variables without mpirun: the check comes before MPI starts.
  CommandResult r = probe("--spmd-backend=mpi --spmd-world-size=4",
                          "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "[rank 1] ConfigError: --spmd-world-size=4 disagrees with the launcher: mpirun "
            "started 2 processes (OMPI_COMM_WORLD_SIZE=2)\n");
}

TEST(LaunchProcess, MpiUnderSpmdrun) {
  CommandResult r = run_command(std::string(SPMD_SPMDRUN) +
                                " -n 2 --tag-output -- env -u "
                                "OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK " +
                                SPMD_LAUNCH_PROBE + " --spmd-backend=mpi");
  EXPECT_EQ(r.exit_code, 2);
  // Both ranks fail; spmdrun stops the other as soon as the first exits, so only the first
  // rank's message is sure to be printed, and either rank may be first.
  EXPECT_TRUE(contains(r.output, "] ConfigError: --spmd-backend=mpi cannot run under spmdrun"))
      << r.output;
}
#endif

TEST(LaunchProcess, AnUncaughtErrorIsPrintedWithItsRanks) {
  CommandResult r = probe("--spmd-world-size=4 --probe-throw");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "[ranks 0-3] CommError: probe: failing on purpose")) << r.output;
}

TEST(LaunchProcess, SimUnderSpmdrunTakesItsWorldSizeFromTheLauncher) {
  CommandResult r = run_command(std::string(SPMD_SPMDRUN) +
                                " -n 2 --tag-output -- env -u "
                                "SPMD_BACKEND " +
                                SPMD_LAUNCH_PROBE);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[0] probe: backend=sim size=2")) << r.output;
  EXPECT_TRUE(contains(r.output, "[1] probe: backend=sim size=2")) << r.output;
}

}  // namespace
}  // namespace spmd
