// Activation checkpointing (Note [Recompute] in spmd/nn/recompute.h): the gradients of every input
// and of every parameter the function captures equal those without recompute, on Tensors and on
// examples/gpt's model with tensor + sequence parallelism and dropout (under sim, threads and
// mpirun); the function runs again in backward only.
#include <gtest/gtest.h>

#include <vector>

#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/nn/recompute.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/random.h>
#include "examples/gpt_model.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

TEST(Recompute, GradientsOfInputsAndCapturedParametersAreTheSame) {
  const Tensor x0 = randn({4, 6}, 1, DType::F64);
  const Tensor w0 = randn({6, 6}, 2, DType::F64);
  int runs = 0;
  auto run = [&](bool recompute) {
    Tensor x = x0.clone();
    Tensor w = w0.clone();
    x.requires_grad_();
    w.requires_grad_();
    std::function<Tensor(const std::vector<Tensor>&)> fn = [&](const std::vector<Tensor>& in) {
      ++runs;
      return tanh(matmul(in[0], w)) * in[0];
    };
    const Tensor y = recompute ? checkpoint_activations(fn, {x}) : fn({x});
    backward(sum(y * y));
    return std::pair{x.grad(), w.grad()};
  };
  const auto plain = run(false);
  runs = 0;
  const auto again = run(true);
  EXPECT_EQ(runs, 2);  // the forward without recording, the recompute in backward
  EXPECT_TRUE(allclose(again.first, plain.first, 0.0, 0.0));
  EXPECT_TRUE(allclose(again.second, plain.second, 0.0, 0.0));
  // Without grad mode, or with no input in autograd, the function just runs once.
  runs = 0;
  std::function<Tensor(const std::vector<Tensor>&)> twice = [&](const std::vector<Tensor>& in) {
    ++runs;
    return in[0] * 2.0;
  };
  EXPECT_TRUE(allclose(checkpoint_activations(twice, {x0}), x0 * 2.0, 0.0, 0.0));
  EXPECT_EQ(runs, 1);
}

// examples/gpt's model (TP + SP, dropout on, F64) with every block recomputed: the loss and every
// parameter's gradient are those without recompute.
SPMD_TEST(Recompute, GptBlocksRecomputedGiveTheSameGradients) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  gpt_model::Config c;
  c.dtype = DType::F64;
  std::string text;
  for (int i = 0; i < 4000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  const gpt_model::ModelLayout layout{init_device_mesh(world, {2, 4}, {"dp", "tp"}), false};
  const gpt_model::Parallel par{false};
  auto grads_of = [&](bool recompute, double* loss_value) {
    gpt_model::Model<DTensor> m = gpt_model::init_model<DTensor>(c, &layout);
    const DTensor tokens =
        gpt_model::place_tokens<DTensor>(gpt_model::batch_tokens(c, text, 0), &layout);
    DTensor x = gpt_model::embed(c, par, m, tokens, 0);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      std::function<DTensor(const std::vector<DTensor>&)> fn = [&,
                                                                l](const std::vector<DTensor>& in) {
        return gpt_model::block(c, par, m.blocks[l], static_cast<int64_t>(l), in[0], 0);
      };
      x = recompute ? checkpoint_activations(fn, {x}) : fn({x});
    }
    const DTensor loss = gpt_model::next_token_loss(c, gpt_model::logits_of(par, m, x), tokens);
    *loss_value = gpt_model::scalar(loss);
    backward(loss);
    std::vector<Tensor> out;
    for (DTensor* p : m.params()) out.push_back(p->grad().full_tensor());
    return out;
  };
  double plain_loss = 0.0, recomputed_loss = 0.0;
  const std::vector<Tensor> plain = grads_of(false, &plain_loss);
  const std::vector<Tensor> recomputed = grads_of(true, &recomputed_loss);
  EXPECT_DOUBLE_EQ(recomputed_loss, plain_loss);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(allclose(recomputed[i], plain[i], 1e-12, 1e-14)) << "parameter " << i;
  }
}

// A selective recompute (Note [Selective recompute]) gives the same gradients; the recompute takes
// the matmul's output from the first forward and computes the rest again. A recompute that calls
// the kept ops differently is an Error naming the op.
TEST(Recompute, SelectiveKeepsTheMatmulsOfTheFirstForward) {
  const Tensor x0 = randn({4, 6}, 1, DType::F64);
  const Tensor w0 = randn({6, 6}, 2, DType::F64);
  int runs = 0;
  auto run = [&](const RecomputePolicy* policy, bool extra_matmul_again) {
    Tensor x = x0.clone().requires_grad_();
    Tensor w = w0.clone().requires_grad_();
    std::function<Tensor(const std::vector<Tensor>&)> fn = [&](const std::vector<Tensor>& in) {
      ++runs;
      Tensor h = tanh(matmul(in[0], w));
      if (extra_matmul_again && runs == 2) h = matmul(h, w);
      return h * in[0];
    };
    const Tensor y = policy != nullptr ? checkpoint_activations(fn, {x}, *policy) : fn({x});
    backward(sum(y * y));
    return std::pair{x.grad(), w.grad()};
  };
  const auto plain = run(nullptr, false);
  const RecomputePolicy matmuls = save_matmuls();
  runs = 0;
  const auto selective = run(&matmuls, false);
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(allclose(selective.first, plain.first, 0.0, 0.0));
  EXPECT_TRUE(allclose(selective.second, plain.second, 0.0, 0.0));
  runs = 0;
  testing::expect_throws<Error>([&] { (void)run(&matmuls, true); },
                                {"checkpoint_activations: the recompute in backward calls "
                                 "'matmul' more often than the first forward did (1 kept "
                                 "outputs)"});
  // LocalTensor functions run their ops per rank: no selective policy.
  const World world = World::sim(2);
  const LocalTensor lx = LocalTensor::from_fn(world, [&](int) { return x0; });
  std::function<LocalTensor(const std::vector<LocalTensor>&)> local =
      [](const std::vector<LocalTensor>& in) { return in[0] * 2.0; };
  testing::expect_throws<Unsupported>(
      [&] { (void)checkpoint_activations(local, {lx}, matmuls); },
      {"checkpoint_activations: a selective policy keeps the outputs of Tensor and DTensor ops"});
}

// examples/gpt's blocks with the matmuls kept: the same loss and gradients as without recompute,
// and the backward runs every forward matmul fewer than a full recompute (counted as DTensor op
// events: a kept output is taken, not computed).
SPMD_TEST(Recompute, SelectiveGptBlocksSkipTheirMatmulsInBackward) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  gpt_model::Config c;
  c.dtype = DType::F64;
  std::string text;
  for (int i = 0; i < 4000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  const gpt_model::ModelLayout layout{init_device_mesh(world, {2, 4}, {"dp", "tp"}), false};
  const gpt_model::Parallel par{false};
  const RecomputePolicy matmuls = save_matmuls();
  struct Result {
    double loss = 0.0;
    std::vector<Tensor> grads;
    int forward_matmuls = 0;
    int backward_matmuls = 0;
  };
  const RecomputePolicy alternate = save_alternate_matmuls();
  auto run = [&](int mode) {  // 0: plain, 1: full recompute, 2: selective, 3: every other matmul
    Result r;
    int matmul_events = 0;
    // This world's events only (under threads every rank thread's observer sees every event).
    const int observer = add_op_observer([&](const OpEvent& e) {
      if (e.op == "matmul" && e.output.mesh().world() == world) ++matmul_events;
    });
    gpt_model::Model<DTensor> m = gpt_model::init_model<DTensor>(c, &layout);
    const DTensor tokens =
        gpt_model::place_tokens<DTensor>(gpt_model::batch_tokens(c, text, 0), &layout);
    DTensor x = gpt_model::embed(c, par, m, tokens, 0);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      std::function<DTensor(const std::vector<DTensor>&)> fn = [&,
                                                                l](const std::vector<DTensor>& in) {
        return gpt_model::block(c, par, m.blocks[l], static_cast<int64_t>(l), in[0], 0);
      };
      x = mode == 0   ? fn({x})
          : mode == 1 ? checkpoint_activations(fn, {x})
          : mode == 2 ? checkpoint_activations(fn, {x}, matmuls)
                      : checkpoint_activations(fn, {x}, alternate);
    }
    const DTensor loss = gpt_model::next_token_loss(c, gpt_model::logits_of(par, m, x), tokens);
    r.forward_matmuls = matmul_events;
    r.loss = gpt_model::scalar(loss);
    backward(loss);
    r.backward_matmuls = matmul_events - r.forward_matmuls;
    remove_op_observer(observer);
    for (DTensor* p : m.params()) r.grads.push_back(p->grad().full_tensor());
    return r;
  };
  const Result plain = run(0);
  const Result full = run(1);
  const Result selective = run(2);
  EXPECT_DOUBLE_EQ(selective.loss, plain.loss);
  ASSERT_EQ(selective.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(allclose(selective.grads[i], plain.grads[i], 1e-12, 1e-14)) << "parameter " << i;
  }
  // Each block has 6 matmuls (q, k, v, the output projection, the MLP's two).
  const int block_matmuls = 6 * static_cast<int>(c.layers);
  EXPECT_EQ(full.backward_matmuls - selective.backward_matmuls, block_matmuls);
  EXPECT_EQ(full.backward_matmuls - plain.backward_matmuls, block_matmuls);
  // torchtitan's "op" policy keeps the 1st, 3rd and 5th matmul of each block and recomputes the
  // others, with the same gradients.
  const Result every_other = run(3);
  EXPECT_EQ(full.backward_matmuls - every_other.backward_matmuls, block_matmuls / 2);
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(allclose(every_other.grads[i], plain.grads[i], 1e-12, 1e-14)) << "parameter " << i;
  }
}

}  // namespace
}  // namespace spmd
