// The sim backend's own behaviour, beyond the results every backend shares (tests/collectives):
// a collective runs only the groups whose ranks the input holds, and results equal on every
// member are one buffer, copied only when a rank writes (Note [Copy-on-write replicas]).
#include <gtest/gtest.h>

#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(SimBackend, GroupsNotFullyHeldAreSkipped) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  // Ranks 0, 1 (a whole tp group) and 2 (half of the other one).
  LocalTensor x({0, 1, 2}, {full({2}, 1), full({2}, 2), full({2}, 3)});
  LocalTensor y = all_reduce(x, mesh, "tp");
  EXPECT_EQ(y.ranks(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(equal(y.shard(1), full({2}, 3)));
  expect_throws<CommError>(
      [&] {
        all_reduce(LocalTensor({0, 2}, {full({2}, 1), full({2}, 1)}), mesh, "tp");
      },
      {"no group of mesh dim 'tp' is fully held"});
}

TEST(SimBackend, ReplicatedResultsShareOneBuffer) {
  World world = World::sim(8);
  DeviceMesh mesh = init_device_mesh(world, {8});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({1024}, r); });
  LocalTensor y = all_reduce(x, mesh, 0);
  EXPECT_TRUE(y.is_replicated());
  EXPECT_EQ(y.bytes_held(), 1024 * sizeof(float));
  LocalTensor g = all_gather(x, mesh, 0);
  EXPECT_EQ(g.bytes_held(), 8 * 1024 * sizeof(float));
  // Writing one rank's shard copies it first: the others keep the shared value.
  y.mutable_shard(3).fill_(-1);
  EXPECT_EQ(y.shard(3).to_vector<float>()[0], -1.0f);
  EXPECT_EQ(y.shard(4).to_vector<float>()[0], 28.0f);
  EXPECT_FALSE(y.is_replicated());
  // A broadcast result aliases the source shard; writing the input afterwards is private too.
  LocalTensor b = broadcast(x, mesh, 0, 5);
  x.mutable_shard(5).fill_(100);
  EXPECT_EQ(b.shard(0).to_vector<float>()[0], 5.0f);
}

}  // namespace
}  // namespace spmd
