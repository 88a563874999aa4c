// Context parallelism (nn/context_parallel.h): ring and all-gather attention over a sequence split
// across cp, in contiguous and zigzag order, causal or not, against full attention on one device:
// outputs and the gradients of q, k and v; zigzag_order's chunks; and the errors.
#include <gtest/gtest.h>

#include <spmd/dtensor/ops.h>
#include <spmd/nn/context_parallel.h>
#include <spmd/nn/parallel.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

DeviceMesh cp_tp(const World& world) {
  return init_device_mesh(world, {world.size() / 2, 2}, {"cp", "tp"});
}

Tensor index_of(const std::vector<int64_t>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())});
}

// Attention over [B, H, S, D] with the sequence split over cp and the heads over tp, the sequence
// laid out in `order` (index i holds position order[i]), against sdpa on the original order.
void expect_matches_full(const DeviceMesh& mesh, ContextMethod method, bool causal, bool zigzag) {
  const int64_t cp = mesh.size("cp");
  const int64_t S = 4 * cp;
  const Tensor q = randn({2, 4, S, 3}, 1, DType::F64);
  const Tensor k = randn({2, 4, S, 3}, 2, DType::F64);
  const Tensor v = randn({2, 4, S, 5}, 3, DType::F64);
  const Tensor g = randn({2, 4, S, 5}, 4, DType::F64);
  std::vector<int64_t> order(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) order[static_cast<size_t>(i)] = i;
  if (zigzag) order = zigzag_order(S, cp);
  const Tensor perm = index_of(order);
  auto laid_out = [&](const Tensor& t) {
    DTensor d = distribute_tensor(index_select(t, 2, perm), mesh, {Shard{2}, Shard{1}});
    return d.requires_grad_();
  };
  DTensor dq = laid_out(q), dk = laid_out(k), dv = laid_out(v);
  ContextAttentionOptions options{.cp = "cp", .causal = causal, .method = method};
  if (zigzag) options.positions = order;
  const DTensor out = context_attention(dq, dk, dv, options);
  EXPECT_EQ(out.placements(), dq.placements());
  backward(sum(out * distribute_tensor(index_select(g, 2, perm), mesh, out.placements())));

  Tensor fq = q.clone().requires_grad_(), fk = k.clone().requires_grad_();
  Tensor fv = v.clone().requires_grad_();
  const Tensor full = scaled_dot_product_attention(fq, fk, fv, causal);
  backward(sum(full * g));
  EXPECT_TRUE(allclose(out.full_tensor(), index_select(full, 2, perm), 1e-12, 1e-12));
  EXPECT_TRUE(allclose(dq.grad().full_tensor(), index_select(fq.grad(), 2, perm), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(dk.grad().full_tensor(), index_select(fk.grad(), 2, perm), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(dv.grad().full_tensor(), index_select(fv.grad(), 2, perm), 1e-10, 1e-10));
}

SPMD_TEST(ContextParallel, RingMatchesFullAttentionCausalContiguous) {
  expect_matches_full(cp_tp(world), ContextMethod::Ring, true, false);
}
SPMD_TEST(ContextParallel, RingMatchesFullAttentionCausalZigzag) {
  expect_matches_full(cp_tp(world), ContextMethod::Ring, true, true);
}
SPMD_TEST(ContextParallel, RingMatchesFullAttentionNotCausal) {
  expect_matches_full(cp_tp(world), ContextMethod::Ring, false, false);
}
SPMD_TEST(ContextParallel, AllGatherMatchesFullAttentionCausalZigzag) {
  expect_matches_full(cp_tp(world), ContextMethod::AllGather, true, true);
}
SPMD_TEST(ContextParallel, AllGatherMatchesFullAttentionCausalContiguous) {
  expect_matches_full(cp_tp(world), ContextMethod::AllGather, true, false);
}

// Rank c holds chunks c and 2cp - 1 - c: under a causal mask every rank sees the same number of
// (query, key) pairs.
TEST(ContextParallel, ZigzagOrderBalancesTheCausalWork) {
  EXPECT_EQ(zigzag_order(8, 2), (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
  const int64_t S = 24, cp = 3;
  const std::vector<int64_t> order = zigzag_order(S, cp);
  for (int64_t c = 0; c < cp; ++c) {
    int64_t pairs = 0;
    for (int64_t i = c * S / cp; i < (c + 1) * S / cp; ++i)
      pairs += order[static_cast<size_t>(i)] + 1;
    EXPECT_EQ(pairs, S * (S + 1) / 2 / cp) << "rank " << c;
  }
  expect_throws<ConfigError>([] { zigzag_order(10, 3); }, {"zigzag_order", "10", "2 x 3"});
}

SPMD_TEST(ContextParallel, BadLayoutsAreErrors) {
  const DeviceMesh mesh = cp_tp(world);
  const Tensor t = randn({2, 4, 8, 3}, 1, DType::F64);
  const DTensor q = distribute_tensor(t, mesh, {Shard{2}, Shard{1}});
  const DTensor whole = distribute_tensor(t, mesh, {Replicate{}, Shard{1}});
  expect_throws<PlacementError>([&] { context_attention(whole, whole, whole); },
                                {"context_attention", "split over cp"});
  const DTensor gqa = distribute_tensor(randn({2, 2, 8, 3}, 2), mesh, {Shard{2}, Shard{1}});
  expect_throws<ShapeError>([&] { context_attention(q, gqa, gqa); },
                            {"context_attention", "[2, 2, 8, 3]", "repeat grouped"});
  expect_throws<ConfigError>(
      [&] {
        context_attention(q, q, q, {.positions = {0, 1}});
      },
      {"context_attention", "2 positions", "8"});
}

}  // namespace
}  // namespace spmd
