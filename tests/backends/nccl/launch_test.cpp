// The nccl backend's launch as a process, on machines with or without a GPU: spmdrun hands every
// rank one NCCL unique id, the flags parse, the launch checks run in the order of Note [NCCL
// bootstrap], and without a GPU the launch ends with an error naming cudaGetDeviceCount's
// error (exit code 2, never a crash or a hang).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include <spmd/backends/nccl/unique_id.h>
#include <spmd/runtime/options.h>
#include <spmd/tensor/cuda/device.h>
#include "tests/support/run_command.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::expect_throws;
using testing::run_command;

using testing::contains;

// rank -> SPMD_NCCL_UNIQUE_ID as each rank of `spmdrun -n n` saw it.
std::map<int, std::string> ids_seen(int n, const std::string& env_prefix = "") {
  const CommandResult r = run_command(env_prefix + SPMD_SPMDRUN + " -n " + std::to_string(n) +
                                      " -- sh -c 'echo $SPMD_RANK $SPMD_NCCL_UNIQUE_ID'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::map<int, std::string> ids;
  std::istringstream lines(r.output);
  int rank = 0;
  std::string id;
  while (lines >> rank >> id) ids[rank] = id;
  return ids;
}

TEST(NcclLaunch, SpmdrunGivesEveryRankOneValidUniqueId) {
  const std::map<int, std::string> first = ids_seen(3);
  ASSERT_EQ(first.size(), 3u);
  for (const auto& [rank, id] : first) {
    EXPECT_EQ(id, first.at(0)) << "rank " << rank;
    EXPECT_TRUE(unique_id_from_hex(id).has_value()) << id;
  }
  // A new launch, a new id; a stale id in spmdrun's own environment is replaced.
  const std::map<int, std::string> second = ids_seen(2, "SPMD_NCCL_UNIQUE_ID=stale ");
  ASSERT_EQ(second.size(), 2u);
  EXPECT_NE(second.at(0), first.at(0));
  EXPECT_TRUE(unique_id_from_hex(second.at(1)).has_value()) << second.at(1);
}

TEST(NcclLaunch, FlagsAndVariables) {
  setenv("SPMD_NCCL_TIMEOUT", "12.5", 1);
  setenv("SPMD_GPUS_PER_PROCESS", "2", 1);
  LaunchOptions env = launch_options_from_env();
  EXPECT_EQ(env.timeout_s, 12.5);
  EXPECT_EQ(env.gpus_per_process, 2);
  unsetenv("SPMD_NCCL_TIMEOUT");
  unsetenv("SPMD_GPUS_PER_PROCESS");
  char arg0[] = "prog";
  char timeout[] = "--spmd-nccl-timeout=30";
  char gpus[] = "--spmd-gpus-per-process";
  char gpus_value[] = "4";
  char* argv[] = {arg0, timeout, gpus, gpus_value, nullptr};
  int argc = 4;
  LaunchOptions flags = parse_launch_options(argc, argv);
  EXPECT_EQ(argc, 1);
  EXPECT_EQ(flags.timeout_s, 30.0);
  EXPECT_EQ(flags.gpus_per_process, 4);
  EXPECT_FALSE(launch_options_from_env().timeout_s.has_value());
  for (const char* bad : {"0", "-1", "abc", "5s"}) {
    setenv("SPMD_NCCL_TIMEOUT", bad, 1);
    expect_throws<ConfigError>([] { launch_options_from_env(); },
                               {"SPMD_NCCL_TIMEOUT", "positive number of seconds"});
  }
  unsetenv("SPMD_NCCL_TIMEOUT");
  setenv("SPMD_GPUS_PER_PROCESS", "0", 1);
  expect_throws<ConfigError>([] { launch_options_from_env(); }, {"SPMD_GPUS_PER_PROCESS"});
  unsetenv("SPMD_GPUS_PER_PROCESS");
}

CommandResult probe(const std::string& args, const std::string& env = "") {
  return run_command(env + " " + SPMD_LAUNCH_PROBE + " " + args);
}

TEST(NcclLaunch, WorldSizeIsCheckedBeforeTheGpus) {
  CommandResult r = probe("--spmd-backend=nccl --spmd-world-size=3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output,
                       "ConfigError: --spmd-world-size=3 disagrees with the launch: 1 "
                       "process(es) (no launcher) with 1 GPU(s) each make 1 ranks"))
      << r.output;
  // spmdrun's SPMD_WORLD_SIZE counts processes; with two GPUs each the world has twice as many.
  r = probe("--spmd-backend=nccl --spmd-gpus-per-process=2 --spmd-world-size=3",
            "SPMD_RANK=0 SPMD_WORLD_SIZE=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "make 4 ranks")) << r.output;
}

TEST(NcclLaunch, WithoutAGpuTheLaunchFailsNamingCudasError) {
  const CudaDevices gpus = probe_cuda_devices();
  if (gpus.count > 0) GTEST_SKIP() << "this machine has a GPU";
  CommandResult r = probe("--spmd-backend=nccl");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "Unsupported: --spmd-backend=nccl needs a CUDA GPU, and process "
                       "0 has none: cudaGetDeviceCount"))
      << r.output;
  EXPECT_TRUE(contains(r.output, gpus.error)) << r.output;
  // Under spmdrun: the first rank to fail says so (spmdrun then stops the other, which may not
  // get to print), spmdrun passes the exit code on, nothing hangs.
  r = run_command(std::string(SPMD_SPMDRUN) + " -n 2 --tag-output -- " + SPMD_LAUNCH_PROBE +
                  " --spmd-backend=nccl");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "] Unsupported: --spmd-backend=nccl needs a CUDA GPU"))
      << r.output;
  EXPECT_LT(r.seconds, 30.0);
}

}  // namespace
}  // namespace spmd
