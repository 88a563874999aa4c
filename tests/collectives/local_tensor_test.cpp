// Tests for LocalTensor (sim/local_tensor.h) and its shard-by-shard ops (sim/local_ops.h).
#include <gtest/gtest.h>

#include <spmd/ops/ops.h>
#include <spmd/sim/local_ops.h>
#include <spmd/sim/local_tensor.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(LocalTensor, ReplicateStoresOneShard) {
  World world = World::sim(8);
  Tensor t = randn({64, 64}, 3);
  LocalTensor x = LocalTensor::replicate(world, t);
  EXPECT_TRUE(x.is_replicated());
  EXPECT_EQ(x.bytes_held(), t.nbytes());
  EXPECT_EQ(x.ranks().size(), 8u);
  EXPECT_TRUE(equal(x.reconcile(), t));
  // The replica is a copy: writing the source does not change it.
  t.fill_(0);
  EXPECT_FALSE(equal(x.shard(0), t));
}

TEST(LocalTensor, OpsApplyShardByShard) {
  World world = World::sim(4);
  LocalTensor a = randn_per_rank(world, {3, 5}, 10);
  LocalTensor b = randn_per_rank(world, {5, 2}, 20);
  LocalTensor y = relu(matmul(a, b) * 2.0 + 1.0);
  for (int r = 0; r < 4; ++r) {
    Tensor expected = relu(matmul(a.shard(r), b.shard(r)) * 2.0 + 1.0);
    EXPECT_TRUE(allclose(y.shard(r), expected)) << "rank " << r;
  }
  EXPECT_FALSE(y.is_replicated());
}

TEST(LocalTensor, ReplicatedOperandsComputeOnce) {
  World world = World::sim(8);
  LocalTensor a = LocalTensor::replicate(world, randn({16}, 1));
  LocalTensor b = LocalTensor::replicate(world, randn({16}, 2));
  LocalTensor c = exp(a) + b;
  EXPECT_TRUE(c.is_replicated());
  EXPECT_EQ(c.bytes_held(), 16 * sizeof(float));
  EXPECT_TRUE(allclose(c.shard(7), exp(a.shard(0)) + b.shard(0)));
}

TEST(LocalTensor, UnevenShapesArePerRank) {
  World world = World::sim(3);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return zeros({3 - r, 2}); });
  PerRank<Shape> shapes = x.shape();
  EXPECT_FALSE(shapes.is_uniform());
  EXPECT_EQ(shapes.at(2), (Shape{1, 2}));
  EXPECT_EQ(x.size(1), 2);  // uniform
  expect_throws<DivergenceError>([&] { (void)(x.size(0) == 3); });
}

TEST(LocalTensor, MapIsRankSpecific) {
  World world = World::sim(4);
  LocalTensor x = zeros(world, {2});
  LocalTensor y = x.map([](int r, const Tensor& t) { return t + static_cast<double>(r); });
  EXPECT_EQ(y.shard(3).to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST(LocalTensor, ReconcileNamesTheDivergence) {
  World world = World::sim(3);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    Tensor t = zeros({4});
    if (r == 2) t.narrow(0, 1, 1).fill_(7);
    return t;
  });
  expect_throws<DivergenceError>([&] { x.reconcile(); },
                                 {"rank 0 and rank 2", "flat index 1", "0 vs 7"});
}

TEST(LocalTensor, MutableShardCopiesOnWrite) {
  World world = World::sim(4);
  LocalTensor x = LocalTensor::replicate(world, ones({4}));
  x.mutable_shard(1).fill_(5);
  EXPECT_EQ(x.shard(1).to_vector<float>()[0], 5.0f);
  EXPECT_EQ(x.shard(0).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(x.bytes_held(), 2 * 4 * sizeof(float));
}

TEST(LocalTensor, ConstructionErrors) {
  expect_throws<Error>([] { LocalTensor({1, 0}, {zeros({1}), zeros({1})}); }, {"ascending"});
  expect_throws<Error>(
      [] {
        LocalTensor({0, 1}, {zeros({1}), zeros({1}, DType::I64)});
      },
      {"one dtype", "rank 1 has i64"});
  expect_throws<ShapeError>(
      [] {
        LocalTensor({0, 1}, {zeros({1}), zeros({1, 1})});
      },
      {"same number of dims"});
  expect_throws<Error>([] { LocalTensor(std::vector<int>{}, std::vector<Tensor>{}); },
                       {"at least one rank"});
  World world = World::sim(2);
  LocalTensor a = zeros(world, {2});
  LocalTensor b({0}, {zeros({2})});
  expect_throws<Error>([&] { a + b; }, {"different ranks"});
  expect_throws<Error>([&] { a.shard(5); }, {"rank 5 is not held"});
}

TEST(LocalTensor, PrintsOneLinePerRank) {
  World world = World::sim(2);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  std::string text = fmt::format("{}", x);
  EXPECT_NE(text.find("rank 0:"), std::string::npos);
  EXPECT_NE(text.find("rank 1:"), std::string::npos);
}

TEST(LocalTensor, PerRankPadding) {
  World world = World::sim(2);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return ones({2 - r}); });
  PerRank<int64_t> after({0, 1}, {0, 1});
  LocalTensor padded = pad(x, 0, 0, after);
  EXPECT_EQ(padded.shape(), Shape{2});
  EXPECT_EQ(padded.shard(1).to_vector<float>(), (std::vector<float>{1, 0}));
  EXPECT_EQ(unpad(padded, 0, 0, after).shard(1).shape(), Shape{1});
}

}  // namespace
}  // namespace spmd
