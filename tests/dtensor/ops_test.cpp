// DTensor ops beyond the op table's conformance rows (tests/ops/conformance_test.cpp): the DTensor
// mean vectors of notes §1.6; sharding decisions for the textbook cases; reshape that must
// redistribute; the sharding cache, the observer hook, implicit replication and error messages.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include <spmd/dtensor/dispatch.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/tensor/meta.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::make_dtensor;
using testing::pieces_match;

// ---- notes §1.6: DTensor mean under LocalTensor -------------------------------------------

TEST(DTensorOps, MeanOfUnevenShardsIsReplicateAndExact) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor uneven = testing::int_valued({3, 4}, 1);
  DTensor m = mean(distribute_tensor(uneven, *mesh, {Shard{0}}));
  EXPECT_EQ(m.placements(), (Placements{Replicate{}}));
  EXPECT_TRUE(allclose(m.full_tensor(), mean(uneven), 1e-6, 1e-6));

  Tensor even = testing::int_valued({4, 4}, 2);
  DTensor e = mean(distribute_tensor(even, *mesh, {Shard{0}}));
  EXPECT_EQ(e.placements(), (Placements{Partial{ReduceOp::Avg}}));
  EXPECT_TRUE(allclose(e.full_tensor(), mean(even), 1e-6, 1e-6));
}

// ---- sharding decisions -------------------------------------------------------------------

TEST(DTensorOps, MatmulPicksTheCommunicationFreeStrategy) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 4});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor x = testing::int_valued({8, 16}, 1);
  Tensor w = testing::int_valued({16, 32}, 2);
  auto place = [&](const Tensor& t, Placements p) { return distribute_tensor(t, *mesh, p); };
  // S(0) @ R -> S(0); R @ S(1) -> S(1): the API.md example.
  DTensor y = matmul(place(x, {Shard{0}, Replicate{}}), place(w, {Replicate{}, Shard{1}}));
  EXPECT_EQ(y.placements(), (Placements{Shard{0}, Shard{1}}));
  EXPECT_TRUE(pieces_match(y, matmul(x, w)));
  // S(1) @ S(0) -> P(sum).
  DTensor z = matmul(place(x, {Shard{1}, Replicate{}}), place(w, {Shard{0}, Replicate{}}));
  EXPECT_EQ(z.placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_TRUE(pieces_match(z, matmul(x, w)));
  // A reduced sharded dim becomes Partial.
  DTensor s = sum(y, {1});
  EXPECT_EQ(s.placements(), (Placements{Shard{0}, Partial{}}));
  EXPECT_TRUE(pieces_match(s, sum(matmul(x, w), {1})));
  // Softmax over a sharded dim gathers it; other dims stay sharded.
  DTensor p = softmax(y, 1);
  EXPECT_EQ(p.placements(), (Placements{Shard{0}, Replicate{}}));
  // Linear Partial passes: P(sum) * R -> P(sum), P(sum) + P(sum) -> P(sum); relu does not.
  DTensor r = place(testing::int_valued({8, 32}, 3), {Replicate{}, Replicate{}});
  EXPECT_EQ((z * r).placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_EQ((z + z).placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_EQ(relu(z).placements(), (Placements{Replicate{}, Replicate{}}));
  EXPECT_EQ((z + 1.0).placements(), (Placements{Replicate{}, Replicate{}}));
}

TEST(DTensorOps, ReshapeRedistributesWhenShardsCannotHoldTheView) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {4});
  if (!mesh) GTEST_SKIP() << "world too small";
  // Even: rows of 4 on 4 ranks flatten into the torch.chunk pieces of 32: no communication.
  Tensor even = testing::int_valued({8, 4}, 1);
  DTensor a = reshape(distribute_tensor(even, *mesh, {Shard{0}}), {32});
  EXPECT_EQ(a.placements(), (Placements{Shard{0}}));
  EXPECT_TRUE(pieces_match(a, even.reshape({32})));
  // Uneven: 6 rows split 2,2,2,0 flatten to 8,8,8,0 elements, but S(0) of 24 is 6,6,6,6. The
  // pieces cannot be reused as they are (pytorch/pytorch#179502 passed this silently).
  Tensor uneven = testing::int_valued({6, 4}, 2);
  DTensor b = reshape(distribute_tensor(uneven, *mesh, {Shard{0}}), {24});
  EXPECT_EQ(b.placements(), (Placements{Replicate{}}));
  EXPECT_TRUE(pieces_match(b, uneven.reshape({24})));
  // Splitting a sharded dim keeps the shard on the outer part when it divides.
  DTensor c =
      reshape(distribute_tensor(testing::int_valued({8, 3}, 3), *mesh, {Shard{0}}), {4, 2, 3});
  EXPECT_EQ(c.placements(), (Placements{Shard{0}}));
  // A shard on an inner dim of a merged group cannot be kept.
  DTensor d = reshape(distribute_tensor(testing::int_valued({4, 8}, 4), *mesh, {Shard{1}}), {32});
  EXPECT_EQ(d.placements(), (Placements{Replicate{}}));
}

// ---- the sharding cache -------------------------------------------------------------------

TEST(ShardingCache, CountsHitsAndMisses) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  clear_sharding_cache();
  DTensor a = distribute_tensor(ones({4, 4}), *mesh, {Shard{0}});
  DTensor b = distribute_tensor(ones({4, 4}), *mesh, {Shard{0}});
  DTensor c = a + b;
  CacheStats s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 0);
  for (int i = 0; i < 3; ++i) c = c + b;  // c's spec equals a's: hits
  s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.size, 1);
  sum(c, {0});
  sum(c, {1});
  sum(c, {1});
  s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 3);  // static args are part of the key
  EXPECT_EQ(s.hits, 4);
}

// Note [Caches and worlds]: the caches keep a past world alive only until the next world is made.
TEST(ShardingCache, ANewWorldDropsThePastWorldsEntries) {
  std::weak_ptr<Backend> past;
  {
    World world = World::sim(4);
    past = world.backend_ptr();
    DeviceMesh mesh = init_device_mesh(world, {4});
    DTensor a = distribute_tensor(ones({8, 4}), mesh, {Shard{0}});
    DTensor b = (a + a).redistribute({Replicate{}});
    EXPECT_TRUE(allclose(b.full_tensor(), full({8, 4}, 2.0)));
  }
  // The world's handles are gone; the cache entries still hold its meshes.
  EXPECT_GE(sharding_cache_stats().size, 1);
  EXPECT_GE(redistribute_cache_stats().size, 1);
  EXPECT_FALSE(past.expired());
  const CacheStats before = sharding_cache_stats();
  World next = World::sim(4);
  EXPECT_EQ(sharding_cache_stats().size, 0);
  EXPECT_EQ(redistribute_cache_stats().size, 0);
  EXPECT_EQ(sharding_cache_stats().misses, before.misses);  // the counters stay
  EXPECT_TRUE(past.expired()) << "the past world is still alive";
  // The new world's ops fill the caches again.
  DeviceMesh mesh = init_device_mesh(next, {4});
  DTensor a = distribute_tensor(ones({8, 4}), mesh, {Shard{0}});
  EXPECT_TRUE(allclose((a + a).full_tensor(), full({8, 4}, 2.0)));
  EXPECT_EQ(sharding_cache_stats().size, 1);
}

// The same for a dry run, whose specs also share per-rank tables (spec.cpp's rank-info cache).
TEST(ShardingCache, ANewWorldFreesThePastWorldOfADryRun) {
  const MetaTensorsScope meta(true);
  std::weak_ptr<Backend> past;
  {
    World world = World::sim(64);
    past = world.backend_ptr();
    DeviceMesh mesh = init_device_mesh(world, {8, 8}, {"dp", "tp"});
    DTensor w = distribute_tensor(ones({64, 32}), mesh, {Replicate{}, Shard{1}});
    DTensor x = distribute_tensor(ones({16, 64}), mesh, {Shard{0}, Replicate{}});
    EXPECT_EQ(matmul(x, w).redistribute({Shard{0}, Replicate{}}).shape(), (Shape{16, 32}));
  }
  EXPECT_FALSE(past.expired());
  World next = World::sim(64);
  EXPECT_TRUE(past.expired()) << "the past world of the dry run is still alive";
}

// ---- the observer hook --------------------------------------------------------------------

TEST(OpHooks, ObserversSeeEveryOpAndCanRecomputeIt) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  std::vector<std::string> seen;
  int mismatches = 0;
  const int id = add_op_observer([&](const OpEvent& e) {
    seen.emplace_back(e.op);
    std::vector<Tensor> full;
    for (const DTensor* in : e.inputs) full.push_back(in->full_tensor());
    if (!allclose(e.output.full_tensor(), e.reference(full), 1e-5, 1e-5)) ++mismatches;
  });
  DTensor x = distribute_tensor(testing::int_valued({4, 6}, 1), *mesh, {Shard{0}, Replicate{}});
  DTensor w = distribute_tensor(testing::int_valued({6, 2}, 2), *mesh, {Replicate{}, Shard{1}});
  DTensor y = relu(matmul(x, w) * 2.0);
  y.redistribute({Replicate{}, Replicate{}});
  remove_op_observer(id);
  y = y + y;
  EXPECT_EQ(seen, (std::vector<std::string>{"matmul", "mul", "relu", "redistribute"}));
  EXPECT_EQ(mismatches, 0);
  EXPECT_FALSE(has_op_observers());
}

// ---- plain Tensors and errors -------------------------------------------------------------

TEST(DTensorOps, PlainTensorOperandNeedsImplicitReplication) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor g = testing::int_valued({4, 3}, 1);
  Tensor bias = testing::int_valued({3}, 2);
  DTensor x = distribute_tensor(g, *mesh, {Shard{0}});
  expect_throws<PlacementError>([&] { x + bias; },
                                {"add", "plain Tensor", "[3]", "S(0)", "[4, 3]", "DeviceMesh"});
  ImplicitReplication allow;
  DTensor y = x + bias;
  EXPECT_EQ(y.placements(), (Placements{Shard{0}}));
  EXPECT_TRUE(pieces_match(y, g + bias));
  EXPECT_TRUE(pieces_match(bias * x, bias * g));
}

TEST(DTensorOps, ErrorsNameOpMeshPlacementsAndShapes) {
  World world = testing::test_world(64);
  if (world.size() < 4) GTEST_SKIP() << "needs 4 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  DTensor a = distribute_tensor(zeros({4, 5}), mesh, {Shard{0}, Replicate{}});
  DTensor b = distribute_tensor(zeros({4, 5}), mesh, {Replicate{}, Shard{1}});
  expect_throws<ShapeError>([&] { matmul(a, b); },
                            {"matmul", "[4, 5]", "S(0),R", "R,S(1)", "dp=2"});
  DeviceMesh other = init_device_mesh(world, {4});
  DTensor c = distribute_tensor(zeros({4, 5}), other, {Shard{0}});
  expect_throws<PlacementError>([&] { a + c; }, {"add", "different meshes", "S(0),R", "S(0)"});
  expect_throws<ShapeError>([&] { sum(a, {2}); }, {"sum", "[4, 5]"});
  expect_throws<ShapeError>([&] { reshape(a, {3, 3}); }, {"reshape", "[3, 3]", "[4, 5]", "S(0),R"});
  expect_throws<PlacementError>([&] { a.redistribute({Shard{0}}); },
                                {"DTensor::redistribute", "1 placements", "2-d mesh", "[4, 5]"});
  expect_throws<PlacementError>(
      [&] {
        a.redistribute({Shard{3}, Replicate{}});
      },
      {"S(3)", "mesh dim 0 (dp)", "[4, 5]"});
  expect_throws<PlacementError>(
      [&] {
        distribute_tensor(zeros({4}), mesh, {Partial{ReduceOp::BAnd}, Replicate{}});
      },
      {"Partial(band)", "[4]"});
  expect_throws<ShapeError>(
      [&] {
        amax(distribute_tensor(zeros({0, 3}), mesh, {Replicate{}, Replicate{}}), {0});
      },
      {"amax", "[0, 3]"});
}

}  // namespace
}  // namespace spmd
