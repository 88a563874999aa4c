// Tests for the SPMD types of local code (world/spmd_types.h, collectives/typed.h, to_local and
// from_local): every rule of the table in docs/concepts.md ("SPMD types"), each checked
// numerically under sim against what the type means (R and I: identical shards equal to the
// value; P: the shards sum to it; V: each rank's own shard), and every gradient against a closed
// form computed on plain Tensors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <spmd/spmd.h>

#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

constexpr int kRanks = 4;

SpmdType type_of(const LocalTensor& t, const std::string& axis) {
  EXPECT_NE(t.spmd_types(), nullptr);
  return t.spmd_types()->of(axis).type;
}

// What a P value means: the sum of its shards.
Tensor sum_of(const LocalTensor& t) {
  Tensor out = t.shards().front().clone();
  for (size_t i = 1; i < t.num_shards(); ++i) out = out + t.shards()[i];
  return out;
}

// R and I: every shard is `value`.
void expect_every_shard(const LocalTensor& t, const Tensor& value, double atol = 1e-5) {
  for (int r : t.ranks()) {
    EXPECT_TRUE(allclose(t.shard(r), value, 1e-5, atol))
        << "rank " << r << ": " << t.shard(r) << " vs " << value;
  }
}

Tensor rank_tensor(int r, const Shape& shape) {
  return randn(shape, 100 + static_cast<uint64_t>(r));
}

struct Typed : ::testing::Test {
  World world = World::sim(kRanks);
  DeviceMesh mesh = init_device_mesh(world, {kRanks}, {"tp"});
  TypesScope types{/*data=*/true};
  // V along every axis: rank r holds rank_tensor(r).
  LocalTensor varying(const Shape& shape) {
    return LocalTensor::from_fn(world, [&](int r) { return rank_tensor(r, shape); });
  }
  // P along tp: a V value read as terms of a sum.
  LocalTensor partial(const Shape& shape) {
    return reinterpret(varying(shape), {{"tp", SpmdType::P}});
  }
  // R along tp, known to the mesh (rank 0's shard broadcast).
  LocalTensor replicated(const Shape& shape) { return broadcast(varying(shape), mesh, "tp", 0); }
  // I along tp: all_reduce of varying shards.
  LocalTensor invariant(const Shape& shape) { return all_reduce(varying(shape), mesh, "tp"); }
};

// ---- creation
// -------------------------------------------------------------------------------------

TEST_F(Typed, CreationTypes) {
  const LocalTensor v = varying({3});
  EXPECT_EQ(type_of(v, "tp"), SpmdType::V);
  EXPECT_FALSE(equal(v.shard(0), v.shard(1)));
  const Tensor w = randn({3}, 7);
  const LocalTensor r = LocalTensor::replicate(world, w);
  EXPECT_EQ(type_of(r, "tp"), SpmdType::R);
  expect_every_shard(r, w, 0);
  EXPECT_EQ(type_of(zeros(world, {2}), "tp"), SpmdType::R);
  EXPECT_EQ(type_of(full(world, {2}, 3.0), "dp"), SpmdType::R);
  EXPECT_EQ(r.types().at("*"), SpmdType::R);
}

TEST_F(Typed, ToLocalMapsShardToVReplicateToRPartialToP) {
  const Tensor full_a = randn({4, 8}, 1);
  const Tensor full_b = randn({8, 4}, 2);
  DTensor a = distribute_tensor(full_a, mesh, {Shard{1}});
  DTensor b = distribute_tensor(full_b, mesh, {Shard{0}});
  DTensor rep = distribute_tensor(full_a, mesh, {Replicate{}});
  const LocalTensor s = a.to_local();
  EXPECT_EQ(type_of(s, "tp"), SpmdType::V);
  EXPECT_TRUE(allclose(s.shard(1), full_a.narrow(1, 2, 2)));
  const LocalTensor r = rep.to_local();
  EXPECT_EQ(type_of(r, "tp"), SpmdType::R);
  expect_every_shard(r, full_a, 0);
  const DTensor prod = matmul(a, b);  // P(sum)
  const LocalTensor p = prod.to_local();
  EXPECT_EQ(type_of(p, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(p), matmul(full_a, full_b), 1e-4, 1e-4));
}

// ---- table ops
// ------------------------------------------------------------------------------------

TEST_F(Typed, VaryingWithReplicateIsVarying) {
  const LocalTensor v = varying({3});
  const LocalTensor r = replicated({3});
  const LocalTensor y = v * r + r;
  EXPECT_EQ(type_of(y, "tp"), SpmdType::V);
  for (int k : y.ranks()) EXPECT_TRUE(allclose(y.shard(k), v.shard(k) * r.shard(k) + r.shard(k)));
  EXPECT_EQ(type_of(relu(r) * r, "tp"), SpmdType::R);
  expect_every_shard(relu(r) * r, relu(r.shard(0)) * r.shard(0));
}

TEST_F(Typed, LinearOpsKeepPartial) {
  const LocalTensor p = partial({2, 3});
  const LocalTensor q = partial({2, 3});
  const LocalTensor w = LocalTensor::replicate(world, randn({3, 4}, 9));
  const Tensor meaning_p = sum_of(p);
  const Tensor meaning_q = sum_of(q);
  // Each result is P, and its shards sum to the op on the meanings.
  const LocalTensor scaled = p * 2.0;
  EXPECT_EQ(type_of(scaled, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(scaled), meaning_p * 2.0));
  const LocalTensor added = p + q;
  EXPECT_EQ(type_of(added, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(added), meaning_p + meaning_q));
  const LocalTensor prod = matmul(p, w);
  EXPECT_EQ(type_of(prod, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(prod), matmul(meaning_p, w.shard(0)), 1e-4, 1e-5));
  const LocalTensor reduced = sum(transpose(p, 0, 1), {0});
  EXPECT_EQ(type_of(reduced, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(reduced), sum(transpose(meaning_p, 0, 1), {0}), 1e-4, 1e-5));
  // cumsum (issue 27) is a sum too.
  const LocalTensor scanned = cumsum(p, 1);
  EXPECT_EQ(type_of(scanned, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(scanned), cumsum(meaning_p, 1), 1e-4, 1e-5));
}

// The Llama ops of issue 27 are linear in their data: rotary_embedding (positions R) and
// repeat_interleave keep P.
TEST_F(Typed, LlamaOpsKeepPartial) {
  const LocalTensor p = partial({2, 4, 2, 6});
  const Tensor meaning = sum_of(p);
  const LocalTensor positions = LocalTensor::replicate(world, arange(4, DType::I64) * 3);
  const RopeConfig config{.scaling = RopeScaling{}};
  const LocalTensor rotated = rotary_embedding(p, positions, config);
  EXPECT_EQ(type_of(rotated, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(rotated),
                       rotary_embedding(meaning, arange(4, DType::I64) * 3, config), 1e-4, 1e-5));
  const LocalTensor repeated = repeat_interleave(p, 2, 2);
  EXPECT_EQ(type_of(repeated, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(repeated), repeat_interleave(meaning, 2, 2), 1e-4, 1e-5));
}

TEST_F(Typed, NonlinearOpOnPartialIsAnError) {
  const LocalTensor p = partial({6});
  // Why: relu of the parts does not sum to relu of the sum.
  EXPECT_FALSE(allclose(sum_of(relu(p.with_types(nullptr))), relu(sum_of(p))));
  const std::string m = expect_throws<TypeError>(
      [&] { (void)relu(p); },
      {"relu: along mesh axis 'tp' input 1 is P (reinterpret at spmd_types_test.cpp:",
       "is not linear", "(at spmd_types_test.cpp:"});
  const LocalTensor rows =
      LocalTensor::replicate(world, from_vector<int64_t>({5, 0, 1, 1, 2, 3}, {6}));
  // The elementwise ops of issue 27: none is linear (clamp keeps P(max) and P(min) on DTensors,
  // but a pending sum does not pass).
  for (const auto& [name, run] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"sin", [&] { (void)sin(p); }},
           {"cos", [&] { (void)cos(p); }},
           {"log1p", [&] { (void)log1p(p); }},
           {"expm1", [&] { (void)expm1(p); }},
           {"reciprocal", [&] { (void)reciprocal(p); }},
           {"clamp", [&] { (void)clamp(p, -1.0, 1.0); }},
           // Ordering ops of issue 27: the order of the parts is not the order of the sum.
           {"topk_indices", [&] { (void)topk(p, 2); }},
           {"sort_indices", [&] { (void)sort(p); }},
           {"argmin", [&] { (void)argmin(p, 0); }},
           // The scatters keep no pending sum: x and src would both have to be P, the index not
           // (a DTensor P(sum) x with tokens sharded does pass: dtensor/ops.h).
           {"index_add", [&] { (void)index_add(p, 0, rows, p); }},
           {"scatter_add", [&] { (void)scatter_add(p, 0, rows, p); }}}) {
    expect_throws<TypeError>(run, {name + ": along mesh axis 'tp' input 1 is P", "is not linear"});
  }
  expect_throws<TypeError>([&] { (void)(p * p); }, {"product of two pending sums"});
  // The losses and reductions of issue 27 are not linear in their input either.
  const LocalTensor logits = partial({2, 3});
  const LocalTensor target = to(clamp(replicated({2}), 0.0, 0.0), DType::I64);
  for (const auto& [name, run] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"cross_entropy", [&] { (void)cross_entropy(logits, target); }},
           {"nll_loss", [&] { (void)nll_loss(logits, target); }},
           {"mse_loss",
            [&] {
              (void)mse_loss(logits, replicated({2, 3}));
            }},
           {"logsumexp", [&] { (void)logsumexp(p, {0}); }},
           {"var", [&] { (void)var(p); }},
           {"std", [&] { (void)std(p); }},
           {"norm", [&] { (void)norm(p, 1.0); }},
           {"prod", [&] { (void)prod(p); }}}) {
    expect_throws<TypeError>(run, {name + ": along mesh axis 'tp' input 1 is P", "is not linear"});
  }
  EXPECT_NO_THROW((void)cross_entropy(replicated({2, 3}), target));
  expect_throws<TypeError>([&] { (void)(p * varying({6})); }, {"only by Replicate values"});
  // Adding an R value to a P adds it once per rank: sum_of(p + r) = sum_of(p) + kRanks * r.
  const LocalTensor r = replicated({6});
  EXPECT_TRUE(allclose(sum_of(p.with_types(nullptr) + r.with_types(nullptr)),
                       sum_of(p) + r.shard(0) * static_cast<double>(kRanks), 1e-4, 1e-5));
  expect_throws<TypeError>([&] { (void)(p + r); }, {"once per rank of the axis"});
  // A plain Tensor operand is a constant: R to a Partial, so P + c is the same error, P * c is P.
  const Tensor c = randn({6}, 3);
  expect_throws<TypeError>([&] { (void)(p + c); }, {"input 2 is R (a Tensor operand"});
  EXPECT_EQ(type_of(p * c, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(p * c), sum_of(p) * c, 1e-4, 1e-5));
}

TEST_F(Typed, InvariantMixesOnlyWithInvariant) {
  LocalTensor i = invariant({3});
  EXPECT_EQ(type_of(i, "tp"), SpmdType::I);
  EXPECT_EQ(type_of(i * i + i, "tp"), SpmdType::I);
  expect_every_shard(i * i, i.shard(0) * i.shard(0));
  // Without a gradient R and I are the same data: they mix as R.
  const LocalTensor r = replicated({3});
  EXPECT_EQ(type_of(i + r, "tp"), SpmdType::R);
  expect_every_shard(i + r, i.shard(0) + r.shard(0));
  // Recorded for autograd they do not: an I value's gradient is reduced, an R one's pending.
  i.requires_grad_();
  expect_throws<TypeError>([&] { (void)(i + r); }, {"input 1 is I (all_reduce at",
                                                    "input 2 is R (broadcast at", "Megatron's f"});
  expect_throws<TypeError>([&] { (void)(i * varying({3})); }, {"input 2 is V (from_fn at"});
}

// to_local under autograd: the grad_placements say whether the gradient arrives reduced (I) or as
// each rank's term of a pending sum (R).
TEST_F(Typed, ToLocalTypesFollowTheGradientClaim) {
  DTensor w = distribute_tensor(randn({3}, 5), mesh, {Replicate{}});
  EXPECT_EQ(type_of(w.to_local(), "tp"), SpmdType::R);  // not recorded: no claim
  w.requires_grad_();
  const LocalTensor claimed_reduced = w.to_local();
  EXPECT_EQ(type_of(claimed_reduced, "tp"), SpmdType::I);
  EXPECT_EQ(type_of(w.to_local(Placements{Partial{}}), "tp"), SpmdType::R);
  // With values identical on every rank the claim holds: I meets I and R.
  EXPECT_EQ(type_of(claimed_reduced * claimed_reduced, "tp"), SpmdType::I);
  // With a value that differs per rank it cannot: each rank's gradient is its own term.
  expect_throws<TypeError>(
      [&] { (void)(claimed_reduced * varying({3})); },
      {"mul", "to_local at spmd_types_test.cpp", "claims this value's gradient",
       "grad_placements with Partial on 'tp'"});
  // Partial claimed: R meets V as usual, and the gradient is the sum of the ranks' terms.
  const LocalTensor v = varying({3});
  backward(sum(w.to_local(Placements{Partial{}}) * v));
  Tensor total = zeros({3});
  for (int r : world.held_ranks()) total = total + v.shard(r);
  EXPECT_TRUE(allclose(w.grad().full_tensor(), total, 1e-5, 1e-5));
}

// The types need no flag: without any TypesScope every LocalTensor made over a world is typed and
// every local collective differentiable (its typed backward).
TEST(TypesAlwaysOn, NoFlagNeeded) {
  World world = World::sim(kRanks);
  DeviceMesh mesh = init_device_mesh(world, {kRanks}, {"tp"});
  ASSERT_FALSE(types_data_check());
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r + 1.0); });
  EXPECT_EQ(type_of(x, "tp"), SpmdType::V);
  x.requires_grad_();
  const LocalTensor y = all_gather(x * 3.0, mesh, "tp");  // V -> R, backward reduce_scatter
  EXPECT_EQ(type_of(y, "tp"), SpmdType::R);
  backward(sum(y));
  // Each rank's x appears in every rank's gathered copy: its gradient is 3 summed over the ranks.
  expect_every_shard(x.grad(), full({2}, 3.0 * kRanks));
  expect_throws<TypeError>([&] { (void)all_reduce(y.detach(), mesh, "tp"); },
                           {"all_reduce", "doubled reduction"});
}

// ---- collectives: forward types, checked against the data
// ----------------------------------------

TEST_F(Typed, AllReducePartialToReplicateVaryingToInvariant) {
  const LocalTensor p = partial({5});
  const LocalTensor r = all_reduce(p, mesh, "tp");
  EXPECT_EQ(type_of(r, "tp"), SpmdType::R);
  expect_every_shard(r, sum_of(p));
  const LocalTensor v = varying({5});
  const LocalTensor i = all_reduce(v, mesh, "tp", ReduceOp::Max);
  EXPECT_EQ(type_of(i, "tp"), SpmdType::I);
  expect_throws<TypeError>(
      [&] { (void)all_reduce(r, mesh, "tp"); },
      {"all_reduce: along mesh axis 'tp' the input is R (all_reduce at", "doubled reduction"});
}

TEST_F(Typed, AllGatherVaryingToReplicate) {
  const LocalTensor v = varying({2, 3});
  const LocalTensor r = all_gather(v, mesh, "tp", 1);
  EXPECT_EQ(type_of(r, "tp"), SpmdType::R);
  std::vector<Tensor> pieces;
  for (int k : v.ranks()) pieces.push_back(v.shard(k));
  expect_every_shard(r, cat(pieces, 1), 0);
  expect_throws<TypeError>([&] { (void)all_gather(partial({2}), mesh, "tp"); },
                           {"all_gather", "the input is P", "must be reduced"});
}

TEST_F(Typed, ReduceScatterPartialToVarying) {
  const LocalTensor p = partial({8, 2});
  const LocalTensor v = reduce_scatter(p, mesh, "tp");
  EXPECT_EQ(type_of(v, "tp"), SpmdType::V);
  const Tensor meaning = sum_of(p);
  for (int k : v.ranks())
    EXPECT_TRUE(allclose(v.shard(k), meaning.narrow(0, 2 * k, 2), 1e-5, 1e-5));
  expect_throws<TypeError>([&] { (void)reduce_scatter(replicated({8}), mesh, "tp"); },
                           {"reduce_scatter", "doubled reduction"});
}

TEST_F(Typed, AllToAllPermuteBroadcastScatter) {
  const LocalTensor v = varying({4, 2});
  EXPECT_EQ(type_of(all_to_all(v, mesh, "tp", 0, 1), "tp"), SpmdType::V);
  EXPECT_EQ(type_of(permute(v, mesh, "tp", {1, 2, 3, 0}), "tp"), SpmdType::V);
  const LocalTensor p = partial({3});
  const LocalTensor moved = permute(p, mesh, "tp", {1, 2, 3, 0});
  EXPECT_EQ(type_of(moved, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(moved), sum_of(p), 1e-5, 1e-5));  // a permutation keeps the sum
  const LocalTensor b = broadcast(v, mesh, "tp", 2);
  EXPECT_EQ(type_of(b, "tp"), SpmdType::R);
  expect_every_shard(b, v.shard(2), 0);
  EXPECT_EQ(type_of(scatter(v, mesh, "tp", 0), "tp"), SpmdType::V);
  expect_throws<TypeError>([&] { (void)broadcast(p, mesh, "tp"); }, {"broadcast", "is P"});
}

TEST_F(Typed, OtherAxesKeepTheirTypes) {
  World w8 = World::sim(8);
  DeviceMesh m = init_device_mesh(w8, {2, 4}, {"dp", "tp"});
  LocalTensor x = LocalTensor::from_fn(w8, [](int r) { return rank_tensor(r, {4}); });
  x = reinterpret(x, {{"dp", SpmdType::P}});
  const LocalTensor y = all_gather(x, m, "tp");
  EXPECT_EQ(type_of(y, "tp"), SpmdType::R);
  EXPECT_EQ(type_of(y, "dp"), SpmdType::P);
}

// ---- backward: the collective each type implies
// ---------------------------------------------------

// loss = sum(c * f(x)) with per-rank c: dloss/dx checked against the closed form.
TEST_F(Typed, AllGatherBackwardIsReduceScatter) {
  LocalTensor x = varying({2});
  x.requires_grad_();
  const LocalTensor c = varying({8});
  backward(sum(all_gather(x, mesh, "tp") * c));
  // d/dx_k of sum_r c_r . [x_0..x_3] = sum_r c_r[2k:2k+2].
  const LocalTensor g = x.grad();
  EXPECT_EQ(type_of(g, "tp"), SpmdType::V);
  for (int k : x.ranks())
    EXPECT_TRUE(allclose(g.shard(k), sum_of(c).narrow(0, 2 * k, 2), 1e-5, 1e-5)) << k;
}

TEST_F(Typed, AllReducePartialBackwardIsAllReduce) {
  LocalTensor x = partial({3});
  x.requires_grad_();
  const LocalTensor c = varying({3});
  // The R output's gradient is P (each rank's c); each part of x needs the whole sum_r c_r.
  backward(sum(all_reduce(x, mesh, "tp") * c));
  EXPECT_EQ(type_of(x.grad(), "tp"), SpmdType::R);
  expect_every_shard(x.grad(), sum_of(c));
}

TEST_F(Typed, AllReduceVaryingBackwardIsIdentity) {
  LocalTensor x = varying({3});
  x.requires_grad_();
  const LocalTensor c = invariant({3});
  // The I output's gradient is the same on every rank (c) and is every term's.
  backward(sum(all_reduce(x, mesh, "tp") * c));
  EXPECT_EQ(type_of(x.grad(), "tp"), SpmdType::V);
  expect_every_shard(x.grad(), c.shard(0));
}

TEST_F(Typed, AllReduceMaxBackwardGoesToTheArgmaxRanks) {
  // Element 0: rank 2 holds the max alone; element 1: ranks 1 and 3 tie; element 2: every rank
  // ties. Brute force: the gradient of sum(c * max_r x_r) on rank r is c where x_r is the max,
  // divided by the number of ranks that hold it.
  const std::vector<std::vector<float>> v = {{1, 0, 5}, {2, 7, 5}, {9, 1, 5}, {3, 7, 5}};
  LocalTensor x = LocalTensor::from_fn(
      world, [&](int r) { return from_vector<float>(v[static_cast<size_t>(r)], {3}); });
  x.requires_grad_();
  const LocalTensor c = invariant({3});
  LocalTensor y = all_reduce(x, mesh, "tp", ReduceOp::Max);
  EXPECT_EQ(type_of(y, "tp"), SpmdType::I);
  backward(sum(y * c));
  EXPECT_EQ(type_of(x.grad(), "tp"), SpmdType::V);
  const std::vector<float> cv = c.shard(0).to_vector<float>();
  for (int r : x.ranks()) {
    const std::vector<float> g = x.grad().shard(r).to_vector<float>();
    for (size_t j = 0; j < 3; ++j) {
      float best = v[0][j];
      for (const auto& row : v) best = std::max(best, row[j]);
      int ties = 0;
      for (const auto& row : v) ties += row[j] == best ? 1 : 0;
      const float want = v[static_cast<size_t>(r)][j] == best ? cv[j] / ties : 0.0f;
      EXPECT_NEAR(g[j], want, 1e-6) << "rank " << r << " element " << j;
    }
  }
  // Min picks the other end; an R input ties everywhere: each rank gets c / n, a P gradient
  // whose shards sum to c.
  LocalTensor m = LocalTensor::from_fn(
      world, [&](int r) { return from_vector<float>(v[static_cast<size_t>(r)], {3}); });
  m.requires_grad_();
  backward(sum(all_reduce(m, mesh, "tp", ReduceOp::Min) * c));
  // The minima of elements 0 and 1 are both on rank 0 (1 and 0); element 2 ties on every rank.
  EXPECT_NEAR(m.grad().shard(0).to_vector<float>()[0], cv[0], 1e-6);
  EXPECT_NEAR(m.grad().shard(0).to_vector<float>()[1], cv[1], 1e-6);
  EXPECT_NEAR(m.grad().shard(1).to_vector<float>()[1], 0.0f, 1e-6);
  EXPECT_NEAR(m.grad().shard(3).to_vector<float>()[2], cv[2] / kRanks, 1e-6);
  LocalTensor rep = replicated({3});
  rep.requires_grad_();
  backward(sum(all_reduce(rep, mesh, "tp", ReduceOp::Max) * c));
  EXPECT_EQ(type_of(rep.grad(), "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(rep.grad()), c.shard(0), 1e-5, 1e-5));
  // Product has no backward here: a clear error naming the call.
  LocalTensor p = varying({3});
  p.requires_grad_();
  expect_throws<Unsupported>(
      [&] { backward(sum(all_reduce(p, mesh, "tp", ReduceOp::Product) * c)); },
      {"all_reduce over mesh dim 'tp'", "product", "not differentiable"});
}

TEST_F(Typed, ReduceScatterBackwardIsAllGather) {
  LocalTensor x = partial({8});
  x.requires_grad_();
  const LocalTensor c = varying({2});
  backward(sum(reduce_scatter(x, mesh, "tp") * c));
  std::vector<Tensor> pieces;
  for (int k : c.ranks()) pieces.push_back(c.shard(k));
  EXPECT_EQ(type_of(x.grad(), "tp"), SpmdType::R);
  expect_every_shard(x.grad(), cat(pieces, 0));
}

TEST_F(Typed, AllToAllBroadcastPermuteBackward) {
  LocalTensor x = varying({4});
  x.requires_grad_();
  const LocalTensor c = varying({4});
  backward(sum(all_to_all(x, mesh, "tp") * c));
  // all_to_all sends x_k[j] to rank j at position k: dx_k[j] = c_j[k].
  for (int k : x.ranks()) {
    for (int j = 0; j < kRanks; ++j) {
      EXPECT_NEAR(x.grad().shard(k).to_vector<float>()[static_cast<size_t>(j)],
                  c.shard(j).to_vector<float>()[static_cast<size_t>(k)], 1e-6);
    }
  }
  LocalTensor y = varying({3});
  y.requires_grad_();
  backward(sum(broadcast(y, mesh, "tp", 1) * c.narrow(0, 0, 3)));
  // Only the source's value is used: its gradient is sum_r c_r, the others' zero.
  EXPECT_TRUE(allclose(y.grad().shard(1), sum_of(c.narrow(0, 0, 3)), 1e-5, 1e-5));
  EXPECT_TRUE(allclose(y.grad().shard(0), zeros({3})));
  LocalTensor z = varying({3});
  z.requires_grad_();
  backward(sum(permute(z, mesh, "tp", {1, 2, 3, 0}) * c.narrow(0, 0, 3)));
  // Rank k's value lands on rank k+1: its gradient is c_{k+1}.
  for (int k : z.ranks())
    EXPECT_TRUE(allclose(z.grad().shard(k), c.narrow(0, 0, 3).shard((k + 1) % kRanks)));
}

TEST_F(Typed, ScatterBackwardGathersOntoSrc) {
  const LocalTensor c = varying({8});
  LocalTensor x = varying({8});
  x.requires_grad_();
  backward(sum(scatter(x, mesh, "tp", 2) * c.narrow(0, 0, 2)));
  // Only src's value is scattered: its gradient is every rank's c piece in group order.
  std::vector<Tensor> pieces;
  for (int k : c.ranks()) pieces.push_back(c.shard(k).narrow(0, 0, 2));
  EXPECT_TRUE(allclose(x.grad().shard(2), cat(pieces, 0)));
  EXPECT_TRUE(allclose(x.grad().shard(0), zeros({8})));
}

TEST_F(Typed, GradientTypesSwapRAndP) {
  LocalTensor w = replicated({3});
  w.requires_grad_();
  LocalTensor i = invariant({3});
  i.requires_grad_();
  const LocalTensor x = varying({3});
  backward(sum(w * x));
  backward(sum(i * i));
  EXPECT_EQ(type_of(w.grad(), "tp"), SpmdType::P);  // each rank's share of a pending sum
  EXPECT_EQ(type_of(i.grad(), "tp"), SpmdType::I);
  expect_every_shard(i.grad(), i.shard(0) * 2.0);
  // The P gradient means the true gradient: sum_r x_r.
  EXPECT_TRUE(allclose(sum_of(w.grad()), sum_of(x), 1e-5, 1e-5));
}

// ---- assert_type, reinterpret, convert
// -------------------------------------------------------------

TEST_F(Typed, AssertTypeNamesAxisTypesAndOrigin) {
  const LocalTensor v = varying({2});
  EXPECT_NO_THROW(assert_type(v, {{"tp", SpmdType::V}}));
  const std::string m = expect_throws<TypeError>(
      [&] {
        assert_type(v, {{"tp", SpmdType::R}});
      },
      {"assert_type: along mesh axis 'tp' expected R but it is V (from_fn at spmd_types_test.cpp:",
       "(at spmd_types_test.cpp:"});
}

TEST_F(Typed, ReinterpretRelabelsOnlyWhereTheDataAllows) {
  const LocalTensor r = replicated({2});
  const LocalTensor v = reinterpret(r, {{"tp", SpmdType::V}});
  EXPECT_EQ(type_of(v, "tp"), SpmdType::V);
  EXPECT_TRUE(equal(v.shard(3), r.shard(3)));
  expect_throws<TypeError>(
      [&] {
        (void)reinterpret(partial({2}), {{"tp", SpmdType::R}});
      },
      {"cannot be relabelled R", "all_reduce"});
  expect_throws<TypeError>(
      [&] {
        (void)reinterpret(varying({2}), {{"tp", SpmdType::I}});
      },
      {"cannot be relabelled I"});
}

TEST_F(Typed, ConvertKeepsTheMeaning) {
  const LocalTensor r = replicated({3});
  const LocalTensor p = convert(r, {{"tp", SpmdType::P}});
  EXPECT_EQ(type_of(p, "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(p), r.shard(0)));  // the same value, now as a sum
  EXPECT_TRUE(allclose(p.shard(2), zeros({3})));
  expect_throws<TypeError>(
      [&] {
        (void)convert(partial({3}), {{"tp", SpmdType::R}});
      },
      {"without communication", "all_reduce"});
}

TEST_F(Typed, ConvertInvariantToReplicateIsMegatronF) {
  // f: identity forward, all_reduce backward. x is I; the column-parallel matmul's gradient of
  // x is a partial sum over tp that f reduces.
  LocalTensor x = invariant({1, 4});
  x.requires_grad_();
  const LocalTensor xr = convert(x, {{"tp", SpmdType::R}});
  EXPECT_EQ(type_of(xr, "tp"), SpmdType::R);
  expect_every_shard(xr, x.shard(0), 0);
  const LocalTensor w = varying({4, 2});  // the column shard of each rank
  backward(sum(matmul(xr, w)));
  // d/dx sum(x W) = sum over the columns of W: all shards' columns together.
  const Tensor expected = transpose(sum(sum_of(w), {1}, true), 0, 1);
  EXPECT_EQ(type_of(x.grad(), "tp"), SpmdType::I);
  expect_every_shard(x.grad(), expected);
}

// ---- the data check
// --------------------------------------------------------------------------------

TEST_F(Typed, DataCheckFindsShardsThatDifferAlongAnRAxis) {
  const LocalTensor r = replicated({3});
  // A rank-dependent map on an R value.
  const std::string m = expect_throws<TypeError>(
      [&] { (void)r.map([](int rank, const Tensor& t) { return rank == 2 ? t * 2.0 : t; }); },
      {"map: along mesh axis 'tp' the type is R (broadcast at spmd_types_test.cpp:",
       "ranks 0 and 2 of group [0, 1, 2, 3] hold different shards", "(at spmd_types_test.cpp:"});
  LocalTensor i = invariant({3}).clone();
  i.mutable_shard(1).fill_(5.0);
  expect_throws<TypeError>(
      [&] {
        assert_type(i, {{"tp", SpmdType::I}});
      },
      {"ranks 0 and 1", "not identical"});
}

// ---- from_local ---------------------------------------------------------------------------------

TEST_F(Typed, FromLocalClaimsAreChecked) {
  expect_throws<TypeError>([&] { (void)DTensor::from_local(varying({2}), mesh, {Replicate{}}); },
                           {"the LocalTensor is V (from_fn at", "placement R claims identical"});
  expect_throws<TypeError>([&] { (void)DTensor::from_local(replicated({2}), mesh, {Shard{0}}); },
                           {"placement S(0) claims distinct pieces"});
  expect_throws<TypeError>([&] { (void)DTensor::from_local(partial({2}), mesh, {Replicate{}}); },
                           {"to_local + from_local on a Partial"});
  // The claims that hold, with the value they mean.
  const LocalTensor p = partial({2});
  const DTensor d = DTensor::from_local(p, mesh, {Partial{}});
  EXPECT_TRUE(allclose(d.full_tensor(), sum_of(p), 1e-5, 1e-5));
  const LocalTensor i = invariant({2});
  EXPECT_TRUE(allclose(DTensor::from_local(i, mesh, {Replicate{}}).full_tensor(), i.shard(0)));
}

TEST_F(Typed, FromLocalReplicateOfRNeedsPartialGradient) {
  // An R piece's gradient is pending a sum; handing it back reduced reduces it twice.
  LocalTensor w = replicated({2});
  w.requires_grad_();
  expect_throws<TypeError>([&] { (void)DTensor::from_local(w * 2.0, mesh, {Replicate{}}); },
                           {"must stay Partial", "grad_placements"});
  const DTensor ok =
      DTensor::from_local(w * 2.0, mesh, {Replicate{}}, std::nullopt, Placements{Partial{}});
  backward(sum(ok));
  // d/dw sum(2w) = 2, as a pending sum: the parts sum to 2.
  EXPECT_EQ(type_of(w.grad(), "tp"), SpmdType::P);
  EXPECT_TRUE(allclose(sum_of(w.grad()), full({2}, 2.0), 1e-5, 1e-5));
}

TEST_F(Typed, UntypedValuesCarryNothing) {
  // The rank-list forms (what DTensor and the collectives use inside) never type.
  const LocalTensor x =
      LocalTensor::from_fn(std::vector<int>{0, 1}, [](int r) { return full({1}, r); });
  EXPECT_EQ(x.spmd_types(), nullptr);
  EXPECT_TRUE(x.types().empty());
  EXPECT_EQ((relu(x) * 2.0).spmd_types(), nullptr);
  // Inside a DTensor the pieces are untyped: its placements say what they are.
  const DTensor d = DTensor::from_local(varying({2}), mesh, {Shard{0}});
  EXPECT_EQ(d.local().spmd_types(), nullptr);
}

}  // namespace
}  // namespace spmd
