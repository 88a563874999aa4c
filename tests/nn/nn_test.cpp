// The nn module (nn/parallel.h, nn/optim.h) against full tensors and closed forms: the parallel
// styles' placements and collectives, FSDP's gather and reduce-scatter, SGD with momentum and
// AdamW (DTensor parameters equal Tensor parameters step for step, state placed like the
// parameter, no communication in a step), and clip_grad_norm across the parameters of one mesh
// and of several; and that training steps in steady state take every tensor buffer from the
// CPU caching allocator.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include <spmd/collectives/trace.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/nn/optim.h>
#include <spmd/nn/parallel.h>
#include <spmd/tensor/storage.h>
#include "examples/gpt_model.h"
#include "tests/support/collectives_since.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

using test_support::collectives_since;

// Where a test's collectives start in the trace. The trace is a ring buffer (the earlier tests
// of this process can fill it, and then its size stops growing): it is cleared first, except
// under threads, where every rank shares it (and the tests check no order there).
size_t trace_start(const World& world) {
  if (world.backend_name() != "threads") trace().clear();
  return trace().records().size();
}

DeviceMesh dp_tp(const World& world) {
  return init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
}

SPMD_TEST(ParallelStyles, PlacementsOfEachStyle) {
  const DeviceMesh mesh = dp_tp(world);
  EXPECT_EQ(colwise_placements(mesh, "tp"), (Placements{Replicate{}, Shard{1}}));
  EXPECT_EQ(colwise_bias_placements(mesh, "tp"), (Placements{Replicate{}, Shard{0}}));
  EXPECT_EQ(rowwise_placements(mesh, "tp"), (Placements{Replicate{}, Shard{0}}));
  EXPECT_EQ(replicate_placements(mesh), (Placements{Replicate{}, Replicate{}}));
  // FSDP takes the first dim tensor parallelism leaves free.
  EXPECT_EQ(fsdp_placements(colwise_placements(mesh, "tp"), {8, 32}, mesh, "dp"),
            (Placements{Shard{0}, Shard{1}}));
  EXPECT_EQ(fsdp_placements(rowwise_placements(mesh, "tp"), {32, 8}, mesh, "dp"),
            (Placements{Shard{1}, Shard{0}}));
  EXPECT_EQ(fsdp_placements(replicate_placements(mesh), {8}, mesh, "dp"),
            (Placements{Shard{0}, Replicate{}}));
  EXPECT_EQ(fsdp_placements(colwise_bias_placements(mesh, "tp"), {8}, mesh, "dp"),
            (Placements{Replicate{}, Shard{0}}));
  expect_throws<PlacementError>(
      [&] {
        fsdp_placements({Shard{0}, Replicate{}}, {8, 4}, mesh, "dp");
      },
      {"fsdp_placements", "Replicate on the FSDP dim dp"});
}

// A Megatron MLP with sequence parallelism: x [B, S, H] sharded over the sequence on tp; the
// column-wise layer gathers it, the row-wise one reduce-scatters back. Values and gradients equal
// the full tensors'; the collectives over tp are one all_gather forward, one reduce_scatter, and
// their transposes backward, plus the all_reduce of the replicated output bias's gradient (summed
// over the sequence shards, as Megatron's sequence parallelism all-reduces it).
SPMD_TEST(ParallelStyles, SequenceParallelMlpMatchesFullTensors) {
  const DeviceMesh mesh = dp_tp(world);
  const int64_t tp = mesh.size("tp");
  const Shape xs = {2, 2 * tp, 6};
  const Tensor x = randn(xs, 1, DType::F64);
  const Tensor w1 = randn({6, 4 * tp}, 2, DType::F64);
  const Tensor b1 = randn({4 * tp}, 3, DType::F64);
  const Tensor w2 = randn({4 * tp, 6}, 4, DType::F64);
  const Tensor b2 = randn({6}, 5, DType::F64);
  DTensor dw1 = distribute_tensor(w1, mesh, colwise_placements(mesh, "tp"));
  DTensor db1 = distribute_tensor(b1, mesh, colwise_bias_placements(mesh, "tp"));
  DTensor dw2 = distribute_tensor(w2, mesh, rowwise_placements(mesh, "tp"));
  DTensor db2 = distribute_tensor(b2, mesh, replicate_placements(mesh));
  for (DTensor* p : {&dw1, &db1, &dw2, &db2}) p->requires_grad_();
  DTensor dx = distribute_tensor(x, mesh, {Shard{0}, Shard{1}});
  dx.requires_grad_();
  const size_t start = trace_start(world);
  const DTensor h = colwise_linear(dx, dw1, db1, "tp");
  EXPECT_EQ(h.placements(), (Placements{Shard{0}, Shard{2}}));
  const DTensor y = rowwise_linear(gelu(h), dw2, db2, "tp", Shard{1});
  EXPECT_EQ(y.placements(), (Placements{Shard{0}, Shard{1}}));
  const DTensor loss = sum(y * y);
  backward(loss);
  std::vector<std::string> tp_collectives;
  for (const std::string& c : collectives_since(start, world.held_ranks()[0])) {
    if (c.ends_with(" tp")) tp_collectives.push_back(c);
  }
  if (world.backend_name() != "threads") {  // (threads: one shared trace, in no rank's order)
    EXPECT_EQ(tp_collectives,
              (std::vector<std::string>{"all_gather tp", "reduce_scatter tp", "all_reduce tp",
                                        "all_gather tp", "reduce_scatter tp"}));
  }
  // The same on full tensors.
  Tensor fx = x.clone().requires_grad_();
  Tensor fw1 = w1.clone().requires_grad_(), fb1 = b1.clone().requires_grad_();
  Tensor fw2 = w2.clone().requires_grad_(), fb2 = b2.clone().requires_grad_();
  const Tensor fy = matmul(gelu(matmul(fx, fw1) + fb1), fw2) + fb2;
  backward(sum(fy * fy));
  EXPECT_TRUE(allclose(y.full_tensor(), fy, 1e-12, 1e-12));
  EXPECT_TRUE(allclose(dx.grad().full_tensor(), fx.grad(), 1e-10, 1e-10));
  EXPECT_EQ(dx.grad().placements(), dx.placements());
  EXPECT_TRUE(allclose(dw1.grad().full_tensor(), fw1.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(db1.grad().full_tensor(), fb1.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(dw2.grad().full_tensor(), fw2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(allclose(db2.grad().full_tensor(), fb2.grad(), 1e-10, 1e-10));
  for (DTensor* p : {&dw1, &db1, &dw2, &db2}) EXPECT_EQ(p->grad().placements(), p->placements());
}

// FSDP: the parameter is stored split over dp, gathered for use (all_gather), gathered again in
// backward for the matmul that saved it (Note [Regathered parameters]: FSDP2's
// reshard_after_forward), and its gradient, P(sum) over dp, comes back reduce-scattered to the
// shard.
SPMD_TEST(ParallelStyles, FsdpGathersForUseAndReduceScattersTheGradient) {
  const DeviceMesh mesh = dp_tp(world);
  const Tensor w = randn({6, 8}, 1, DType::F64);
  const Tensor x = randn({4, 6}, 2, DType::F64);
  DTensor p = distribute_tensor(
      w, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w.shape(), mesh, "dp"));
  p.requires_grad_();
  EXPECT_EQ(p.placements(), (Placements{Shard{0}, Shard{1}}));
  const size_t start = trace_start(world);
  const DTensor used = fsdp_unshard(p, "dp");
  EXPECT_EQ(used.placements(), (Placements{Replicate{}, Shard{1}}));
  const DTensor y = matmul(distribute_tensor(x, mesh, {Shard{0}, Replicate{}}), used);
  backward(sum(y));
  if (world.backend_name() != "threads") {
    EXPECT_EQ(collectives_since(start, world.held_ranks()[0]),
              (std::vector<std::string>{"all_gather dp", "all_gather dp", "reduce_scatter dp"}));
  }
  EXPECT_EQ(p.grad().placements(), p.placements());
  const Tensor leaf = w.clone().requires_grad_();
  backward(sum(matmul(x, leaf)));
  EXPECT_TRUE(allclose(p.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
}

// ---- optimizers ------------------------------------------------------------------------------

// Gradients of sum((x w)^2) for a few steps; the DTensor parameter (placed `placements`) must
// follow the Tensor one, and the state must have the parameter's placements.
template <class Make>
void compare_optimizer(const World& world, const Placements& placements, Make make) {
  const DeviceMesh mesh = dp_tp(world);
  const Tensor w0 = randn({6, 8}, 1, DType::F64);
  const Tensor x = randn({4, 6}, 2, DType::F64);
  Tensor tw = w0.clone().requires_grad_();
  DTensor dw = distribute_tensor(w0, mesh, placements);
  dw.requires_grad_();
  auto t_opt = make(std::vector<Tensor*>{&tw});
  auto d_opt = make(std::vector<DTensor*>{&dw});
  const DTensor dx = distribute_tensor(x, mesh, {Replicate{}, Replicate{}});
  for (int step = 0; step < 3; ++step) {
    const Tensor ty = matmul(x, tw);
    backward(sum(ty * ty));
    t_opt.step();
    const DTensor dy = matmul(dx, dw);
    backward(sum(dy * dy));
    const size_t start = trace_start(world);
    d_opt.step();
    if (world.backend_name() != "threads") {  // (threads: the backward's records land late)
      EXPECT_TRUE(collectives_since(start, world.held_ranks()[0]).empty()) << "step " << step;
    }
    EXPECT_EQ(dw.placements(), placements);
    EXPECT_TRUE(dw.requires_grad());
    EXPECT_FALSE(dw.grad().defined());
    EXPECT_TRUE(allclose(dw.full_tensor(), tw, 1e-12, 1e-12)) << "step " << step;
  }
}

SPMD_TEST(Optimizers, SgdWithMomentumMatchesTheClosedFormAndTensors) {
  // One parameter, gradient 2 w (loss w^2): b1 = 2 w0, w1 = w0 - lr b1; b2 = m b1 + 2 w1.
  const double lr = 0.1, m = 0.9;
  Tensor w = full({3}, 1.5, DType::F64).requires_grad_();
  SGD opt(std::vector<Tensor*>{&w}, {.lr = lr, .momentum = m});
  backward(sum(w * w));
  opt.step();
  const double w1 = 1.5 - lr * 3.0;
  EXPECT_TRUE(allclose(w, full({3}, w1, DType::F64), 1e-15, 0));
  backward(sum(w * w));
  opt.step();
  EXPECT_TRUE(allclose(w, full({3}, w1 - lr * (m * 3.0 + 2 * w1), DType::F64), 1e-15, 0));

  const DeviceMesh mesh = dp_tp(world);
  for (const Placements& p : {Placements{Replicate{}, Shard{1}}, Placements{Shard{0}, Shard{1}},
                              Placements{Replicate{}, Replicate{}}}) {
    SCOPED_TRACE(to_string(p));
    compare_optimizer(world, p, [](auto params) {
      return SGD(params, {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
    });
  }
  DTensor d = distribute_tensor(randn({6, 8}, 1, DType::F64), mesh, {Shard{0}, Shard{1}});
  d.requires_grad_();
  SGD dopt(std::vector<DTensor*>{&d}, {.lr = 0.1, .momentum = 0.5});
  backward(sum(d * d));
  dopt.step();
  EXPECT_EQ(dopt.momentum_buffer(0).placements(), d.placements());
}

SPMD_TEST(Optimizers, AdamWMatchesTheClosedFormAndTensors) {
  // The first step moves every element by lr * g / (|g| + eps) after the decay: about lr.
  const double lr = 0.01, wd = 0.1;
  Tensor w = from_vector<double>({2.0, -1.0, 0.5}).requires_grad_();
  AdamW opt(std::vector<Tensor*>{&w}, {.lr = lr, .weight_decay = wd});
  backward(sum(w * w));
  opt.step();
  std::vector<double> want;
  for (double v : {2.0, -1.0, 0.5}) {
    const double g = 2 * v;
    want.push_back(v * (1 - lr * wd) - lr * g / (std::abs(g) + 1e-8));
  }
  EXPECT_TRUE(allclose(w, from_vector(want), 1e-12, 1e-12)) << w;
  EXPECT_EQ(opt.steps(), 1);

  const DeviceMesh mesh = dp_tp(world);
  for (const Placements& p : {Placements{Replicate{}, Shard{0}}, Placements{Shard{1}, Shard{0}}}) {
    SCOPED_TRACE(to_string(p));
    compare_optimizer(world, p, [](auto params) { return AdamW(params, {.lr = 0.02}); });
  }
  DTensor d = distribute_tensor(randn({6, 8}, 1, DType::F64), mesh, {Shard{0}, Shard{1}});
  d.requires_grad_();
  // A braced list of parameters deduces the optimizer's parameter type.
  AdamW dopt({&d}, {.lr = 1e-3});
  SGD sgd({&d, &d}, {.lr = 0.1});
  static_assert(std::is_same_v<decltype(dopt), AdamW<DTensor>>);
  static_assert(std::is_same_v<decltype(sgd), SGD<DTensor>>);
  backward(sum(d * d));
  dopt.step();
  EXPECT_EQ(dopt.exp_avg(0).placements(), d.placements());
  EXPECT_EQ(dopt.exp_avg_sq(0).placements(), d.placements());
}

// The update as AdamW wrote it before it was one op (Note [Fused AdamW] in ops/optim.cpp): eleven
// ops, each rounding to the dtype.
std::vector<Tensor> composed_adamw(const Tensor& p, const Tensor& g, const Tensor& m,
                                   const Tensor& v, const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  const double step_size = s.lr / (1.0 - std::pow(s.beta1, t));
  const double sqrt_correction = std::sqrt(1.0 - std::pow(s.beta2, t));
  const Tensor m1 = m * s.beta1 + g * (1.0 - s.beta1);
  const Tensor v1 = v * s.beta2 + g * g * (1.0 - s.beta2);
  const Tensor denom = sqrt(v1) * (1.0 / sqrt_correction) + s.eps;
  const Tensor value = s.weight_decay != 0.0 ? p * (1.0 - s.lr * s.weight_decay) : p;
  return {value - m1 / denom * step_size, m1, v1};
}

SPMD_TEST(Optimizers, FusedAdamWStepGivesTheComposedUpdatesBits) {
  // 4099 elements: the vector loops' tails too; gradients over six orders of magnitude.
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (const AdamWStep& s :
         {AdamWStep{.lr = 3e-3, .weight_decay = 0.1, .step = 1}, AdamWStep{.lr = 0.02,
                                                                 .beta1 = 0.8,
                                                                 .beta2 = 0.95,
                                                                 .eps = 1e-6,
                                                                 .weight_decay = 0.0,
                                                                 .step = 7}}) {
      SCOPED_TRACE(fmt::format("{} step {} wd {}", dtype, s.step, s.weight_decay));
      const Tensor p = randn({4099}, 1).to(dtype);
      const Tensor g = (randn({4099}, 2) * exp(randn({4099}, 3) * 3.0)).to(dtype);
      const Tensor m = (randn({4099}, 4) * 0.1).to(dtype);
      const Tensor v = (abs(randn({4099}, 5)) * 0.01).to(dtype);
      const Tensor fused = adamw_step(p, g, m, v, s);
      ASSERT_EQ(fused.shape(), (Shape{3, 4099}));
      const std::vector<Tensor> want = composed_adamw(p, g, m, v, s);
      for (int64_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(equal(select(fused, 0, i), want[static_cast<size_t>(i)]))
            << "output " << i << ": max |diff| "
            << max_abs_diff(select(fused, 0, i).to(DType::F64),
                            want[static_cast<size_t>(i)].to(DType::F64));
      }
    }
  }
  // AdamW over three steps moves its parameter, and keeps its moments, as the composed update.
  Tensor w = randn({5, 7}, 6).requires_grad_();
  Tensor p = w.detach(), m = zeros({5, 7}), v = zeros({5, 7});
  AdamW opt(std::vector<Tensor*>{&w}, {.lr = 0.05, .weight_decay = 0.1});
  for (int64_t step = 1; step <= 3; ++step) {
    backward(sum(w * w * w));
    const Tensor g = w.grad();
    opt.step();
    const std::vector<Tensor> want =
        composed_adamw(p, g, m, v, {.lr = 0.05, .weight_decay = 0.1, .step = step});
    p = want[0], m = want[1], v = want[2];
    EXPECT_TRUE(equal(w, p)) << "step " << step;
    EXPECT_TRUE(equal(opt.exp_avg(0), m)) << "step " << step;
    EXPECT_TRUE(equal(opt.exp_avg_sq(0), v)) << "step " << step;
    EXPECT_TRUE(w.requires_grad());
  }
  // Its inputs and hyperparameters are checked, naming the op.
  const Tensor a = randn({4, 3}, 7);
  expect_throws<ShapeError>(
      [&] {
        adamw_step(a, a, a, randn({3, 4}, 8), {});
      },
      {"adamw_step", "exp_avg_sq", "[3, 4]", "[4, 3]"});
  expect_throws<ShapeError>([&] { adamw_step(a, a.to(DType::F64), a, a, {}); },
                            {"adamw_step", "grad", "f64"});
  expect_throws<Unsupported>(
      [&] {
        const Tensor i = zeros({4, 3}, DType::I64);
        adamw_step(i, i, i, i, {});
      },
      {"adamw_step", "floating", "i64"});
  expect_throws<ConfigError>([&] { adamw_step(a, a, a, a, {.beta1 = 1.0}); },
                             {"adamw_step", "beta1", "[0, 1)"});
  expect_throws<ConfigError>([&] { adamw_step(a, a, a, a, {.lr = NAN}); }, {"adamw_step", "lr"});
  expect_throws<ConfigError>([&] { adamw_step(a, a, a, a, {.step = 0}); },
                             {"adamw_step", "step must be >= 1"});
}

// ---- clip_grad_norm --------------------------------------------------------------------------

SPMD_TEST(ClipGradNorm, TheNormOfAllGradientsTogetherOnOneMeshAndSeveral) {
  const DeviceMesh mesh = dp_tp(world);
  const Tensor a = randn({6, 8}, 1, DType::F64);
  const Tensor b = randn({5}, 2, DType::F64);
  // Gradients 2a and 2b (loss sum(a^2) + sum(b^2)): total 2 sqrt(|a|^2 + |b|^2).
  const double total = 2 * std::sqrt(sum(a * a).item<double>() + sum(b * b).item<double>());
  {
    DTensor pa = distribute_tensor(a, mesh, {Shard{0}, Shard{1}});
    DTensor pb = distribute_tensor(b, mesh, {Replicate{}, Replicate{}});
    pa.requires_grad_();
    pb.requires_grad_();
    backward(sum(pa * pa));
    backward(sum(pb * pb));
    EXPECT_NEAR(clip_grad_norm({&pa, &pb}, 1e9), total, 1e-10);
    // Clipping to 1 scales every gradient by 1 / total.
    EXPECT_NEAR(clip_grad_norm({&pa, &pb}, 1.0), total, 1e-10);
    EXPECT_TRUE(allclose(pa.grad().full_tensor(), a * (2.0 / (total + 1e-6)), 1e-10, 1e-12));
    EXPECT_NEAR(clip_grad_norm({&pa, &pb}, 1e9), total / (total + 1e-6), 1e-10);
  }
  {
    // On two meshes (slices of one root, each with siblings that are replicas): each counted once.
    DTensor pa = distribute_tensor(a, mesh["tp"], {Shard{1}});
    DTensor pb = distribute_tensor(b, mesh["dp"], {Shard{0}});
    pa.requires_grad_();
    pb.requires_grad_();
    backward(sum(pa * pa));
    backward(sum(pb * pb));
    EXPECT_NEAR(clip_grad_norm({&pa, &pb}, 1e9), total, 1e-10);
  }
  Tensor ta = a.clone().requires_grad_();
  Tensor tb = b.clone().requires_grad_();
  backward(sum(ta * ta));
  backward(sum(tb * tb));
  EXPECT_NEAR(clip_grad_norm({&ta, &tb}, 1.0), total, 1e-10);
  EXPECT_TRUE(allclose(ta.grad(), a * (2.0 / (total + 1e-6)), 1e-10, 1e-12));
}

// Non-finite gradients (a loss scaler's overflow) give a NaN total on every rank: the caller skips
// the step. NaN on every rank is one answer, not a DivergenceError ("nan differs from nan").
SPMD_TEST(ClipGradNorm, NaNGradientsGiveANaNTotalNotADivergence) {
  const DeviceMesh mesh = dp_tp(world);
  DTensor w = distribute_tensor(randn({8, 4}, 3, DType::F64), mesh, {Replicate{}, Shard{0}});
  w.requires_grad_();
  backward(sum(w) * std::numeric_limits<double>::quiet_NaN());
  const double total = clip_grad_norm({&w}, 1.0);
  EXPECT_TRUE(std::isnan(total)) << total;
}

// Note [CPU caching allocator]: after the first steps (AdamW's state, the cache filling), a
// training step of examples/gpt's model takes no block of a cached size fresh from the C
// allocator, on full tensors and with tensor + sequence parallelism on (dp, tp).
SPMD_TEST(CachingAllocator, SteadyStateTrainingStepsTakeNoFreshBlocks) {
  if (world.backend_name() == "threads") {
    GTEST_SKIP() << "the ranks' threads share one cache, and how they interleave decides how "
                    "many blocks of a size are live at once";
  }
  gpt_model::Config c;
  c.dtype = DType::F32;
  std::string text;
  for (int i = 0; i < 20000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  auto fresh_blocks_of = [&](auto& model, const gpt_model::ModelLayout* layout, auto par) {
    auto params = model.params();
    AdamW opt(params, gpt_model::adamw_options(c));
    std::vector<uint64_t> fresh;
    for (int64_t step = 0; step < 5; ++step) {
      const Tensor tokens = gpt_model::batch_tokens(c, text, step);
      const uint64_t before = cpu_allocator_stats().fresh_blocks;
      gpt_model::train_step(c, par, model, opt, params, tokens, layout, step);
      fresh.push_back(cpu_allocator_stats().fresh_blocks - before);
    }
    return fresh;
  };
  cpu_allocator_release_cached();  // the earlier tests' blocks: the first step starts empty
  gpt_model::Model<Tensor> single = gpt_model::init_model<Tensor>(c, nullptr);
  const std::vector<uint64_t> single_fresh = fresh_blocks_of(single, nullptr, gpt_model::Single{});
  EXPECT_GT(single_fresh[0], 0u);  // the first step does take blocks: the count is live
  EXPECT_EQ(single_fresh[3], 0u) << "full tensors, step 3";
  EXPECT_EQ(single_fresh[4], 0u) << "full tensors, step 4";
  if (world.size() % 2 != 0) return;
  const gpt_model::ModelLayout layout{dp_tp(world), false};
  gpt_model::Model<DTensor> sharded = gpt_model::init_model<DTensor>(c, &layout);
  const std::vector<uint64_t> sharded_fresh =
      fresh_blocks_of(sharded, &layout, gpt_model::Parallel{});
  EXPECT_EQ(sharded_fresh[3], 0u) << world.backend_name() << ", step 3";
  EXPECT_EQ(sharded_fresh[4], 0u) << world.backend_name() << ", step 4";
}

}  // namespace
}  // namespace spmd
