// The chunked cross-entropy (nn/loss.h, Note [Chunked cross-entropy]) against the unchunked loss
// on full tensors: values and the gradients of h and w, with ignored targets, label smoothing,
// uneven chunks, Mean and Sum, on one device and on a (dp, tp) mesh with a vocabulary-parallel w.
#include <gtest/gtest.h>

#include <spmd/dtensor/ops.h>
#include <spmd/nn/loss.h>
#include <spmd/nn/parallel.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

struct Case {
  Tensor h, w, targets;
};

Case make_case() {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 24; ++i) t.push_back(i % 5 == 3 ? -100 : (i * 7) % 16);
  return {randn({4, 6, 8}, 1, DType::F64), randn({8, 16}, 2, DType::F64), from_vector(t, {4, 6})};
}

struct Reference {
  double loss;
  Tensor dh, dw;
};

Reference reference(const Case& c, const ChunkedLossOptions& o) {
  Tensor h = c.h.clone().requires_grad_();
  Tensor w = c.w.clone().requires_grad_();
  const Tensor loss = cross_entropy(reshape(matmul(h, w), {-1, 16}), reshape(c.targets, {-1}),
                                    CrossEntropyOptions{.reduction = o.reduction,
                                                        .ignore_index = o.ignore_index,
                                                        .label_smoothing = o.label_smoothing});
  backward(loss);
  return {loss.item<double>(), h.grad(), w.grad()};
}

TEST(ChunkedCrossEntropy, EqualsTheUnchunkedLossAndGradients) {
  const Case c = make_case();
  for (const ChunkedLossOptions& o :
       {ChunkedLossOptions{.chunks = 4, .dim = 1},
        ChunkedLossOptions{.chunks = 3, .dim = 0, .reduction = LossReduction::Sum},
        ChunkedLossOptions{.chunks = 6, .dim = 1, .label_smoothing = 0.1},
        ChunkedLossOptions{.chunks = 1, .dim = -2}}) {
    SCOPED_TRACE(fmt::format("chunks {} dim {}", o.chunks, o.dim));
    const Reference ref = reference(c, o);
    Tensor h = c.h.clone().requires_grad_();
    Tensor w = c.w.clone().requires_grad_();
    const Tensor loss = chunked_cross_entropy(h, w, c.targets, o);
    EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-12);
    backward(loss * 2.0);
    EXPECT_TRUE(allclose(h.grad(), ref.dh * 2.0, 1e-12, 1e-12));
    EXPECT_TRUE(allclose(w.grad(), ref.dw * 2.0, 1e-12, 1e-12));
    NoGradGuard no_grad;
    EXPECT_NEAR(chunked_cross_entropy(c.h, c.w, c.targets, o).item<double>(), ref.loss, 1e-12);
  }
  expect_throws<ShapeError>([&] { chunked_cross_entropy(c.h, c.w, c.h); },
                            {"chunked_cross_entropy", "[4, 6, 8]"});
  expect_throws<ConfigError>([&] { chunked_cross_entropy(c.h, c.w, c.targets, {.dim = 2}); },
                             {"chunked_cross_entropy", "dim 2"});
  expect_throws<ConfigError>([&] { chunked_cross_entropy(c.h, c.w, c.targets, {.chunks = 0}); },
                             {"chunked_cross_entropy", "chunks"});
}

// Rows over dp, the vocabulary over tp (Megatron's loss on every slice), chunked along the
// sequence.
SPMD_TEST(ChunkedCrossEntropy, VocabularyParallelMatchesOneDevice) {
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
  const Case c = make_case();
  const ChunkedLossOptions o{.chunks = 4, .dim = 1};
  const Reference ref = reference(c, o);
  DTensor h = distribute_tensor(c.h, mesh, {Shard{0}, Replicate{}});
  DTensor w = distribute_tensor(c.w, mesh, colwise_placements(mesh, "tp"));
  h.requires_grad_();
  w.requires_grad_();
  const DTensor targets = distribute_tensor(c.targets, mesh, {Shard{0}, Replicate{}});
  const DTensor loss = chunked_cross_entropy(h, w, targets, o);
  EXPECT_NEAR(loss.full_tensor().item<double>(), ref.loss, 1e-12);
  backward(loss);
  EXPECT_TRUE(allclose(h.grad().full_tensor(), ref.dh, 1e-12, 1e-12));
  EXPECT_TRUE(allclose(w.grad().full_tensor(), ref.dw, 1e-12, 1e-12));
  EXPECT_EQ(w.grad().placements(), w.placements());
}

}  // namespace
}  // namespace spmd
