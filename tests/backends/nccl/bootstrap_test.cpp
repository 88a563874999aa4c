// Tests for the nccl backend's bootstrap (backends/nccl/bootstrap.h, unique_id.h) that need no
// GPU: ncclGetUniqueId works without one, and the rest is decisions and text.
#include <spmd/backends/nccl/bootstrap.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include <spmd/backends/nccl/unique_id.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(NcclUniqueId, HexRoundTripsEveryByte) {
  ncclUniqueId id{};
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id.internal[i] = static_cast<char>(i * 37 + 5);
  const std::string hex = unique_id_to_hex(id);
  ASSERT_EQ(hex.size(), 2u * NCCL_UNIQUE_ID_BYTES);
  EXPECT_EQ(hex.substr(0, 4), "052a");  // bytes 0x05 and 0x2a, two lowercase digits each
  const auto back = unique_id_from_hex(hex);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::memcmp(back->internal, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  ASSERT_TRUE(unique_id_from_hex(upper).has_value());
  EXPECT_EQ(std::memcmp(unique_id_from_hex(upper)->internal, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
}

TEST(NcclUniqueId, MalformedHexIsRejected) {
  const std::string good(2 * NCCL_UNIQUE_ID_BYTES, 'a');
  EXPECT_TRUE(unique_id_from_hex(good).has_value());
  EXPECT_FALSE(unique_id_from_hex(good.substr(1)).has_value());
  EXPECT_FALSE(unique_id_from_hex(good + "a").has_value());
  EXPECT_FALSE(unique_id_from_hex("").has_value());
  std::string bad = good;
  bad[100] = 'g';
  EXPECT_FALSE(unique_id_from_hex(bad).has_value());
}

TEST(NcclUniqueId, NcclMakesIdsWithoutAGpu) {
  ncclUniqueId a{};
  ncclUniqueId b{};
  ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
  EXPECT_NE(unique_id_to_hex(a), unique_id_to_hex(b));  // a fresh random magic each time
  const auto back = unique_id_from_hex(unique_id_to_hex(a));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::memcmp(back->internal, a.internal, NCCL_UNIQUE_ID_BYTES), 0);
}

TEST(NcclVersion, RuntimeVersionAndGuards) {
  const int version = nccl_runtime_version();
  EXPECT_GE(version, NCCL_VERSION(2, 9, 0));
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(23003), "2.30.3");
  EXPECT_EQ(nccl_version_string(2804), "2.8.4");
  EXPECT_EQ(nccl_version_string(NCCL_VERSION_CODE),
            fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  // ncclAlltoAll/Gather/Scatter: only with 2.28.3+ headers and library, never when forced off.
  const bool headers = NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3);
  EXPECT_EQ(use_native_alltoall_gather_scatter(NCCL_VERSION(2, 28, 3), false), headers);
  EXPECT_EQ(use_native_alltoall_gather_scatter(NCCL_VERSION(2, 30, 7), false), headers);
  EXPECT_FALSE(use_native_alltoall_gather_scatter(NCCL_VERSION(2, 28, 2), false));
  EXPECT_FALSE(use_native_alltoall_gather_scatter(NCCL_VERSION(2, 27, 7), false));
  EXPECT_FALSE(use_native_alltoall_gather_scatter(NCCL_VERSION(2, 30, 7), true));
}

TEST(NcclCommId, ParsesNcclsAddressForms) {
  auto parsed = parse_nccl_comm_id("127.0.0.1:29500");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_EQ(parsed->port, 29500);
  parsed = parse_nccl_comm_id("[::1]:1");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host, "::1");
  EXPECT_EQ(parsed->port, 1);
  parsed = parse_nccl_comm_id("[fe80::1%eth0]:65535");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host, "fe80::1%eth0");
  parsed = parse_nccl_comm_id("node-7.cluster:4000");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host, "node-7.cluster");
  EXPECT_EQ(parsed->port, 4000);
  for (const char* bad :
       {"", "127.0.0.1", "127.0.0.1:", ":29500", "host:0", "host:65536", "host:12a", "::1:29500",
        "[::1]29500", "[::1]", "[]:5", "a b:5", "host:123456"}) {
    EXPECT_FALSE(parse_nccl_comm_id(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(NcclUniqueId, SourceFollowsTheBootstrapOrder) {
  const std::string hex(256, '0');
  const std::string addr = "127.0.0.1:29500";
  // The launcher's id wins over everything, NCCL_COMM_ID over MPI, MPI over a local id.
  EXPECT_EQ(choose_unique_id_source(hex, addr, "mpirun", 4, true), UniqueIdSource::Launcher);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, addr, "mpirun", 4, true), UniqueIdSource::CommId);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, addr, "", 4, false), UniqueIdSource::CommId);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, std::nullopt, "mpirun", 4, true),
            UniqueIdSource::MpiBroadcast);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, std::nullopt, "srun", 4, true),
            UniqueIdSource::MpiBroadcast);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, std::nullopt, "", 1, false),
            UniqueIdSource::Local);
  EXPECT_EQ(choose_unique_id_source(std::nullopt, std::nullopt, "mpirun", 1, false),
            UniqueIdSource::Local);
  expect_throws<ConfigError>(
      [&] { choose_unique_id_source(std::nullopt, std::nullopt, "spmdrun", 2, true); },
      {"2 processes started by spmdrun", "SPMD_NCCL_UNIQUE_ID", "NCCL_COMM_ID"});
  expect_throws<ConfigError>(
      [&] { choose_unique_id_source(std::nullopt, std::nullopt, "mpirun", 4, false); },
      {"4 processes started by mpirun"});
  expect_throws<ConfigError>(
      [&] { choose_unique_id_source(std::nullopt, std::string("localhost"), "", 2, false); },
      {"NCCL_COMM_ID='localhost'"});
  EXPECT_EQ(unique_id_source_name(UniqueIdSource::Launcher), "SPMD_NCCL_UNIQUE_ID");
  EXPECT_EQ(unique_id_source_name(UniqueIdSource::CommId), "NCCL_COMM_ID");
}

TEST(NcclUniqueId, ObtainedFromTheLauncherVariable) {
  ncclUniqueId id{};
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id.internal[i] = static_cast<char>(255 - i);
  setenv(kUniqueIdVariable, unique_id_to_hex(id).c_str(), 1);
  const ncclUniqueId got = obtain_unique_id(UniqueIdSource::Launcher, 3);
  EXPECT_EQ(std::memcmp(got.internal, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
  setenv(kUniqueIdVariable, "abc", 1);
  expect_throws<ConfigError>([] { obtain_unique_id(UniqueIdSource::Launcher, 3); },
                             {"SPMD_NCCL_UNIQUE_ID", "256 hex digits", "got 3 characters"});
  unsetenv(kUniqueIdVariable);
  // NCCL_COMM_ID: every process computes the same id itself, with no listener.
  setenv("NCCL_COMM_ID", "127.0.0.1:29511", 1);
  const ncclUniqueId first = obtain_unique_id(UniqueIdSource::CommId, 0);
  const ncclUniqueId second = obtain_unique_id(UniqueIdSource::CommId, 1);
  unsetenv("NCCL_COMM_ID");
  EXPECT_EQ(std::memcmp(first.internal, second.internal, NCCL_UNIQUE_ID_BYTES), 0);
}

TEST(NcclDevices, OneGpuPerRankUnlessShared) {
  EXPECT_EQ(rank_devices(0, 1, 1, 1, false), std::vector<int>{0});
  EXPECT_EQ(rank_devices(3, 8, 1, 8, false), std::vector<int>{3});
  EXPECT_EQ(rank_devices(1, 2, 4, 8, false), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(rank_devices(0, 0, 1, 2, false), std::vector<int>{0});  // local size unknown
  // Sharing: every process on the one GPU.
  EXPECT_EQ(rank_devices(3, 4, 1, 1, true), std::vector<int>{0});
  EXPECT_EQ(rank_devices(3, 4, 1, 2, true), std::vector<int>{1});
  expect_throws<ConfigError>([] { rank_devices(0, 4, 1, 1, false); },
                             {"4 ranks on this host need 4 GPUs", "SPMD_NCCL_SHARE_GPU=1"});
  expect_throws<ConfigError>([] { rank_devices(0, 1, 2, 1, true); },
                             {"--spmd-gpus-per-process=2", "1 GPU(s)"});
}

TEST(NcclSharedGpu, RecipeChosenByVersion) {
  EXPECT_EQ(shared_gpu_env(NCCL_VERSION(2, 30, 3), 2),
            std::vector<std::string>{"NCCL_MULTI_RANK_GPU_ENABLE=1"});
  const std::vector<std::string> old = shared_gpu_env(NCCL_VERSION(2, 28, 9), 2);
  const std::set<std::string> entries(old.begin(), old.end());
  EXPECT_TRUE(entries.count("NCCL_HOSTID=spmdsim-process2"));
  EXPECT_TRUE(entries.count("NCCL_SOCKET_IFNAME=lo"));
  EXPECT_TRUE(entries.count("NCCL_NET=Socket"));
  EXPECT_TRUE(entries.count("NCCL_IB_DISABLE=1"));
  EXPECT_TRUE(entries.count("NCCL_NVLS_ENABLE=0"));
  EXPECT_TRUE(entries.count("NCCL_MNNVL_ENABLE=0"));
  // Distinct per process: NCCL then sees every process as its own host.
  EXPECT_NE(shared_gpu_env(NCCL_VERSION(2, 28, 9), 0), shared_gpu_env(NCCL_VERSION(2, 28, 9), 1));
}

TEST(NcclSharedGpu, ApplyKeepsTheUsersSettings) {
  for (const std::string& entry : shared_gpu_env(NCCL_VERSION(2, 28, 9), 5)) {
    unsetenv(entry.substr(0, entry.find('=')).c_str());
  }
  setenv("NCCL_SOCKET_IFNAME", "eth7", 1);
  const std::vector<std::string> applied = apply_shared_gpu_env(NCCL_VERSION(2, 28, 9), 5);
  EXPECT_EQ(applied.size(), 5u);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "eth7");
  EXPECT_STREQ(std::getenv("NCCL_HOSTID"), "spmdsim-process5");
  EXPECT_STREQ(std::getenv("NCCL_NET"), "Socket");
  for (const std::string& entry : shared_gpu_env(NCCL_VERSION(2, 28, 9), 5)) {
    unsetenv(entry.substr(0, entry.find('=')).c_str());
  }
}

}  // namespace
}  // namespace spmd
