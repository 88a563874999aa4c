// DTensor ops against the same ops on full tensors, under random meshes and placements
// (Partial inputs from known decompositions); the DTensor mean vectors of notes §1.6; sharding
// decisions for the textbook cases; reshape that must redistribute; the sharding cache, the
// observer hook, implicit replication and error messages.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include <spmd/dtensor/dispatch.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::make_dtensor;
using testing::pieces_match;

// One row of the op table: input shapes, the op on DTensors and on Tensors, and whether inputs
// must be positive (log, sqrt).
struct OpCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<DTensor(const std::vector<DTensor>&)> dtensor_op;
  std::function<Tensor(const std::vector<Tensor>&)> tensor_op;
  bool positive = false;
};

std::vector<OpCase> op_table() {
  using D = std::vector<DTensor>;
  using T = std::vector<Tensor>;
  std::vector<OpCase> t;
  auto binary = [&](const std::string& name, auto dop, auto top) {
    for (const auto& shapes : std::vector<std::vector<Shape>>{
             {{5, 4}, {5, 4}}, {{5, 4}, {4}}, {{5, 1}, {1, 4}}, {{3, 5, 4}, {5, 1}}}) {
      t.push_back({name, shapes, [dop](const D& x) { return dop(x[0], x[1]); },
                   [top](const T& x) { return top(x[0], x[1]); }});
    }
  };
  binary(
      "add", [](const DTensor& a, const DTensor& b) { return a + b; },
      [](const Tensor& a, const Tensor& b) { return a + b; });
  binary(
      "sub", [](const DTensor& a, const DTensor& b) { return a - b; },
      [](const Tensor& a, const Tensor& b) { return a - b; });
  binary(
      "mul", [](const DTensor& a, const DTensor& b) { return a * b; },
      [](const Tensor& a, const Tensor& b) { return a * b; });
  binary(
      "maximum", [](const DTensor& a, const DTensor& b) { return maximum(a, b); },
      [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  binary(
      "minimum", [](const DTensor& a, const DTensor& b) { return minimum(a, b); },
      [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  t.push_back({"div",
               {{5, 4}, {4}},
               [](const D& x) { return x[0] / x[1]; },
               [](const T& x) { return x[0] / x[1]; },
               true});

  for (double c : {2.0, -3.0}) {
    const std::string s = std::to_string(c);
    t.push_back({"x+" + s,
                 {{5, 4}},
                 [c](const D& x) { return x[0] + c; },
                 [c](const T& x) { return x[0] + c; }});
    t.push_back({s + "-x",
                 {{5, 4}},
                 [c](const D& x) { return c - x[0]; },
                 [c](const T& x) { return c - x[0]; }});
    t.push_back({"x-" + s,
                 {{5, 4}},
                 [c](const D& x) { return x[0] - c; },
                 [c](const T& x) { return x[0] - c; }});
    t.push_back({"x*" + s,
                 {{5, 4}},
                 [c](const D& x) { return x[0] * c; },
                 [c](const T& x) { return x[0] * c; }});
    t.push_back({"x/" + s,
                 {{5, 4}},
                 [c](const D& x) { return x[0] / c; },
                 [c](const T& x) { return x[0] / c; }});
    t.push_back({s + "/x",
                 {{5, 4}},
                 [c](const D& x) { return c / x[0]; },
                 [c](const T& x) { return c / x[0]; },
                 true});
  }

#define SPMD_UNARY_CASE_(fn, positive)              \
  t.push_back({#fn,                                 \
               {{5, 4}},                            \
               [](const D& x) { return fn(x[0]); }, \
               [](const T& x) { return fn(x[0]); }, \
               positive});
  SPMD_UNARY_CASE_(neg, false)
  SPMD_UNARY_CASE_(abs, false)
  SPMD_UNARY_CASE_(exp, false)
  SPMD_UNARY_CASE_(log, true)
  SPMD_UNARY_CASE_(sqrt, true)
  SPMD_UNARY_CASE_(tanh, false)
  SPMD_UNARY_CASE_(relu, false)
  SPMD_UNARY_CASE_(gelu, false)
#undef SPMD_UNARY_CASE_

  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 6}, {6, 3}},
                                                            {{2, 5, 6}, {6, 3}},
                                                            {{6}, {6, 3}},
                                                            {{5, 6}, {6}},
                                                            {{6}, {6}},
                                                            {{2, 3, 4}, {2, 4, 5}}}) {
    t.push_back({"matmul", shapes, [](const D& x) { return matmul(x[0], x[1]); },
                 [](const T& x) { return matmul(x[0], x[1]); }});
  }
  t.push_back({"bmm",
               {{3, 4, 5}, {3, 5, 2}},
               [](const D& x) { return bmm(x[0], x[1]); },
               [](const T& x) { return bmm(x[0], x[1]); }});
  for (const Shape& c : std::vector<Shape>{{5, 3}, {3}, {5, 1}}) {
    t.push_back({"addmm",
                 {c, {5, 6}, {6, 3}},
                 [](const D& x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); },
                 [](const T& x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); }});
  }

  struct Red {
    Shape shape;
    std::vector<int64_t> dims;
    bool keep;
  };
  for (const Red& r : std::vector<Red>{{{5, 6}, {}, false},
                                       {{5, 6}, {0}, false},
                                       {{5, 6}, {1}, true},
                                       {{5, 6}, {-1, 0}, false},
                                       {{3, 4, 5}, {1}, false},
                                       {{3, 4, 5}, {0, 2}, true},
                                       {{8, 4}, {0}, false}}) {
    const auto dims = r.dims;
    const bool keep = r.keep;
#define SPMD_REDUCTION_CASE_(fn)                                 \
  t.push_back({#fn,                                              \
               {r.shape},                                        \
               [=](const D& x) { return fn(x[0], dims, keep); }, \
               [=](const T& x) { return fn(x[0], dims, keep); }});
    SPMD_REDUCTION_CASE_(sum)
    SPMD_REDUCTION_CASE_(mean)
    SPMD_REDUCTION_CASE_(amax)
    SPMD_REDUCTION_CASE_(amin)
#undef SPMD_REDUCTION_CASE_
  }
  for (int64_t d : {0, 1, -1}) {
    t.push_back({"softmax",
                 {{5, 6}},
                 [d](const D& x) { return softmax(x[0], d); },
                 [d](const T& x) { return softmax(x[0], d); }});
    t.push_back({"log_softmax",
                 {{5, 6}},
                 [d](const D& x) { return log_softmax(x[0], d); },
                 [d](const T& x) { return log_softmax(x[0], d); }});
  }
  t.push_back({"transpose",
               {{5, 6, 3}},
               [](const D& x) { return transpose(x[0], 0, 2); },
               [](const T& x) { return x[0].transpose(0, 2); }});
  t.push_back({"transpose",
               {{5, 6}},
               [](const D& x) { return transpose(x[0], 1, 0); },
               [](const T& x) { return x[0].transpose(1, 0); }});
  struct Re {
    Shape from, to;
  };
  for (const Re& r : std::vector<Re>{{{6, 4}, {24}},
                                     {{6, 4}, {2, 3, 4}},
                                     {{6, 4}, {3, 8}},
                                     {{6, 4}, {4, 6}},
                                     {{2, 3, 4}, {6, 4}},
                                     {{2, 3, 4}, {2, -1}},
                                     {{8, 4}, {32}},
                                     {{1, 5}, {5}},
                                     {{6}, {2, 3, 1}},
                                     {{5, 4}, {4, 5}}}) {
    const Shape to = r.to;
    t.push_back({"reshape",
                 {r.from},
                 [to](const D& x) { return reshape(x[0], to); },
                 [to](const T& x) { return x[0].reshape(to); }});
  }
  return t;
}

// The mesh shapes ops run on.
const std::vector<std::vector<int64_t>> kMeshes = {{4}, {3}, {2, 2}, {2, 3}, {1, 2}, {2, 2, 2}};

void check_ops(DType dtype, uint64_t seed) {
  World world = testing::test_world(64);
  std::mt19937_64 rng(seed);
  int checked = 0;
  for (const OpCase& op : op_table()) {
    if (dtype != DType::F32 &&
        (op.name == "mean" || op.name == "addmm" || op.name.find("softmax") != std::string::npos)) {
      continue;  // floating only
    }
    for (const auto& mesh_shape : kMeshes) {
      auto mesh = testing::try_mesh(world, mesh_shape);
      if (!mesh) continue;
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<Tensor> globals;
        std::vector<DTensor> inputs;
        std::string placements_text;
        for (const Shape& shape : op.shapes) {
          Tensor g = testing::int_valued(shape, rng() % 10000, dtype);
          if (op.positive) g = abs(g) + 1.0;
          const Placements kinds = testing::all_placement_kinds(static_cast<int>(shape.size()));
          Placements p;
          for (size_t i = 0; i < mesh_shape.size(); ++i) {
            // Partials a third of the time, each kind otherwise equally likely.
            const size_t n_plain = shape.size() + 1;
            // (Integer Partial(product) pieces of a known decomposition would not be integers.)
            const size_t n_partial = dtype == DType::F32 ? 5 : 4;
            p.push_back(rng() % 3 == 0 ? kinds[n_plain + rng() % n_partial]
                                       : kinds[rng() % n_plain]);
          }
          placements_text += " " + to_string(p);
          globals.push_back(g);
          inputs.push_back(make_dtensor(g, *mesh, p, rng()));
        }
        SCOPED_TRACE(
            fmt::format("{} {} on {} with{}", op.name, dtype, mesh->to_string(), placements_text));
        const Tensor expected = op.tensor_op(globals);
        DTensor out = op.dtensor_op(inputs);
        EXPECT_EQ(out.shape(), expected.shape());
        EXPECT_EQ(out.dtype(), expected.dtype());
        EXPECT_TRUE(pieces_match(out, expected, 1e-4));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(DTensorOps, MatchFullTensorOpsUnderRandomPlacements) {
  check_ops(DType::F32, 42);
}

// Integer data: exact, and an integer Partial(avg) (which truncates) is never kept by an op.
TEST(DTensorOps, MatchFullTensorOpsOnIntegers) {
  check_ops(DType::I64, 43);
}

// ---- notes §1.6: DTensor mean under LocalTensor -------------------------------------------

TEST(DTensorOps, MeanOfUnevenShardsIsReplicateAndExact) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor uneven = testing::int_valued({3, 4}, 1);
  DTensor m = mean(distribute_tensor(uneven, *mesh, {Shard{0}}));
  EXPECT_EQ(m.placements(), (Placements{Replicate{}}));
  EXPECT_TRUE(allclose(m.full_tensor(), mean(uneven), 1e-6, 1e-6));

  Tensor even = testing::int_valued({4, 4}, 2);
  DTensor e = mean(distribute_tensor(even, *mesh, {Shard{0}}));
  EXPECT_EQ(e.placements(), (Placements{Partial{ReduceOp::Avg}}));
  EXPECT_TRUE(allclose(e.full_tensor(), mean(even), 1e-6, 1e-6));
}

// ---- sharding decisions -------------------------------------------------------------------

TEST(DTensorOps, MatmulPicksTheCommunicationFreeStrategy) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 4});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor x = testing::int_valued({8, 16}, 1);
  Tensor w = testing::int_valued({16, 32}, 2);
  auto place = [&](const Tensor& t, Placements p) { return distribute_tensor(t, *mesh, p); };
  // S(0) @ R -> S(0); R @ S(1) -> S(1): the API.md example.
  DTensor y = matmul(place(x, {Shard{0}, Replicate{}}), place(w, {Replicate{}, Shard{1}}));
  EXPECT_EQ(y.placements(), (Placements{Shard{0}, Shard{1}}));
  EXPECT_TRUE(pieces_match(y, matmul(x, w)));
  // S(1) @ S(0) -> P(sum).
  DTensor z = matmul(place(x, {Shard{1}, Replicate{}}), place(w, {Shard{0}, Replicate{}}));
  EXPECT_EQ(z.placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_TRUE(pieces_match(z, matmul(x, w)));
  // A reduced sharded dim becomes Partial.
  DTensor s = sum(y, {1});
  EXPECT_EQ(s.placements(), (Placements{Shard{0}, Partial{}}));
  EXPECT_TRUE(pieces_match(s, sum(matmul(x, w), {1})));
  // Softmax over a sharded dim gathers it; other dims stay sharded.
  DTensor p = softmax(y, 1);
  EXPECT_EQ(p.placements(), (Placements{Shard{0}, Replicate{}}));
  // Linear Partial passes: P(sum) * R -> P(sum), P(sum) + P(sum) -> P(sum); relu does not.
  DTensor r = place(testing::int_valued({8, 32}, 3), {Replicate{}, Replicate{}});
  EXPECT_EQ((z * r).placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_EQ((z + z).placements(), (Placements{Partial{}, Replicate{}}));
  EXPECT_EQ(relu(z).placements(), (Placements{Replicate{}, Replicate{}}));
  EXPECT_EQ((z + 1.0).placements(), (Placements{Replicate{}, Replicate{}}));
}

TEST(DTensorOps, ReshapeRedistributesWhenShardsCannotHoldTheView) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {4});
  if (!mesh) GTEST_SKIP() << "world too small";
  // Even: rows of 4 on 4 ranks flatten into the torch.chunk pieces of 32: no communication.
  Tensor even = testing::int_valued({8, 4}, 1);
  DTensor a = reshape(distribute_tensor(even, *mesh, {Shard{0}}), {32});
  EXPECT_EQ(a.placements(), (Placements{Shard{0}}));
  EXPECT_TRUE(pieces_match(a, even.reshape({32})));
  // Uneven: 6 rows split 2,2,2,0 flatten to 8,8,8,0 elements, but S(0) of 24 is 6,6,6,6. The
  // pieces cannot be reused as they are (pytorch/pytorch#179502 passed this silently).
  Tensor uneven = testing::int_valued({6, 4}, 2);
  DTensor b = reshape(distribute_tensor(uneven, *mesh, {Shard{0}}), {24});
  EXPECT_EQ(b.placements(), (Placements{Replicate{}}));
  EXPECT_TRUE(pieces_match(b, uneven.reshape({24})));
  // Splitting a sharded dim keeps the shard on the outer part when it divides.
  DTensor c =
      reshape(distribute_tensor(testing::int_valued({8, 3}, 3), *mesh, {Shard{0}}), {4, 2, 3});
  EXPECT_EQ(c.placements(), (Placements{Shard{0}}));
  // A shard on an inner dim of a merged group cannot be kept.
  DTensor d = reshape(distribute_tensor(testing::int_valued({4, 8}, 4), *mesh, {Shard{1}}), {32});
  EXPECT_EQ(d.placements(), (Placements{Replicate{}}));
}

// ---- the sharding cache -------------------------------------------------------------------

TEST(ShardingCache, CountsHitsAndMisses) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  clear_sharding_cache();
  DTensor a = distribute_tensor(ones({4, 4}), *mesh, {Shard{0}});
  DTensor b = distribute_tensor(ones({4, 4}), *mesh, {Shard{0}});
  DTensor c = a + b;
  CacheStats s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 0);
  for (int i = 0; i < 3; ++i) c = c + b;  // c's spec equals a's: hits
  s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.size, 1);
  sum(c, {0});
  sum(c, {1});
  sum(c, {1});
  s = sharding_cache_stats();
  EXPECT_EQ(s.misses, 3);  // static args are part of the key
  EXPECT_EQ(s.hits, 4);
}

// ---- the observer hook --------------------------------------------------------------------

TEST(OpHooks, ObserversSeeEveryOpAndCanRecomputeIt) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  std::vector<std::string> seen;
  int mismatches = 0;
  const int id = add_op_observer([&](const OpEvent& e) {
    seen.emplace_back(e.op);
    std::vector<Tensor> full;
    for (const DTensor* in : e.inputs) full.push_back(in->full_tensor());
    if (!allclose(e.output.full_tensor(), e.reference(full), 1e-5, 1e-5)) ++mismatches;
  });
  DTensor x = distribute_tensor(testing::int_valued({4, 6}, 1), *mesh, {Shard{0}, Replicate{}});
  DTensor w = distribute_tensor(testing::int_valued({6, 2}, 2), *mesh, {Replicate{}, Shard{1}});
  DTensor y = relu(matmul(x, w) * 2.0);
  y.redistribute({Replicate{}, Replicate{}});
  remove_op_observer(id);
  y = y + y;
  EXPECT_EQ(seen, (std::vector<std::string>{"matmul", "mul", "relu", "redistribute"}));
  EXPECT_EQ(mismatches, 0);
  EXPECT_FALSE(has_op_observers());
}

// ---- plain Tensors and errors -------------------------------------------------------------

TEST(DTensorOps, PlainTensorOperandNeedsImplicitReplication) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor g = testing::int_valued({4, 3}, 1);
  Tensor bias = testing::int_valued({3}, 2);
  DTensor x = distribute_tensor(g, *mesh, {Shard{0}});
  expect_throws<PlacementError>([&] { x + bias; },
                                {"add", "plain Tensor", "[3]", "S(0)", "[4, 3]", "DeviceMesh"});
  ImplicitReplication allow;
  DTensor y = x + bias;
  EXPECT_EQ(y.placements(), (Placements{Shard{0}}));
  EXPECT_TRUE(pieces_match(y, g + bias));
  EXPECT_TRUE(pieces_match(bias * x, bias * g));
}

TEST(DTensorOps, ErrorsNameOpMeshPlacementsAndShapes) {
  World world = testing::test_world(64);
  if (world.size() < 4) GTEST_SKIP() << "needs 4 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  DTensor a = distribute_tensor(zeros({4, 5}), mesh, {Shard{0}, Replicate{}});
  DTensor b = distribute_tensor(zeros({4, 5}), mesh, {Replicate{}, Shard{1}});
  expect_throws<ShapeError>([&] { matmul(a, b); },
                            {"matmul", "[4, 5]", "S(0),R", "R,S(1)", "dp=2"});
  DeviceMesh other = init_device_mesh(world, {4});
  DTensor c = distribute_tensor(zeros({4, 5}), other, {Shard{0}});
  expect_throws<PlacementError>([&] { a + c; }, {"add", "different meshes", "S(0),R", "S(0)"});
  expect_throws<ShapeError>([&] { sum(a, {2}); }, {"sum", "[4, 5]"});
  expect_throws<ShapeError>([&] { reshape(a, {3, 3}); }, {"reshape", "[3, 3]", "[4, 5]", "S(0),R"});
  expect_throws<PlacementError>([&] { a.redistribute({Shard{0}}); },
                                {"DTensorSpec", "1 placements", "2-d mesh", "[4, 5]"});
  expect_throws<PlacementError>(
      [&] {
        a.redistribute({Shard{3}, Replicate{}});
      },
      {"S(3)", "mesh dim 0 (dp)", "[4, 5]"});
  expect_throws<PlacementError>(
      [&] {
        distribute_tensor(zeros({4}), mesh, {Partial{ReduceOp::BAnd}, Replicate{}});
      },
      {"Partial(band)", "[4]"});
  expect_throws<ShapeError>(
      [&] {
        amax(distribute_tensor(zeros({0, 3}), mesh, {Replicate{}, Replicate{}}), {0});
      },
      {"amax", "[0, 3]"});
}

}  // namespace
}  // namespace spmd
