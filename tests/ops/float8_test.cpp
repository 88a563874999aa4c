// The float8 dtypes' ops (Note [Float8 ops] in spmd/ops/op.h), scaled_mm (Note [Scaled matmul])
// and FP8 training's float8_matmul (Note [Float8 training] in spmd/ops/linalg.cpp) against
// brute-force references written here in double: the tensorwise scale, the saturated cast (through
// the Float8 element types, which tests/tensor/dtype_test.cpp checks against the OCP formats
// code by code), the GEMM loop by loop, and Float8Linear's backward formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/world/local_ops.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::expect_throws;

// ---- brute force --------------------------------------------------------------------------------

double format_max(DType format) {
  return format == DType::F8E5M2 ? 57344.0 : 448.0;
}

// torchao's tensorwise scale: the format's largest value over amax (at least 1e-12), as f32.
float ref_scale(const std::vector<double>& values, DType format) {
  double amax = 0;
  for (double v : values) amax = std::max(amax, std::abs(v));
  const float wide = static_cast<float>(amax);
  return static_cast<float>(format_max(format) / std::max(static_cast<double>(wide), 1e-12));
}

// The saturated cast of v * scale (in f32) to the format, as the value it stands for.
double ref_cast(double v, float scale, DType format) {
  const double limit = format_max(format);
  const float scaled = static_cast<float>(v) * scale;
  const float clamped = static_cast<float>(std::clamp<double>(scaled, -limit, limit));
  return testing::round_to(format, clamped);
}

// sum_k a[i, k] b[k, j] in double, times alpha: a is [m, k] and b [k, n], row-major.
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                             int64_t k, int64_t n, double alpha) {
  std::vector<double> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += a[static_cast<size_t>(i * k + p)] * b[static_cast<size_t>(p * n + j)];
      }
      out[static_cast<size_t>(i * n + j)] = acc * alpha;
    }
  }
  return out;
}

std::vector<double> transposed(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      out[static_cast<size_t>(j * rows + i)] = v[static_cast<size_t>(i * cols + j)];
    }
  }
  return out;
}

std::vector<double> cast_all(const std::vector<double>& v, float scale, DType format) {
  std::vector<double> out;
  for (double x : v) out.push_back(ref_cast(x, scale, format));
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rtol * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

// ---- the ops that take float8, and the ones that refuse it
// ----------------------------------------

TEST(Float8Ops, EveryOpRefusesFloat8InputsUnlessItsEntrySaysSo) {
  const std::set<std::string> takes = {
      "transpose", "reshape", "cat",   "stack",      "narrow", "select", "permute",   "unsqueeze",
      "squeeze",   "expand",  "clone", "contiguous", "to",     "pad",    "scaled_mm", "float8_mm"};
  std::set<std::string> found;
  const Shape shape{4, 4};
  for (const OpDef* op : all_ops()) {
    if (op->float8) {
      found.insert(std::string(op->name));
      continue;
    }
    for (DType f8 : kFloat8DTypes) {
      const InputMeta in[] = {{&shape, DType::F32}, {&shape, f8}};
      expect_throws<Unsupported>(
          [&] { op_meta(*op, in, OpArgs{}); },
          {std::string(op->name) + ": argument 2 (shape [4, 4]) is " + std::string(dtype_name(f8)),
           "Note [Float8 ops]"});
    }
  }
  EXPECT_EQ(found, takes);
  // float8_mm takes b cast already (Note [Float8 all-gather]), never a.
  const Shape scalar{};
  const int64_t e4m3 = static_cast<int64_t>(DType::F8E4M3FN);
  const InputMeta a8[] = {{&shape, DType::F8E4M3FN},
                          {&shape, DType::F32},
                          {&scalar, DType::F32},
                          {&scalar, DType::F32}};
  expect_throws<Unsupported>(
      [&] {
        op_meta(op::float8_mm, a8, OpArgs{{e4m3, e4m3, 0}, {}});
      },
      {"float8_mm: a must be f32, f64, bf16 or f16 (it is cast to float8 here), got [4, 4] "
       "f8e4m3fn"});
}

TEST(Float8Ops, CastsViewsCopiesAndCatKeepTheValues) {
  const Tensor x = randn({4, 6}, 3, DType::F32) * 40.0;
  for (DType f8 : kFloat8DTypes) {
    SCOPED_TRACE(fmt::format("{}", f8));
    const Tensor q = x.to(f8);
    ASSERT_EQ(q.dtype(), f8);
    ASSERT_EQ(q.itemsize(), 1u);
    std::vector<double> want;
    for (double v : testing::values(x)) want.push_back(testing::round_to(f8, v));
    EXPECT_EQ(testing::values(q), want);
    // Back to f32 exactly, through views, copies and cat.
    const Tensor wide = q.to(DType::F32);
    EXPECT_EQ(testing::values(wide), want);
    EXPECT_TRUE(equal(transpose(q, 0, 1).contiguous().to(DType::F32), transpose(wide, 0, 1)));
    EXPECT_TRUE(equal(reshape(q, {6, 4}).to(DType::F32), reshape(wide, {6, 4})));
    EXPECT_TRUE(equal(narrow(q, 1, 2, 3).clone().to(DType::F32), narrow(wide, 1, 2, 3)));
    EXPECT_TRUE(equal(cat({q, q}, 0).to(DType::F32), cat({wide, wide}, 0)));
    // And to the other float8 format and to bf16 through float.
    for (DType to : {DType::F8E4M3FN, DType::F8E5M2, DType::BF16}) {
      std::vector<double> expected;
      for (double v : want) expected.push_back(testing::round_to(to, v));
      EXPECT_EQ(testing::values(q.to(to)), expected) << to;
    }
  }
  // Out of range: NaN for f8e4m3fn (no infinity), an infinity for f8e5m2 (PyTorch's casts).
  const Tensor big = from_vector<float>({500.0f, -1e5f, 448.0f});
  EXPECT_TRUE(std::isnan(testing::values(big.to(DType::F8E4M3FN))[0]));
  EXPECT_EQ(testing::values(big.to(DType::F8E5M2))[1], -INFINITY);
  EXPECT_EQ(testing::values(big.to(DType::F8E4M3FN))[2], 448.0);
}

TEST(Float8Ops, ArithmeticPromotionAndReductionAreRefusedByName) {
  const Tensor q = randn({2, 3}, 1).to(DType::F8E4M3FN);
  expect_throws<Unsupported>([&] { add(q, q); }, {"add", "f8e4m3fn", "[2, 3]"});
  expect_throws<Unsupported>([&] { matmul(q, transpose(q, 0, 1)); }, {"matmul", "f8e4m3fn"});
  expect_throws<Unsupported>([&] { sum(q); }, {"sum", "f8e4m3fn"});
  expect_throws<Unsupported>(
      [&] {
        cat({q, q.to(DType::BF16)}, 0);
      },
      {"cat: float8 dtypes promote with no other dtype", "bf16"});
  expect_throws<Unsupported>([&] { randn({2}, 1, DType::F8E5M2); }, {"randn", "f8e5m2"});
  // Collectives move float8 tensors and refuse to reduce them.
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const LocalTensor local = LocalTensor::from_fn(world, [&](int rank) {
    return full({3}, static_cast<double>(rank) + 0.5, DType::F32).to(DType::F8E4M3FN);
  });
  const LocalTensor gathered = all_gather(local, mesh, 0, 0);
  EXPECT_EQ(testing::values(gathered.shard(2).to(DType::F32)),
            (std::vector<double>{0.5, 0.5, 0.5, 1.5, 1.5, 1.5, 2.5, 2.5, 2.5, 3.5, 3.5, 3.5}));
  expect_throws<CommError>([&] { all_reduce(local, mesh, 0, ReduceOp::Max); },
                           {"all_reduce", "float8 tensors are gathered and moved, not reduced"});
}

// ---- scaled_mm
// ------------------------------------------------------------------------------------

TEST(ScaledMatmul, MatchesABruteForceGemmOfTheFloat8Values) {
  const int64_t m = 5, k = 7, n = 3;
  for (auto [fa, fb] :
       {std::pair{DType::F8E4M3FN, DType::F8E4M3FN}, std::pair{DType::F8E4M3FN, DType::F8E5M2},
        std::pair{DType::F8E5M2, DType::F8E4M3FN}}) {
    const Tensor a = (randn({m, k}, 11, DType::F32) * 8.0).to(fa);
    const Tensor b = (randn({k, n}, 12, DType::F32) * 8.0).to(fb);
    const Tensor sa = scalar_tensor(0.375, DType::F32);
    const Tensor sb = scalar_tensor(1.75, DType::F32);
    const double alpha = static_cast<double>(0.375f * 1.75f);
    const std::vector<double> want =
        ref_gemm(testing::values(a), testing::values(b), m, k, n, alpha);
    const Tensor out32 = scaled_mm(a, b, sa, sb, DType::F32);
    ASSERT_EQ(out32.shape(), (Shape{m, n}));
    expect_close(testing::values(out32), want, 1e-6, fmt::format("{} x {} f32", fa, fb));
    // bf16: the f32 result rounded once.
    const Tensor out16 = scaled_mm(a, b, sa, sb);
    ASSERT_EQ(out16.dtype(), DType::BF16);
    std::vector<double> rounded;
    for (double v : testing::values(out32)) rounded.push_back(testing::round_to(DType::BF16, v));
    EXPECT_EQ(testing::values(out16), rounded);
  }
}

TEST(ScaledMatmul, ErrorsNameTheOpAndTheOperands) {
  const Tensor a = randn({4, 8}, 1).to(DType::F8E4M3FN);
  const Tensor b = randn({8, 2}, 2).to(DType::F8E5M2);
  const Tensor s = scalar_tensor(1.0, DType::F32);
  expect_throws<Unsupported>(
      [&] {
        scaled_mm(b.reshape({2, 8}), b, s, s);
      },
      {"scaled_mm: a and b cannot both be f8e5m2", "[2, 8]"});
  expect_throws<Unsupported>([&] { scaled_mm(a.to(DType::F32), b, s, s); },
                             {"scaled_mm: a and b must be float8", "[4, 8] f32"});
  expect_throws<Unsupported>([&] { scaled_mm(a, b, full({4}, 1.0), s); },
                             {"scaled_mm: scale_a must be a 0-d f32 tensor", "[4]"});
  expect_throws<Unsupported>([&] { scaled_mm(a, b, s, s, DType::I32); },
                             {"scaled_mm: the out dtype must be bf16, f16 or f32"});
  expect_throws<ShapeError>([&] { scaled_mm(a, a, s, s); },
                            {"scaled_mm", "[4, 8]", "inner sizes 8 and 4 differ"});
}

// ---- float8_matmul: Float8Linear's forward and backward
// -------------------------------------------

TEST(Float8Matmul, ForwardAndBackwardFollowTheTensorwiseRecipe) {
  const int64_t rows = 6, k = 5, n = 4;
  const Tensor x = (randn({2, 3, k}, 21, DType::F64) * 3.0).requires_grad_();
  const Tensor w = randn({k, n}, 22, DType::F64).requires_grad_();
  const Tensor up = randn({2, 3, n}, 23, DType::F64);
  const Tensor y = float8_matmul(x, w);
  ASSERT_EQ(y.shape(), (Shape{2, 3, n}));
  ASSERT_EQ(y.dtype(), DType::F64);
  backward(sum(y * up));

  const std::vector<double> xv = testing::values(x), wv = testing::values(w);
  const std::vector<double> gv = testing::values(up);
  const float sx = ref_scale(xv, DType::F8E4M3FN);
  const float sw = ref_scale(wv, DType::F8E4M3FN);
  const float sg = ref_scale(gv, DType::F8E5M2);
  const std::vector<double> x8 = cast_all(xv, sx, DType::F8E4M3FN);
  const std::vector<double> w8 = cast_all(wv, sw, DType::F8E4M3FN);
  const std::vector<double> g8 = cast_all(gv, sg, DType::F8E5M2);
  auto inverse = [](float s) { return static_cast<double>(1.0f / s); };
  // y = x8 @ w8 / (sx sw); grad x = g8 @ w8^T / (sg sw); grad w = x8^T @ g8 / (sx sg).
  expect_close(testing::values(y), ref_gemm(x8, w8, rows, k, n, inverse(sx) * inverse(sw)), 1e-12,
               "y");
  expect_close(testing::values(x.grad()),
               ref_gemm(g8, transposed(w8, k, n), rows, n, k, inverse(sg) * inverse(sw)), 1e-12,
               "grad x");
  expect_close(testing::values(w.grad()),
               ref_gemm(transposed(x8, rows, k), g8, k, rows, n, inverse(sx) * inverse(sg)), 1e-12,
               "grad w");
  // Close to the exact product, as FP8 should be (a few percent).
  const Tensor exact = matmul(x.detach(), w.detach());
  EXPECT_LT(max_abs_diff(y.detach(), exact),
            0.15 * max_abs_diff(exact, zeros(exact.shape(), DType::F64)) + 0.05);
}

TEST(Float8Matmul, ShardedOperandsUseTheGlobalScale) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {2, 2});
  const Tensor x = randn({4, 6, 8}, 31, DType::F64);
  const Tensor w = randn({8, 6}, 32, DType::F64) * 5.0;
  const Tensor up = randn({4, 6, 6}, 33, DType::F64);
  const Tensor xt = x.clone().requires_grad_();
  const Tensor wt = w.clone().requires_grad_();
  backward(sum(float8_matmul(xt, wt) * up));
  const Tensor want = float8_matmul(x, w);
  // Batch over dim 0, the weight column-wise over dim 1 (tensor parallel), and row-wise.
  for (const auto& [px, pw] :
       {std::pair{Placements{Shard{0}, Replicate{}}, Placements{Replicate{}, Shard{1}}},
        std::pair{Placements{Shard{0}, Shard{2}}, Placements{Replicate{}, Shard{0}}}}) {
    SCOPED_TRACE(to_string(px) + " @ " + to_string(pw));
    const DTensor dx = distribute_tensor(x, mesh, px).requires_grad_();
    const DTensor dw = distribute_tensor(w, mesh, pw).requires_grad_();
    const DTensor dy = float8_matmul(dx, dw);
    EXPECT_TRUE(allclose(dy.full_tensor(), want, 1e-12, 1e-12));
    backward(sum(dy * distribute_tensor(up, mesh, Placements(2, Replicate{}))));
    EXPECT_TRUE(allclose(dx.grad().full_tensor(), xt.grad(), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(dw.grad().full_tensor(), wt.grad(), 1e-12, 1e-12));
  }
}

// torchao under FSDP: over a rank-local dim each rank scales its own rows of x (and of the
// gradient) by their amax; the weight's amax stays global. Each dp block then computes exactly as
// one device given that block alone, and the weight gradient is the sum of the blocks'.
TEST(Float8Matmul, RankLocalDimsScaleEachRanksPieceByItsOwnAmax) {
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  Tensor x = randn({4, 3, 8}, 41, DType::F64);
  x.narrow(0, 2, 2).copy_(x.narrow(0, 2, 2) * 3.0);  // the blocks' amaxes differ
  const Tensor w = randn({8, 6}, 42, DType::F64);
  const Tensor up = randn({4, 3, 6}, 43, DType::F64);
  const DTensor dx = distribute_tensor(x, mesh, {Shard{0}, Replicate{}}).requires_grad_();
  const DTensor dw = distribute_tensor(w, mesh, {Replicate{}, Shard{1}}).requires_grad_();
  const DTensor dy = float8_matmul(dx, dw, Float8Options{.rank_local_dims = {"dp"}});
  backward(sum(dy * distribute_tensor(up, mesh, {Replicate{}, Replicate{}})));
  const Tensor y = dy.full_tensor();
  const Tensor gx = dx.grad().full_tensor();
  Tensor gw = zeros({8, 6}, DType::F64);
  for (int64_t block = 0; block < 2; ++block) {
    const Tensor xb = x.narrow(0, 2 * block, 2).clone().requires_grad_();
    const Tensor wb = w.clone().requires_grad_();
    const Tensor yb = float8_matmul(xb, wb);
    backward(sum(yb * up.narrow(0, 2 * block, 2)));
    EXPECT_TRUE(allclose(y.narrow(0, 2 * block, 2), yb.detach(), 1e-12, 1e-12)) << block;
    EXPECT_TRUE(allclose(gx.narrow(0, 2 * block, 2), xb.grad(), 1e-12, 1e-12)) << block;
    gw = gw + wb.grad();
  }
  EXPECT_TRUE(allclose(dw.grad().full_tensor(), gw, 1e-12, 1e-12));
  // With global scales the first block's casts differ (its amax is a third of the batch's).
  const DTensor global = float8_matmul(dx.detach(), dw.detach());
  EXPECT_FALSE(allclose(global.full_tensor().narrow(0, 0, 2), y.narrow(0, 0, 2), 1e-12, 1e-12));
  expect_throws<MeshError>([&] { float8_matmul(dx, dw, Float8Options{.rank_local_dims = {"ep"}}); },
                           {"ep"});
}

TEST(Float8Matmul, RefusesFloat8OperandsAndNamesTheShapes) {
  const Tensor q = randn({3, 4}, 1).to(DType::F8E4M3FN);
  expect_throws<Unsupported>(
      [&] {
        float8_matmul(randn({2, 3}, 1), q);
      },
      {"float8_matmul: x and w must be", "w [3, 4] f8e4m3fn"});
  expect_throws<ShapeError>(
      [&] {
        float8_matmul(randn({2, 3}, 1), randn({4, 2}, 2));
      },
      {"float8_mm", "[2, 3]", "[4, 2]"});
}

}  // namespace
}  // namespace spmd
