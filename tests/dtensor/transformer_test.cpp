// The transformer ops on DTensors where their sharding is the point (the conformance table checks
// their values under random placements): the vocabulary-parallel embedding and cross-entropy
// never gather the table or the logits, attention sharded over heads and layer_norm over the
// sequence run without communication, dropout draws the same mask on every mesh, and elementwise
// ops keep their first input's placements (w - lr * dw).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include <spmd/collectives/trace.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/tensor/random.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::pieces_match;

// The collectives recorded since `start` trace records, as "op dim shape" (one per call: rank 0's).
std::vector<std::string> collectives_since(size_t start) {
  std::vector<std::string> out;
  const std::vector<TraceRecord> records = trace().records();
  for (size_t i = start; i < records.size(); ++i) {
    if (records[i].rank == 0) {
      out.push_back(
          fmt::format("{} {} {}", records[i].op, records[i].dim_name, shape_str(records[i].shape)));
    }
  }
  return out;
}

struct Mesh2d {
  World world = World::sim(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
};

TEST(TransformerOps, VocabParallelEmbeddingIsPartialAndItsGradientStaysSharded) {
  Mesh2d m;
  const Tensor table = randn({10, 6}, 1, DType::F64);
  const Tensor ids = from_vector<int64_t>({0, 9, 3, 3, 7, 1, 5, 2}, {2, 4});
  DTensor w = distribute_tensor(table, m.mesh, {Replicate{}, Shard{0}});
  w.requires_grad_();
  const DTensor d_ids = distribute_tensor(ids, m.mesh, {Shard{0}, Replicate{}});
  const size_t start = trace().records().size();
  const DTensor out = embedding(d_ids, w);
  EXPECT_EQ(out.placements(), (Placements{Shard{0}, Partial{}}));
  EXPECT_TRUE(collectives_since(start).empty());
  EXPECT_TRUE(allclose(out.full_tensor(), embedding(ids, table), 1e-12, 1e-12));

  const Tensor g = randn({2, 4, 6}, 2, DType::F64);
  const size_t before_backward = trace().records().size();
  backward(out, distribute_tensor(g, m.mesh, {Shard{0}, Replicate{}}));
  // The gradient is scattered into each rank's own rows: over tp nothing moves; over dp the batch
  // halves' contributions are summed (one all_reduce).
  for (const std::string& c : collectives_since(before_backward)) {
    EXPECT_EQ(c.rfind("all_reduce dp", 0), 0u) << c;
  }
  EXPECT_EQ(w.grad().placements(), w.placements());
  const Tensor table_leaf = table.clone().requires_grad_();
  backward(embedding(ids, table_leaf), g);
  EXPECT_TRUE(allclose(w.grad().full_tensor(), table_leaf.grad(), 1e-12, 1e-12));
}

TEST(TransformerOps, IndicesOutOfRangeAreAShapeError) {
  Mesh2d m;
  const Tensor table = randn({4, 3}, 1);
  testing::expect_throws<ShapeError>(
      [&] {
        embedding(from_vector<int64_t>({1, 4}, {2}), table);
      },
      {"embedding", "[0, 4)"});
  // Under vocabulary parallelism too: each rank checks the global range, not its block's.
  const DTensor w = distribute_tensor(table, m.mesh, {Replicate{}, Shard{0}});
  const DTensor bad =
      distribute_tensor(from_vector<int64_t>({-1, 2}, {2}), m.mesh, {Replicate{}, Replicate{}});
  testing::expect_throws<ShapeError>([&] { embedding(bad, w); }, {"embedding", "[0, 4)"});
  testing::expect_throws<Unsupported>([&] { embedding(randn({2}, 1), table); },
                                      {"embedding", "ids", "I64"});
}

TEST(TransformerOps, VocabParallelCrossEntropyNeverGathersTheLogits) {
  Mesh2d m;
  const int64_t n = 8, classes = 12;
  const Tensor logits = randn({n, classes}, 3, DType::F64);
  const Tensor target = from_vector<int64_t>({0, 11, 5, 5, 3, 8, 1, 10}, {n});
  DTensor x = distribute_tensor(logits, m.mesh, {Shard{0}, Shard{1}});
  x.requires_grad_();
  const DTensor t = distribute_tensor(target, m.mesh, {Shard{0}, Replicate{}});
  // The trace is a ring buffer: after the earlier tests of this process filled it, its size stops
  // growing and `start` would point past this test's records. Start from an empty one.
  trace().clear();
  const size_t start = trace().records().size();
  const DTensor loss = cross_entropy(x, t);
  backward(loss);
  // Megatron's pattern: all_reduces over tp of a value per row (max, sum of exponentials, the
  // target's logit); no collective moves [rows, classes] data.
  int tp_reductions = 0;
  const std::vector<TraceRecord> records = trace().records();
  for (size_t i = start; i < records.size(); ++i) {
    const TraceRecord& r = records[i];
    if (r.rank != 0) continue;
    EXPECT_NE(r.op, "all_gather") << r.dim_name << " " << shape_str(r.shape);
    if (r.dim_name == "tp") {
      EXPECT_EQ(r.op, "all_reduce");
      EXPECT_LE(shape_numel(r.shape), n / 2) << shape_str(r.shape);
      ++tp_reductions;
    }
  }
  EXPECT_GE(tp_reductions, 3);
  const Tensor leaf = logits.clone().requires_grad_();
  const Tensor want = cross_entropy(leaf, target);
  backward(want);
  EXPECT_NEAR(loss.full_tensor().item<double>(), want.item<double>(), 1e-12);
  EXPECT_EQ(x.grad().placements(), x.placements());
  EXPECT_TRUE(allclose(x.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
  // The loss of rows split over dp is one partial sum per rank: P(sum), reduced by full_tensor.
  EXPECT_EQ(
      cross_entropy(distribute_tensor(logits, m.mesh, {Shard{0}, Replicate{}}), t).placements(),
      (Placements{Partial{}, Replicate{}}));
}

// log_softmax's derivative is one entry, log_softmax_backward (grad, y): shards of the other
// dims pass through it with no communication, and a gradient that is a pending sum stays one (it
// is linear in the gradient); the values are the full tensors' gradient.
TEST(TransformerOps, LogSoftmaxBackwardKeepsShardsAndPendingSums) {
  Mesh2d m;
  const Tensor x = randn({4, 6, 8}, 5, DType::F64);
  const Tensor g = randn({4, 6, 8}, 6, DType::F64);
  for (int64_t d : {0, 1, 2}) {
    const Tensor leaf = x.clone().requires_grad_();
    backward(log_softmax(leaf, d), g);
    const int a = d == 0 ? 1 : 0, b = d == 2 ? 1 : 2;  // the two other dims
    const std::vector<std::pair<Placements, Placements>> cases = {
        {{Shard{a}, Shard{b}}, {Shard{a}, Shard{b}}},      // y's shards, gradient alike
        {{Shard{a}, Replicate{}}, {Shard{a}, Partial{}}},  // a pending sum over tp
    };
    for (const auto& [px, pg] : cases) {
      SCOPED_TRACE(fmt::format("dim {}: x {}, grad {}", d, to_string(px), to_string(pg)));
      DTensor dx = distribute_tensor(x, m.mesh, px);
      dx.requires_grad_();
      const DTensor y = log_softmax(dx, d);
      ASSERT_EQ(y.placements(), px);
      // The entry's output keeps the gradient's placements: nothing moved before it.
      std::vector<Placements> outputs;
      const int observer = add_op_observer([&](const OpEvent& e) {
        if (e.def == &op::log_softmax_backward) outputs.push_back(e.output.placements());
      });
      backward(y, testing::make_dtensor(g, m.mesh, pg, 7));
      remove_op_observer(observer);
      EXPECT_EQ(outputs, std::vector<Placements>({pg}));
      EXPECT_TRUE(allclose(dx.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
    }
  }
}

TEST(TransformerOps, AttentionShardedOverHeadsAndLayerNormOverTheSequenceNeedNoCommunication) {
  Mesh2d m;
  const Tensor q = randn({2, 4, 6, 3}, 1, DType::F64);
  const Tensor k = randn({2, 4, 6, 3}, 2, DType::F64);
  const Tensor v = randn({2, 4, 6, 3}, 3, DType::F64);
  const Placements heads = {Shard{0}, Shard{1}};
  const size_t start = trace().records().size();
  const DTensor o = scaled_dot_product_attention(distribute_tensor(q, m.mesh, heads),
                                                 distribute_tensor(k, m.mesh, heads),
                                                 distribute_tensor(v, m.mesh, heads), true);
  EXPECT_EQ(o.placements(), heads);
  EXPECT_TRUE(pieces_match(o, scaled_dot_product_attention(q, k, v, true), 1e-12));
  // Queries split by rows with keys and values whole: each piece masks with its global rows.
  const DTensor rows =
      scaled_dot_product_attention(distribute_tensor(q, m.mesh, {Replicate{}, Shard{2}}),
                                   distribute_tensor(k, m.mesh, {Replicate{}, Replicate{}}),
                                   distribute_tensor(v, m.mesh, {Replicate{}, Replicate{}}), true);
  EXPECT_EQ(rows.placements(), (Placements{Replicate{}, Shard{2}}));
  EXPECT_TRUE(pieces_match(rows, scaled_dot_product_attention(q, k, v, true), 1e-12));

  const Tensor x = randn({2, 8, 5}, 4, DType::F64);
  const Tensor w = randn({5}, 5, DType::F64);
  const Tensor b = randn({5}, 6, DType::F64);
  const Placements replicated = {Replicate{}, Replicate{}};
  const DTensor y = layer_norm(distribute_tensor(x, m.mesh, {Shard{0}, Shard{1}}),
                               distribute_tensor(w, m.mesh, replicated),
                               distribute_tensor(b, m.mesh, replicated));
  EXPECT_EQ(y.placements(), (Placements{Shard{0}, Shard{1}}));
  EXPECT_TRUE(pieces_match(y, layer_norm(x, w, b), 1e-12));
  EXPECT_TRUE(collectives_since(start).empty());
}

TEST(TransformerOps, DropoutDrawsTheSameMaskOnEveryMesh) {
  World world = World::sim(8);
  const Tensor x = randn({6, 10}, 1, DType::F64);
  const Tensor want = dropout(x, 0.4, 77);
  // About 40% dropped, the rest scaled by 1 / 0.6.
  const Tensor dropped = eq(want, zeros({6, 10}, DType::F64)).to(DType::F64);
  const double fraction = sum(dropped).item<double>() / 60.0;
  EXPECT_GT(fraction, 0.2);
  EXPECT_LT(fraction, 0.6);
  EXPECT_TRUE(allclose(where(eq(want, zeros({}, DType::F64)), want, x / 0.6), want, 1e-12, 0));
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8}, {2, 4}, {4, 2}, {3}}) {
    const DeviceMesh mesh = init_device_mesh(world, shape);
    for (const Placements& p :
         {Placements(shape.size(), Replicate{}), Placements(shape.size(), Shard{1}),
          Placements(shape.size(), Shard{0})}) {
      const DTensor d = dropout(distribute_tensor(x, mesh, p), 0.4, 77);
      EXPECT_EQ(d.placements(), p);
      EXPECT_TRUE(equal(d.full_tensor(), want)) << mesh.to_string() << " " << to_string(p);
    }
  }
  EXPECT_FALSE(equal(dropout(x, 0.4, 78), want));
}

// Dropout is x times its scaled mask, as torch's: a dropped element is x * 0 (-0 for a negative x,
// NaN for an infinite or NaN one), a kept one x / (1 - p); BF16 multiplies in F32.
TEST(TransformerOps, DropoutIsXTimesItsScaledMask) {
  std::vector<double> v;
  for (int i = 0; i < 400; ++i) {
    v.push_back(i % 4 == 0 ? -1.5 * (i + 1) : i % 4 == 1 ? INFINITY : i % 4 == 2 ? NAN : 0.25 * i);
  }
  const std::vector<double> mask =
      dropout_mask_block({400}, 13, {0}, {400}, 0.5, DType::F64).to_vector<double>();
  for (DType d : {DType::F32, DType::F64, DType::BF16}) {
    const Tensor x = from_vector<double>(v, {400}).to(d);
    const std::vector<double> xs = x.to(DType::F64).to_vector<double>();
    const std::vector<double> got = dropout(x, 0.5, 13).to(DType::F64).to_vector<double>();
    int negative_zeros = 0;
    int nans = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double want = xs[i] * mask[i];  // the scale is 2: exact in every dtype
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << d << " element " << i;
        nans += mask[i] == 0.0;
      } else {
        EXPECT_EQ(got[i], want) << d << " element " << i;
        EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << d << " element " << i;
        negative_zeros += got[i] == 0.0 && std::signbit(got[i]);
      }
    }
    EXPECT_GT(negative_zeros, 0) << d;
    EXPECT_GT(nans, 50) << d;  // the dropped infinities and NaNs
  }
}

// A microbatch (rows of a batch, DropoutRows) drops its rows of what the batch drops, on one device
// and on any mesh, and its gradient uses the same mask.
TEST(TransformerOps, DropoutOfRowsIsTheirPartOfTheWholeMask) {
  World world = World::sim(8);
  const Tensor x = randn({8, 3, 5}, 2, DType::F64);
  const Tensor whole = dropout(x, 0.3, 91);
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  for (int64_t offset : {0, 4}) {
    const Tensor rows = x.narrow(0, offset, 4).contiguous();
    const Tensor want = whole.narrow(0, offset, 4).contiguous();
    EXPECT_TRUE(equal(dropout(rows, 0.3, 91, DropoutRows{offset, 8}), want)) << offset;
    if (offset != 0) EXPECT_FALSE(equal(dropout(rows, 0.3, 91), want));  // the first rows' mask
    for (const Placements& p : {Placements{Shard{0}, Shard{1}}, Placements{Shard{0}, Replicate{}},
                                Placements{Replicate{}, Shard{2}}}) {
      DTensor d = distribute_tensor(rows, mesh, p);
      d.requires_grad_();
      const DTensor y = dropout(d, 0.3, 91, DropoutRows{offset, 8});
      EXPECT_TRUE(equal(y.full_tensor(), want)) << offset << " " << to_string(p);
      backward(sum(y));
      // d(sum(dropout(x)))/dx is the mask's scale: 0 where dropped, 1 / 0.7 where kept.
      const Tensor scale = dropout(ones({4, 3, 5}, DType::F64), 0.3, 91, DropoutRows{offset, 8});
      EXPECT_TRUE(allclose(d.grad().full_tensor(), scale, 1e-12, 0))
          << offset << " " << to_string(p);
    }
  }
}

TEST(TransformerOps, ElementwiseOpsKeepTheirFirstInputsPlacements) {
  Mesh2d m;
  const Tensor w = randn({8, 4}, 1, DType::F64);
  const Tensor u = randn({8, 4}, 2, DType::F64);
  // A P(sum) update of a Replicate parameter: the cheapest plan would partition w (free) and
  // leave a P(sum) parameter; the parameter keeps Replicate and the update is reduced.
  const DTensor wr = distribute_tensor(w, m.mesh, {Replicate{}, Replicate{}});
  const DTensor update = distribute_tensor(u, m.mesh, {Partial{}, Replicate{}});
  const DTensor stepped = wr - update * 0.1;
  EXPECT_EQ(stepped.placements(), wr.placements());
  EXPECT_TRUE(allclose(stepped.full_tensor(), w - u * 0.1, 1e-12, 1e-12));
  // A sharded parameter stays sharded; a replicated one is not sharded by a sharded update.
  const DTensor ws = distribute_tensor(w, m.mesh, {Replicate{}, Shard{0}});
  const DTensor us = distribute_tensor(u, m.mesh, {Shard{1}, Replicate{}});
  EXPECT_EQ((ws - us).placements(), ws.placements());
  EXPECT_EQ((wr + us).placements(), wr.placements());
  // Where the first input's placements cannot hold, the cheapest valid plan runs.
  const DTensor pmax = distribute_tensor(w, m.mesh, {Partial{ReduceOp::Max}, Replicate{}});
  EXPECT_EQ((pmax * ws).placements(), (Placements{Replicate{}, Shard{0}}));
}

}  // namespace
}  // namespace spmd
