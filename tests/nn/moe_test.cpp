// The mixture-of-experts layer (nn/moe.h) expert-parallel on a (dp, ep) mesh against the same layer
// on one device: outputs, the load-balancing loss and every gradient (the router's reduced over
// every token dim, the experts' over dp only); with capacity, each rank's tokens against the
// one-device layer on those tokens alone (capacity is per rank); and its errors.
#include <gtest/gtest.h>

#include <spmd/dtensor/ops.h>
#include <spmd/nn/moe.h>
#include <spmd/nn/parallel.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

struct Layer {
  Tensor x, router, w1, w3, w2;
};

Layer make_layer(int64_t experts) {
  const int64_t d = 6, f = 5;
  return {randn({4, 8, d}, 1, DType::F64), randn({d, experts}, 2, DType::F64),
          randn({experts, d, f}, 3, DType::F64) * 0.5, randn({experts, d, f}, 4, DType::F64) * 0.5,
          randn({experts, f, d}, 5, DType::F64) * 0.5};
}

DeviceMesh dp_ep(const World& world) {
  return init_device_mesh(world, {2, world.size() / 2}, {"dp", "ep"});
}

MoEWeights<DTensor> place(const Layer& l, const DeviceMesh& mesh) {
  const Placements experts = placed_on(mesh, "ep", Shard{0});
  MoEWeights<DTensor> w{distribute_tensor(l.router, mesh, replicate_placements(mesh)),
                        distribute_tensor(l.w1, mesh, experts),
                        distribute_tensor(l.w3, mesh, experts),
                        distribute_tensor(l.w2, mesh, experts)};
  for (DTensor* p : {&w.router, &w.w1, &w.w3, &w.w2}) p->requires_grad_();
  return w;
}

SPMD_TEST(MoE, ExpertParallelMatchesOneDeviceWithGradients) {
  const DeviceMesh mesh = dp_ep(world);
  const int64_t experts = 2 * mesh.size("ep");
  const Layer l = make_layer(experts);
  const MoEOptions options{.top_k = 2, .ep = "ep"};
  // Tokens split by batch over dp and by sequence over ep.
  DTensor x = distribute_tensor(l.x, mesh, {Shard{0}, Shard{1}});
  x.requires_grad_();
  MoEWeights<DTensor> w = place(l, mesh);
  const MoEOutput<DTensor> r = moe(x, w, options);
  EXPECT_EQ(r.out.placements(), x.placements());
  const Tensor g = randn(l.x.shape(), 9, DType::F64);
  backward(sum(r.out * distribute_tensor(g, mesh, x.placements())) + r.aux_loss * 0.5);

  Tensor fx = l.x.clone().requires_grad_();
  MoEWeights<Tensor> fw{l.router.clone().requires_grad_(), l.w1.clone().requires_grad_(),
                        l.w3.clone().requires_grad_(), l.w2.clone().requires_grad_()};
  const MoEOutput<Tensor> f = moe(fx, fw, options);
  backward(sum(f.out * g) + f.aux_loss * 0.5);

  EXPECT_TRUE(allclose(r.out.full_tensor(), f.out, 1e-12, 1e-12));
  EXPECT_NEAR(r.aux_loss.full_tensor().item<double>(), f.aux_loss.item<double>(), 1e-12);
  EXPECT_EQ(r.load, f.load);
  int64_t choices = 0;
  for (int64_t n : r.load) choices += n;
  EXPECT_EQ(choices, 4 * 8 * 2);
  EXPECT_EQ(r.dropped, 0);
  EXPECT_TRUE(allclose(x.grad().full_tensor(), fx.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(w.router.grad().full_tensor(), fw.router.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(w.w1.grad().full_tensor(), fw.w1.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(w.w3.grad().full_tensor(), fw.w3.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(w.w2.grad().full_tensor(), fw.w2.grad(), 1e-10, 1e-10));
  for (DTensor* p : {&w.router, &w.w1, &w.w3, &w.w2}) {
    EXPECT_EQ(p->grad().placements(), p->placements());
  }
}

// Top-1 routing and no gate renormalization: every token's output is its one expert's times its
// probability.
SPMD_TEST(MoE, TopOneWithoutRenormalizationMatchesOneDevice) {
  const DeviceMesh mesh = dp_ep(world);
  const Layer l = make_layer(mesh.size("ep"));
  const MoEOptions options{.top_k = 1, .normalize_gates = false, .ep = "ep"};
  const DTensor x = distribute_tensor(l.x, mesh, {Shard{1}, Shard{0}});
  const MoEOutput<DTensor> r = moe(x, place(l, mesh), options);
  const MoEOutput<Tensor> f = moe(l.x, MoEWeights<Tensor>{l.router, l.w1, l.w3, l.w2}, options);
  EXPECT_TRUE(allclose(r.out.full_tensor(), f.out, 1e-12, 1e-12));
}

// Capacity is per rank: each rank's output equals the one-device layer run on that rank's tokens
// alone, and some choices are dropped (their tokens get less than all k results).
SPMD_TEST(MoE, CapacityDropsPerRankAsOneDeviceOnTheRanksTokens) {
  const DeviceMesh mesh = dp_ep(world);
  const Layer l = make_layer(2 * mesh.size("ep"));
  const MoEOptions options{.top_k = 2, .capacity_factor = 0.5, .ep = "ep"};
  const DTensor x = distribute_tensor(l.x, mesh, {Shard{0}, Shard{1}});
  const MoEOutput<DTensor> r = moe(x, place(l, mesh), options);
  EXPECT_GT(r.dropped, 0);
  const MoEWeights<Tensor> fw{l.router, l.w1, l.w3, l.w2};
  int64_t dropped = 0;
  for (int rank : world.held_ranks()) {
    const MoEOutput<Tensor> f = moe(x.local().shard(rank), fw, options);
    EXPECT_TRUE(allclose(r.out.local().shard(rank), f.out, 1e-12, 1e-12)) << "rank " << rank;
    dropped += f.dropped;
  }
  if (static_cast<int>(world.held_ranks().size()) == world.size()) EXPECT_EQ(dropped, r.dropped);
}

SPMD_TEST(MoE, BadLayoutsAndOptionsAreErrors) {
  const DeviceMesh mesh = dp_ep(world);
  const Layer l = make_layer(2 * mesh.size("ep"));
  const MoEWeights<DTensor> w = place(l, mesh);
  const DTensor replicated_over_ep = distribute_tensor(l.x, mesh, {Shard{0}, Replicate{}});
  expect_throws<PlacementError>([&] { moe(replicated_over_ep, w, {.ep = "ep"}); },
                                {"moe", "split over the expert-parallel dim ep"});
  const DTensor features = distribute_tensor(l.x, mesh, {Shard{0}, Shard{2}});
  expect_throws<PlacementError>([&] { moe(features, w, {.ep = "ep"}); },
                                {"moe", "feature dim whole", "ep"});
  const DTensor x = distribute_tensor(l.x, mesh, {Shard{0}, Shard{1}});
  MoEWeights<DTensor> replicated_experts = w;
  replicated_experts.w1 = distribute_tensor(l.w1, mesh, replicate_placements(mesh));
  expect_throws<PlacementError>([&] { moe(x, replicated_experts, {.ep = "ep"}); },
                                {"moe", "split by expert over ep", "S(0)"});
  expect_throws<ConfigError>([&] { moe(x, w, {.top_k = 0, .ep = "ep"}); }, {"moe", "top_k", "0"});
  expect_throws<ConfigError>(
      [&] {
        moe(l.x, MoEWeights<Tensor>{l.router, l.w1, l.w3, l.w2},
            {.top_k = 2, .capacity_factor = -1.0});
      },
      {"moe", "capacity_factor", "-1"});
  expect_throws<ShapeError>(
      [&] {
        moe(l.x, MoEWeights<Tensor>{l.router, l.w2, l.w3, l.w2}, {});
      },
      {"moe", "w1", "[E, d, f]"});
}

}  // namespace
}  // namespace spmd
