// Activation checkpointing (Note [Recompute] in spmd/nn/recompute.h): the gradients of every input
// and of every parameter the function captures equal those without recompute, on Tensors and on
// examples/gpt's model with tensor + sequence parallelism and dropout (under sim, threads and
// mpirun); the function runs again in backward only.
#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace spmd
