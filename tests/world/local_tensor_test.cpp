// Tests for LocalTensor (world/local_tensor.h) and its shard-by-shard ops (world/local_ops.h).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include <spmd/ops/ops.h>
#include <spmd/tensor/random.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/local_tensor.h>
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

namespace spmd {
namespace {

// ---- autograd through the members (issue: member views dropped gradients) ------------------

// One LocalTensor member and the Tensor method it mirrors (recorded by autograd on Tensors).
struct MemberCase {
  const char* name;
  std::function<LocalTensor(const LocalTensor&)> member;
  std::function<Tensor(const Tensor&)> method;
};

// Every LocalTensor member that has a free function. Each must be that free function: recorded by
// autograd, so `sum(h) + sum(member(h) * w)` gets the gradient the same program on each rank's
// Tensor gets (the free functions and the Tensor methods are recorded).
std::vector<MemberCase> member_cases() {
  return {
      {"narrow", [](const LocalTensor& h) { return h.narrow(0, 1, 2); },
       [](const Tensor& t) { return t.narrow(0, 1, 2); }},
      {"select", [](const LocalTensor& h) { return h.select(1, 2); },
       [](const Tensor& t) { return t.select(1, 2); }},
      {"transpose", [](const LocalTensor& h) { return h.transpose(0, 1); },
       [](const Tensor& t) { return t.transpose(0, 1); }},
      {"permute",
       [](const LocalTensor& h) {
         return h.permute({1, 0});
       },
       [](const Tensor& t) {
         return t.permute({1, 0});
       }},
      {"reshape",
       [](const LocalTensor& h) {
         return h.reshape({4, 3});
       },
       [](const Tensor& t) {
         return t.reshape({4, 3});
       }},
      {"unsqueeze", [](const LocalTensor& h) { return h.unsqueeze(1); },
       [](const Tensor& t) { return t.unsqueeze(1); }},
      {"squeeze", [](const LocalTensor& h) { return h.narrow(0, 0, 1).squeeze(0); },
       [](const Tensor& t) { return t.narrow(0, 0, 1).squeeze(0); }},
      {"expand",
       [](const LocalTensor& h) {
         return h.narrow(0, 0, 1).expand({5, 4});
       },
       [](const Tensor& t) {
         return t.narrow(0, 0, 1).expand({5, 4});
       }},
      {"contiguous", [](const LocalTensor& h) { return h.transpose(0, 1).contiguous(); },
       [](const Tensor& t) { return t.transpose(0, 1).contiguous(); }},
      {"clone", [](const LocalTensor& h) { return h.clone(); },
       [](const Tensor& t) { return t.clone(); }},
      {"to", [](const LocalTensor& h) { return h.to(DType::F32).to(DType::F64); },
       [](const Tensor& t) { return t.to(DType::F32).to(DType::F64); }},
  };
}

TEST(LocalTensorAutograd, EveryMemberIsRecordedLikeItsFreeFunction) {
  World world = World::sim(4);
  for (const MemberCase& c : member_cases()) {
    SCOPED_TRACE(c.name);
    LocalTensor h = LocalTensor::from_fn(world, [](int r) {
      return randn({3, 4}, 40 + static_cast<uint64_t>(r), DType::F64);
    });
    h.requires_grad_();
    const LocalTensor view = c.member(h);
    const Tensor w = randn(view.shard(0).shape(), 7, DType::F64);
    backward(sum(h) + sum(view * w));
    ASSERT_TRUE(h.grad().defined());
    for (int r : world.held_ranks()) {
      Tensor t = h.shard(r).detach();
      t.requires_grad_();
      backward(sum(t) + sum(c.method(t) * w));
      EXPECT_TRUE(allclose(h.grad().shard(r), t.grad(), 1e-12, 1e-12))
          << "rank " << r << ": " << h.grad().shard(r) << " vs " << t.grad();
    }
  }
  // The example: half the gradient was lost through the member view.
  LocalTensor h = LocalTensor::from_fn(world, [](int r) { return full({2, 3}, r, DType::F64); });
  h.requires_grad_();
  backward(sum(h) + sum(h.narrow(0, 0, 1)));
  const Tensor want = from_vector<double>({2, 2, 2, 1, 1, 1}, {2, 3});
  for (int r : world.held_ranks()) EXPECT_TRUE(equal(h.grad().shard(r), want)) << "rank " << r;
}

TEST(LocalTensorAutograd, ToItsOwnDeviceKeepsTheGradient) {
  World world = World::sim(2);
  LocalTensor h = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  // Same device: the same value, gradients kept.
  h.requires_grad_();
  EXPECT_TRUE(h.to(cpu()).requires_grad());
  Tensor t = ones({2});
  t.requires_grad_();
  EXPECT_TRUE(t.to(cpu()).requires_grad());
}

// Note [Uneven backward]: shards of different shapes per rank (as after an uneven
// all_to_all_single) differentiate under sim as each rank does on its own under threads and mpi.
TEST(LocalTensorAutograd, UnevenShardsDifferentiatePerRank) {
  World world = World::sim(4);
  const Tensor w_full = randn({3, 5}, 9, DType::F64);
  LocalTensor w = LocalTensor::replicate(world, w_full);
  w.requires_grad_();
  // Rank r holds r + 1 rows (rank 3: none would be an empty shard; keep it non-empty here).
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return randn({r + 1, 3}, 50 + static_cast<uint64_t>(r), DType::F64);
  });
  x.requires_grad_();
  const LocalTensor h = gelu(matmul(x, w) + 1.0);
  const LocalTensor loss = sum(mean(h * h, {1}) * 0.5);
  backward(loss);
  for (int r : world.held_ranks()) {
    Tensor xr = x.shard(r).detach();
    Tensor wr = w_full.clone();
    xr.requires_grad_();
    wr.requires_grad_();
    const Tensor hr = gelu(matmul(xr, wr) + 1.0);
    backward(sum(mean(hr * hr, {1}) * 0.5));
    EXPECT_TRUE(allclose(x.grad().shard(r), xr.grad(), 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(allclose(w.grad().shard(r), wr.grad(), 1e-12, 1e-12)) << "rank " << r;
  }
}

}  // namespace
}  // namespace spmd
