// Autograd on DTensors against backward passes written out by hand on the local shards with the
// collectives they need (the examples' step before they used backward()): tp_mlp's Megatron MLP
// and fsdp_tp_2d's FSDP x TP layer must give the same gradients, bit for bit, and issue the
// same collectives. Also the DTensor boundary: to_local/from_local with grad_placements, a
// Partial leaf's Replicate gradient, and local collectives that autograd refuses.
#include <gtest/gtest.h>

#include <cmath>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/world/local_ops.h>
#include "tests/support/collectives_since.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

using test_support::collectives_since;

SPMD_TEST(Autograd, MegatronMlpGradientsEqualTheHandWrittenBackward) {
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
  const Placements batch = {Shard{0}, Replicate{}};
  DTensor x = randn({16, 16}, mesh, batch, 1);
  const DTensor target = randn({16, 16}, mesh, batch, 2);
  DTensor w1 = randn({16, 32}, mesh, {Replicate{}, Shard{1}}, 3) * 0.25;
  DTensor w2 = randn({32, 16}, mesh, {Replicate{}, Shard{0}}, 4) * 0.18;
  const double numel = 16.0 * 16.0;

  // By hand: the local shards and the collectives the math needs.
  LocalTensor dw1_hand, dw2_hand, dx_hand;
  std::vector<std::string> hand_collectives;
  {
    const DTensor a = tanh(matmul(x, w1));
    const DTensor y = matmul(a, w2).redistribute(batch);
    const size_t start = trace().records().size();
    const LocalTensor dy = (y - target).to_local() * (2.0 / numel);
    const LocalTensor a_local = a.to_local();
    dw2_hand = all_reduce(matmul(a_local.transpose(0, 1), dy), mesh, "dp");
    const LocalTensor dh = matmul(dy, w2.to_local().transpose(0, 1)) * (1.0 - a_local * a_local);
    dw1_hand = all_reduce(matmul(x.to_local().transpose(0, 1), dh), mesh, "dp");
    dx_hand = all_reduce(matmul(dh, w1.to_local().transpose(0, 1)), mesh, "tp");
    hand_collectives = collectives_since(start, world.held_ranks()[0]);
  }

  x.requires_grad_();
  w1.requires_grad_();
  w2.requires_grad_();
  const DTensor y = matmul(tanh(matmul(x, w1)), w2).redistribute(batch);
  const DTensor diff = y - target;
  const DTensor loss = sum(diff * diff) / numel;
  const size_t start = trace().records().size();
  backward(loss);
  const std::vector<std::string> autograd_collectives =
      collectives_since(start, world.held_ranks()[0]);

  EXPECT_EQ(w1.grad().placements(), w1.placements());
  EXPECT_EQ(w2.grad().placements(), w2.placements());
  EXPECT_EQ(x.grad().placements(), x.placements());
  for (int r : world.held_ranks()) {
    EXPECT_TRUE(equal(w1.grad().local().shard(r), dw1_hand.shard(r))) << "dW1 on rank " << r;
    EXPECT_TRUE(equal(w2.grad().local().shard(r), dw2_hand.shard(r))) << "dW2 on rank " << r;
    EXPECT_TRUE(equal(x.grad().local().shard(r), dx_hand.shard(r))) << "dx on rank " << r;
  }
  // The same collectives. (Under threads the rank threads share one trace, whose records are not
  // in any one thread's order; sim and mpi compare.)
  if (world.backend_name() == "threads") return;
  std::vector<std::string> sorted_hand = hand_collectives;
  std::vector<std::string> sorted_auto = autograd_collectives;
  std::sort(sorted_hand.begin(), sorted_hand.end());
  std::sort(sorted_auto.begin(), sorted_auto.end());
  EXPECT_EQ(sorted_auto, sorted_hand) << fmt::format("{}", autograd_collectives);
}

SPMD_TEST(Autograd, FsdpGradientsAreTheReduceScatterOfTheHandWrittenOnes) {
  if (world.size() % 4 != 0) GTEST_SKIP() << "needs a world divisible by 4";
  const DeviceMesh root = init_device_mesh(world, {world.size() / 4, 2, 2}, {"pp", "dp", "tp"});
  const DeviceMesh mesh = concatenate({root["dp"], root["tp"]});
  const Placements batch = {Shard{0}, Replicate{}};
  const DTensor x = randn({8, 8}, mesh, batch, 11);
  const DTensor target = randn({8, 8}, mesh, batch, 12);
  DTensor w1 = randn({8, 16}, mesh, {Shard{0}, Shard{1}}, 13) * 0.35;
  DTensor w2 = randn({16, 8}, mesh, {Shard{1}, Shard{0}}, 14) * 0.25;
  const double numel = 64.0;

  LocalTensor dw1_hand, dw2_hand;
  {
    const LocalTensor w1_block = all_gather(w1.to_local(), mesh, "dp", 0);
    const LocalTensor w2_block = all_gather(w2.to_local(), mesh, "dp", 1);
    const LocalTensor xs = x.to_local();
    const LocalTensor a = tanh(matmul(xs, w1_block));
    const LocalTensor y = all_reduce(matmul(a, w2_block), mesh, "tp");
    const LocalTensor dy = (y - target.to_local()) * (2.0 / numel);
    const LocalTensor dh = matmul(dy, w2_block.transpose(0, 1)) * (1.0 - a * a);
    dw1_hand = reduce_scatter(matmul(xs.transpose(0, 1), dh), mesh, "dp", ReduceOp::Sum, 0);
    dw2_hand = reduce_scatter(matmul(a.transpose(0, 1), dy), mesh, "dp", ReduceOp::Sum, 1);
  }

  w1.requires_grad_();
  w2.requires_grad_();
  const DTensor a = tanh(matmul(x, w1.redistribute({Replicate{}, Shard{1}})));
  const DTensor y = matmul(a, w2.redistribute({Replicate{}, Shard{0}})).redistribute(batch);
  const DTensor diff = y - target;
  backward(sum(diff * diff) / numel);
  for (int r : world.held_ranks()) {
    EXPECT_TRUE(equal(w1.grad().local().shard(r), dw1_hand.shard(r))) << "dW1 on rank " << r;
    EXPECT_TRUE(equal(w2.grad().local().shard(r), dw2_hand.shard(r))) << "dW2 on rank " << r;
  }
}

// to_local/from_local with grad_placements. Local code where each rank computes its own
// contribution from a replicated weight: the weight's gradient is the sum of the ranks' local
// gradients, so to_local must say the gradient is Partial (torchtitan#2416, pytorch#175867).
SPMD_TEST(Autograd, ToLocalGradPlacementsSayWhatTheGradientIs) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const double n = world.size();
  const auto factor =
      LocalTensor::from_fn(world, [](int r) { return full({4}, r + 1.0, DType::F64); });
  // out = sum over ranks of (r + 1) w: a Partial(sum); d sum(out) / dw = n (n + 1) / 2.
  DTensor w = distribute_tensor(arange(4, DType::F64) + 1.0, mesh, {Replicate{}});
  w.requires_grad_();
  const DTensor out =
      DTensor::from_local(w.to_local(Placements{Partial{}}) * factor, mesh, {Partial{}}, Shape{4});
  backward(sum(out));
  EXPECT_EQ(w.grad().placements(), Placements{Replicate{}});
  EXPECT_TRUE(allclose(w.grad().full_tensor(), full({4}, n * (n + 1) / 2, DType::F64)))
      << w.grad().full_tensor();

  // Without grad_placements the local gradients would be taken as Replicate: each rank would keep
  // only its own (r + 1), and the "replicated" gradient would differ between ranks (pytorch#2387's
  // class). The claim makes the piece I (its gradient arrives reduced), which meets a value that
  // differs per rank: a TypeError at that line, naming the to_local line that made the claim.
  DTensor v = distribute_tensor(arange(4, DType::F64) + 1.0, mesh, {Replicate{}});
  v.requires_grad_();
  const int claim_line = __LINE__ + 1;
  const LocalTensor piece = v.to_local();
  expect_throws<TypeError>(
      [&] { (void)(piece * factor); },
      {"mul", fmt::format("to_local at autograd_test.cpp:{} claims", claim_line),
       "grad_placements with Partial on 'tp'"});
}

// A local collective's gradient depends on what the values mean: typed LocalTensors (every one made
// over a World, or by to_local) have it without any flag; an untyped one (made from a rank list)
// does not, and backward through its collective is an error naming the call.
SPMD_TEST(Autograd, LocalCollectivesAreDifferentiableWhenTyped) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r + 1.0); });
  x.requires_grad_();
  backward(sum(all_reduce(x * 2.0, mesh, "tp")));
  // V -> I: the identity backward; d/dx of 2x is 2 on every rank.
  for (int r : world.held_ranks()) EXPECT_TRUE(equal(x.grad().shard(r), full({2}, 2.0)));

  LocalTensor u =
      LocalTensor::from_fn(world.held_ranks(), [](int r) { return full({2}, r + 1.0); });
  u.requires_grad_();
  const LocalTensor y = all_reduce(u * 2.0, mesh, "tp");
  expect_throws<Unsupported>(
      [&] { backward(sum(y)); },
      {"all_reduce", "LocalTensor", "not differentiable", "untyped", "LocalTensor::from_fn(world"});
}

// Note [Ranks outside the mesh]: a DTensor on a mesh of ranks 0 and 1 only. Every rank runs the
// same program (as PyTorch lets it); the ranks outside hold empty pieces and compute nothing, the
// ranks inside get the one-device values; under sim the process holds both kinds of rank.
// Note [Gradient hooks]: a leaf's hooks see each gradient before it accumulates, in registration
// order, and what they return accumulates; set_grad replaces the accumulated gradient. On Tensor,
// LocalTensor and DTensor leaves alike.
SPMD_TEST(Autograd, GradientHooksAndSetGrad) {
  // Tensor: two hooks, applied in order (x 2, then + 1), once per backward.
  Tensor w = randn({3}, 1, DType::F64).requires_grad_();
  int calls = 0;
  register_hook<Tensor>(w, [&](const Tensor& g) {
    ++calls;
    return g * 2.0;
  });
  register_hook<Tensor>(w, [](const Tensor& g) { return g + 1.0; });
  backward(sum(w * 3.0));
  backward(sum(w * 3.0));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(allclose(w.grad(), full({3}, 14.0, DType::F64)));  // (3 * 2 + 1) twice
  set_grad(w, full({3}, -1.0, DType::F64));
  EXPECT_TRUE(allclose(w.grad(), full({3}, -1.0, DType::F64)));
  expect_throws<ShapeError>([&] { set_grad(w, zeros({4}, DType::F64)); },
                            {"set_grad", "[4] f64", "[3] f64"});
  Tensor y = w * 2.0;
  expect_throws<ConfigError>([&] { register_hook<Tensor>(y, [](const Tensor& g) { return g; }); },
                             {"register_hook", "not a leaf that requires grad"});
  Tensor v = randn({2}, 2, DType::F64).requires_grad_();
  register_hook<Tensor>(v, [](const Tensor&) { return zeros({5}, DType::F64); });
  expect_throws<ShapeError>([&] { backward(sum(v)); }, {"register_hook", "hook's result", "[5]"});

  // DTensor: the hook sees the gradient as autograd computed it; set_grad's gradient is
  // redistributed to the leaf's placements.
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  DTensor p = distribute_tensor(randn({8, 4}, 3, DType::F64), mesh, {Replicate{}});
  p.requires_grad_();
  std::vector<double> norms;
  register_hook<DTensor>(p, [&](const DTensor& g) {
    norms.push_back(std::sqrt(sum(g * g).full_tensor().item<double>()));
    return g * 0.5;
  });
  const DTensor x = distribute_tensor(randn({16, 8}, 4, DType::F64), mesh, {Shard{0}});
  backward(sum(matmul(x, p)));
  Tensor fp = randn({8, 4}, 3, DType::F64).requires_grad_();
  backward(sum(matmul(randn({16, 8}, 4, DType::F64), fp)));
  ASSERT_EQ(norms.size(), 1u);
  EXPECT_NEAR(norms[0], std::sqrt(sum(fp.grad() * fp.grad()).item<double>()), 1e-10);
  EXPECT_TRUE(allclose(p.grad().full_tensor(), fp.grad() * 0.5, 1e-12, 1e-12));
  EXPECT_EQ(p.grad().placements(), p.placements());
  const Tensor g = randn({8, 4}, 5, DType::F64);
  set_grad(p, distribute_tensor(g, mesh, {Shard{0}}));
  EXPECT_EQ(p.grad().placements(), p.placements());
  EXPECT_TRUE(allclose(p.grad().full_tensor(), g));

  // LocalTensor.
  LocalTensor l = LocalTensor::from_fn(world, [](int r) { return full({2}, r, DType::F64); });
  l.requires_grad_();
  register_hook<LocalTensor>(l, [](const LocalTensor& gl) { return gl * 3.0; });
  backward(sum(l * l));
  for (int r : world.held_ranks()) {
    EXPECT_TRUE(allclose(l.grad().shard(r), full({2}, 6.0 * r, DType::F64))) << "rank " << r;
  }
}

SPMD_TEST(Autograd, RanksOutsideTheMeshHoldEmptyPiecesAndRunTheProgram) {
  const DeviceMesh pair = DeviceMesh::from_ranks(world, {2}, {0, 1}, {"pair"});
  const Tensor full_a = arange(8, DType::F64);
  DTensor a = distribute_tensor(full_a, pair, {Shard{0}});
  a.requires_grad_();
  const DTensor b = a * 2.0 + 1.0;
  const DTensor c = b.redistribute({Replicate{}});
  const Tensor f = c.full_tensor();
  backward(sum(c * c));
  const LocalTensor pieces = c.to_local();
  const bool inside = world.held_ranks().front() < 2;
  EXPECT_EQ(a.participates(), inside);
  EXPECT_EQ(c.shape(), (Shape{8}));
  EXPECT_EQ(c.placements(), Placements{Replicate{}});
  if (inside) {
    EXPECT_TRUE(equal(f, full_a * 2.0 + 1.0));
    EXPECT_TRUE(allclose(a.grad().full_tensor(), (full_a * 2.0 + 1.0) * 4.0));
    // The pieces of the held ranks in the mesh; under sim the others hold nothing.
    for (int r : pieces.ranks()) {
      EXPECT_LT(r, 2);
      EXPECT_TRUE(equal(pieces.shard(r), full_a * 2.0 + 1.0)) << "rank " << r;
    }
  } else {
    const int r = world.held_ranks().front();
    EXPECT_EQ(f.numel(), 0) << "rank " << r;
    EXPECT_EQ(pieces.shard(r).shape(), (Shape{0})) << "rank " << r;
    EXPECT_EQ(a.grad().local().shard(r).shape(), (Shape{0})) << "rank " << r;
  }
}

TEST(Autograd, PartialLeafGetsAReplicateGradient) {
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor p = distribute_tensor(arange(6, DType::F64), mesh, {Partial{}});
  p.requires_grad_();
  backward(sum(p * p));
  EXPECT_EQ(p.grad().placements(), Placements{Replicate{}});
  EXPECT_TRUE(allclose(p.grad().full_tensor(), arange(6, DType::F64) * 2.0));
}

// A gradient that arrives Partial (here an explicit output gradient) is reduced for the leaf:
// docs/concepts.md promises Replicate, and a P(max) placement on a sum of gradients is wrong.
TEST(Autograd, PartialLeafGetsAReplicateGradientWhenTheGradientArrivesPartial) {
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    SCOPED_TRACE(fmt::format("{}", op));
    DTensor p = distribute_tensor(arange(6, DType::F64), mesh, {Partial{op}});
    p.requires_grad_();
    const DTensor y = p * 3.0;
    const DTensor g = distribute_tensor(full({6}, 2.0, DType::F64), mesh, {Partial{}});
    backward(y, g);
    EXPECT_EQ(p.grad().placements(), Placements{Replicate{}});
    EXPECT_TRUE(allclose(p.grad().full_tensor(), full({6}, 6.0, DType::F64)))
        << p.grad().full_tensor();
  }
}

TEST(Autograd, ZeroGradDropsGradients) {
  World world = World::sim(2);
  const DeviceMesh mesh = init_device_mesh(world, {2});
  DTensor w = distribute_tensor(ones({4}), mesh, {Shard{0}});
  w.requires_grad_();
  backward(sum(w * 3.0));
  ASSERT_TRUE(w.grad().defined());
  zero_grad({&w});
  EXPECT_FALSE(w.grad().defined());
}

}  // namespace
}  // namespace spmd
