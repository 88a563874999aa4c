// The nccl backend's own behaviour, beyond the collectives conformance table: where tensors live
// (Note [NCCL device placement]), host shards in and out, mismatched calls as errors on every rank
// instead of a hang, DTensor programs on the GPU, and no device memory growth across calls. Runs
// with SPMD_BACKEND=nccl alone (1 rank) and under spmdrun -n 2; skipped without a GPU (the test
// main exits 77).
#include <gtest/gtest.h>

#include <spmd/spmd.h>

#include <spmd/tensor/cuda/device.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::test_world;

Tensor rank_tensor(int rank, int64_t n = 6) {
  return arange(n) + 100.0 * rank;
}

TEST(NcclBackend, EachRanksTensorsLiveOnItsGpu) {
  World world = test_world();
  ASSERT_EQ(world.backend_name(), "nccl");
  for (int r : world.held_ranks()) {
    const Device device = world.device_of(r);
    EXPECT_EQ(device.type, DeviceType::CUDA);
    EXPECT_EQ(world.backend().device_of(r), device);
  }
  const LocalTensor x = LocalTensor::from_fn(world, [](int r) { return rank_tensor(r); });
  const LocalTensor same = LocalTensor::replicate(world, ones({3}));
  for (int r : world.held_ranks()) {
    EXPECT_EQ(x.shard(r).device(), world.device_of(r));
    EXPECT_EQ(same.shard(r).device(), world.device_of(r));
  }
  // Shard-by-shard ops stay on the GPU.
  const LocalTensor y = x * 2.0 + 1.0;
  for (int r : world.held_ranks()) EXPECT_EQ(y.shard(r).device(), world.device_of(r));
}

TEST(NcclBackend, CollectivesReturnDeviceResults) {
  World world = test_world();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
  const LocalTensor x = LocalTensor::from_fn(world, [](int r) { return rank_tensor(r); });
  const LocalTensor sum = all_reduce(x, mesh, "all");
  const LocalTensor gathered = all_gather(x, mesh, "all");
  Tensor expected = zeros({6});
  for (int r = 0; r < world.size(); ++r) expected = expected + rank_tensor(r);
  for (int r : world.held_ranks()) {
    EXPECT_EQ(sum.shard(r).device(), world.device_of(r));
    EXPECT_TRUE(equal(sum.shard(r).to(cpu()), expected)) << sum.shard(r);
    EXPECT_EQ(gathered.shard(r).device(), world.device_of(r));
    EXPECT_EQ(gathered.shard(r).size(0), 6 * world.size());
  }
}

TEST(NcclBackend, HostShardsGoInAndComeBackOnTheHost) {
  World world = test_world();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
  // The rank-list form leaves shards on the host (Note [NCCL device placement]).
  const LocalTensor x =
      LocalTensor::from_fn(world.held_ranks(), [](int r) { return rank_tensor(r, 4); });
  const LocalTensor sum = all_reduce(x, mesh, "all", ReduceOp::Max);
  const LocalTensor from_zero = broadcast(x, mesh, "all", 0);
  for (int r : world.held_ranks()) {
    EXPECT_TRUE(sum.shard(r).device().is_cpu());
    EXPECT_TRUE(equal(sum.shard(r), rank_tensor(world.size() - 1, 4))) << sum.shard(r);
    EXPECT_TRUE(from_zero.shard(r).device().is_cpu());
    EXPECT_TRUE(equal(from_zero.shard(r), rank_tensor(0, 4)));
  }
}

TEST(NcclBackend, MismatchedCallsFailOnEveryRankAndLeaveTheBackendUsable) {
  World world = test_world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
  const LocalTensor x =
      LocalTensor::from_fn(world, [](int r) { return full({r == 1 ? 5 : 4}, r); });
  expect_throws<CommError>([&] { all_reduce(x, mesh, "all"); },
                           {"all_reduce", "inputs differ within the group", "[5]", "[4]"});
  const LocalTensor y = LocalTensor::from_fn(world, [](int r) { return full({4}, r); });
  expect_throws<CollectiveMismatchError>(
      [&] {
        if (world.holds(1)) {
          all_gather(y, mesh, "all");
        } else {
          all_reduce(y, mesh, "all");
        }
      },
      {"the ranks of the group issued different calls", "all_gather", "all_reduce"});
  const LocalTensor ok = all_reduce(y, mesh, "all");
  for (int r : world.held_ranks()) {
    EXPECT_EQ(ok.shard(r).to(cpu()).item<float>(), world.size() * (world.size() - 1) / 2.0f);
  }
}

TEST(NcclBackend, DTensorOpsRunOnTheGpu) {
  World world = test_world();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const Tensor w = randn({8, 4 * world.size()}, 1);
  const Tensor x = randn({5, 8}, 2);
  const DTensor dw = distribute_tensor(w, mesh, {Shard{1}});
  const DTensor dx = distribute_tensor(x, mesh, {Replicate{}});
  for (int r : world.held_ranks()) {
    EXPECT_EQ(dw.to_local().shard(r).device(), world.device_of(r));
  }
  const DTensor y = softmax(matmul(dx, dw), 1);
  const Tensor full = y.full_tensor();
  EXPECT_EQ(full.device().type, DeviceType::CUDA);
  EXPECT_TRUE(allclose(full.to(cpu()), softmax(matmul(x, w), 1), 1e-4, 1e-5))
      << max_abs_diff(full.to(cpu()), softmax(matmul(x, w), 1));
}

TEST(NcclBackend, RepeatedCollectivesDoNotGrowDeviceMemory) {
  World world = test_world();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
  const LocalTensor x = LocalTensor::from_fn(world, [](int r) { return rank_tensor(r, 1024); });
  all_reduce(x, mesh, "all");  // warm: communicator, caches
  const int device = world.device_of(world.held_ranks().front()).index;
  const std::size_t before = gpu::allocated_bytes(device);
  for (int i = 0; i < 50; ++i) {
    all_reduce(x, mesh, "all");
    reduce_scatter(x, mesh, "all");
    barrier(mesh);
  }
  EXPECT_EQ(gpu::allocated_bytes(device), before);
}

}  // namespace
}  // namespace spmd
