// Dynamic loss scaling (spmd/nn/grad_scaler.h): the skip path on overflow (on every rank, when one
// rank's piece overflows), the unscaled step equal to the step without scaling, the scale's
// backoff and growth, clip_grad_norm on non-finite gradients, and --spmd-debug=nan quiet inside
// the scaler's window and loud outside it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <spmd/debug/checks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/nn/grad_scaler.h>
#include <spmd/nn/optim.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(GradScaler, SkipsTheStepOnOverflowAndBacksOff) {
  Tensor w = full({4}, 1.0);
  w.requires_grad_();
  SGD<Tensor> opt({&w}, {.lr = 0.1});
  GradScaler<Tensor> scaler;
  // d loss / d w = 1e35, times 65536: beyond f32's range.
  backward(scaler.scale(sum(w * 1e35)));
  EXPECT_FALSE(scaler.step(opt, {&w}));
  scaler.update();
  EXPECT_TRUE(allclose(w, full({4}, 1.0), 0.0, 0.0));
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_DOUBLE_EQ(scaler.scale_value(), 32768.0);
}

TEST(GradScaler, TheUnscaledStepIsTheStepWithoutScalingAndTheScaleGrows) {
  const Tensor start = randn({3, 5}, 7);
  Tensor plain = start.clone();
  Tensor scaled = start.clone();
  plain.requires_grad_();
  scaled.requires_grad_();
  SGD<Tensor> plain_opt({&plain}, {.lr = 0.05});
  SGD<Tensor> scaled_opt({&scaled}, {.lr = 0.05});
  GradScaler<Tensor> scaler({.init_scale = 1024.0, .growth_interval = 2});
  for (int step = 0; step < 3; ++step) {
    backward(sum(plain * plain * 0.5));
    plain_opt.step();
    backward(scaler.scale(sum(scaled * scaled * 0.5)));
    EXPECT_TRUE(scaler.step(scaled_opt, {&scaled}));
    scaler.update();
    // Powers of two scale exactly: the same bits.
    EXPECT_TRUE(allclose(scaled, plain, 0.0, 0.0)) << "step " << step;
  }
  EXPECT_DOUBLE_EQ(scaler.scale_value(), 2048.0);  // grown once after two good steps
  EXPECT_EQ(scaler.skipped_steps(), 0);
  GradScaler<Tensor> off({.enabled = false});
  EXPECT_TRUE(allclose(off.scale(full({1}, 3.0)), full({1}, 3.0), 0.0, 0.0));
}

// One rank's piece overflows: every rank skips, every piece stays.
SPMD_TEST(GradScaler, OverflowOnOneRankSkipsTheStepOnEveryRank) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  const int64_t rows = 2 * world.size();
  DTensor w = distribute_tensor(full({rows, 3}, 1.0), mesh, {Shard{0}});
  w.requires_grad_();
  std::vector<DTensor*> params{&w};
  AdamW<DTensor> opt(params, {.lr = 0.1});
  GradScaler<DTensor> scaler;
  Tensor c = full({rows, 3}, 1.0);
  c.data<float>()[c.numel() - 1] = 1e35f;  // the last row: the last rank's piece
  const DTensor weights = distribute_tensor(c, mesh, {Shard{0}});
  backward(scaler.scale(sum(w * weights)));
  EXPECT_FALSE(scaler.step(opt, params));
  scaler.update();
  EXPECT_TRUE(allclose(w.full_tensor(), full({rows, 3}, 1.0), 0.0, 0.0));
  EXPECT_EQ(opt.steps(), 0);
  // The next step, without the overflow, goes through at the lower scale (the skipped step's
  // gradients dropped first, as every training loop does).
  opt.zero_grad();
  backward(scaler.scale(sum(w * 2.0)));
  EXPECT_TRUE(scaler.step(opt, params));
  scaler.update();
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_DOUBLE_EQ(scaler.scale_value(), 32768.0);
}

TEST(GradScaler, ClipGradNormLeavesNonFiniteGradientsForTheScaler) {
  Tensor w = full({4}, 1.0);
  w.requires_grad_();
  backward(sum(w * 1e38 * 1e38));
  const double norm = clip_grad_norm(std::vector<Tensor*>{&w}, 1.0);
  EXPECT_TRUE(std::isinf(norm));
  EXPECT_TRUE(std::isinf(w.grad().to_vector<float>()[0]));  // not turned into NaN
}

TEST(GradScaler, NanChecksAreQuietInsideTheWindowOnly) {
  World world = World::sim(2);
  set_debug(world, DebugOptions{.nan = true});
  const DeviceMesh mesh = init_device_mesh(world, {2}, {"dp"});
  DTensor w = distribute_tensor(full({4}, 1.0), mesh, {Shard{0}});
  w.requires_grad_();
  std::vector<DTensor*> params{&w};
  SGD<DTensor> opt(params, {.lr = 0.1});
  {
    GradScaler<DTensor> scaler;
    backward(scaler.scale(sum(w * 1e35)));  // scaled: inf, no report
    EXPECT_FALSE(scaler.step(opt, params));
    scaler.update();
    expect_throws<NonFiniteError>([&] { (void)(w * 1e35 * 1e35); }, {"--spmd-debug=nan"});
  }
  set_debug(world, DebugOptions{});
}

TEST(GradScaler, BadOptionsAreConfigErrors) {
  expect_throws<ConfigError>([] { GradScaler<Tensor> s({.init_scale = 0.0}); },
                             {"GradScaler: init_scale must be a positive finite number, got 0"});
  expect_throws<ConfigError>([] { GradScaler<Tensor> s({.growth_factor = 1.0}); },
                             {"growth_factor must be above 1"});
  expect_throws<ConfigError>([] { GradScaler<Tensor> s({.backoff_factor = 1.0}); },
                             {"backoff_factor must be in (0, 1)"});
  expect_throws<ConfigError>([] { GradScaler<Tensor> s({.growth_interval = 0}); },
                             {"growth_interval must be at least 1"});
}

}  // namespace
}  // namespace spmd
