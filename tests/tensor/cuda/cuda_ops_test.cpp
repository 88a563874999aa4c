// Tests for the CUDA tensor kernels (tensor/cuda/): every DeviceOps family on the GPU against the
// CPU kernels on the same random data, in every dtype, with contiguous, transposed, narrowed and
// broadcast operands. Exact where the arithmetic is (copies, fill, + - * /, integer ops,
// comparisons, integer reductions and matmul); within a few units in the last place where the
// order of accumulation or the device math library differ. Needs a GPU: main() exits with 77
// (CTest's skip code) when cudaGetDeviceCount reports none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <spmd/ops/ops.h>
#include <spmd/tensor/cuda/device.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/random.h>

namespace spmd {
namespace {

const Device kGpu = cuda(0);

Tensor gt_zero(const Tensor& t) {
  return maximum(t, zeros({})).to(DType::Bool);
}

// Random values in dtype: small integers for integer and bool dtypes (so sums and products are
// exact), normals for floats, with a few signed zeros, infinities and NaNs when `specials`.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, bool specials = false) {
  Tensor t = randn(shape, seed) * 3.0;
  if (dtype == DType::Bool) return gt_zero(t);
  if (is_integral(dtype)) return t.to(dtype);
  t = t.to(dtype);
  if (specials && t.numel() >= 8) {
    Tensor flat = t.reshape({-1});
    flat.narrow(0, 0, 1).fill_(NAN);
    flat.narrow(0, 1, 1).fill_(INFINITY);
    flat.narrow(0, 2, 1).fill_(-INFINITY);
    flat.narrow(0, 3, 1).fill_(-0.0);
  }
  return t;
}

// Relative tolerance of a result in `dtype` whose computation may round differently.
double loose(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return 1e-12;
    case DType::F32:
      return 1e-5;
    case DType::BF16:
      return 2e-2;
    case DType::F16:
      return 2e-3;
    default:
      return 0.0;
  }
}

// The GPU result (copied back) equals the CPU result: bitwise (NaN where NaN) when tol == 0,
// else within tol relative (or absolute near zero).
void expect_matches(const Tensor& reference, const Tensor& gpu, double tol,
                    const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  const Tensor back = gpu.to(cpu());
  ASSERT_EQ(back.shape(), reference.shape()) << what;
  ASSERT_EQ(back.dtype(), reference.dtype()) << what;
  const std::vector<double> want = reference.to_vector<double>();
  const std::vector<double> got = back.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i];
    const double g = got[i];
    if (std::isnan(w) || std::isnan(g)) {
      ASSERT_TRUE(std::isnan(w) && std::isnan(g))
          << what << " index " << i << ": " << w << " vs " << g;
      continue;
    }
    if (tol == 0.0) {
      ASSERT_EQ(w, g) << what << " index " << i;
      ASSERT_EQ(std::signbit(w), std::signbit(g)) << what << " index " << i << " (sign of zero)";
    } else {
      ASSERT_LE(std::abs(w - g), tol * std::max(1.0, std::abs(w))) << what << " index " << i;
    }
  }
}

// Views of a [4, 6] tensor the kernels must handle like contiguous ones.
struct View {
  std::string name;
  std::function<Tensor(const Tensor&)> make;
};
std::vector<View> views() {
  return {
      {"contiguous", [](const Tensor& t) { return t; }},
      {"transposed", [](const Tensor& t) { return t.transpose(0, 1); }},
      {"narrowed", [](const Tensor& t) { return t.narrow(1, 1, 4); }},
      {"broadcast",
       [](const Tensor& t) {
         return t.narrow(0, 1, 1).expand({4, 6});
       }},
  };
}

TEST(CudaOps, CopiesConvertEveryDtypePairBothWays) {
  for (DType from : kArithmeticDTypes) {
    const Tensor host = random_tensor({4, 6}, from, 1, true);
    for (DType to : kArithmeticDTypes) {
      const std::string what = fmt::format("{} -> {}", from, to);
      // Host -> device with conversion, device -> device with conversion, device -> host.
      expect_matches(host.to(to), host.to(kGpu).to(to), 0.0, what + " (on the GPU)");
      expect_matches(host.to(to), host.to(to).to(kGpu), 0.0, what + " (round trip)");
      Tensor dst = zeros({6, 4}, to, kGpu);
      dst.copy_(host.to(kGpu).transpose(0, 1));
      expect_matches(host.transpose(0, 1).to(to), dst, 0.0, what + " (strided)");
      Tensor host_dst = zeros({6, 4}, to).transpose(0, 1);
      host_dst.copy_(host.to(kGpu));
      EXPECT_TRUE(equal(host_dst, host.to(to))) << what << " (into a strided host view)";
    }
  }
}

TEST(CudaOps, FillWritesTheConvertedValue) {
  for (DType dtype : kArithmeticDTypes) {
    for (double v : {0.0, -0.0, 1.5, -3.0, 1e10, std::nan("")}) {
      Tensor gpu = empty({3, 5}, dtype, kGpu);
      gpu.fill_(v);
      expect_matches(full({3, 5}, v, dtype), gpu, 0.0, fmt::format("fill {} {}", dtype, v));
      Tensor strided = zeros({5, 3}, dtype, kGpu).transpose(0, 1);
      strided.fill_(v);
      expect_matches(full({3, 5}, v, dtype), strided, 0.0,
                     fmt::format("strided fill {} {}", dtype, v));
    }
  }
}

TEST(CudaOps, BinaryOpsMatchTheCpuOnViews) {
  for (DType dtype : kArithmeticDTypes) {
    const Tensor a = random_tensor({4, 6}, dtype, 2, true);
    const Tensor b = random_tensor({4, 6}, dtype, 3);
    const Tensor ga = a.to(kGpu);
    const Tensor gb = b.to(kGpu);
    for (const View& v : views()) {
      const std::string what = fmt::format("{} {}", dtype, v.name);
      expect_matches(maximum(v.make(a), b), maximum(v.make(ga), gb), 0.0, "maximum " + what);
      expect_matches(minimum(a, v.make(b)), minimum(ga, v.make(gb)), 0.0, "minimum " + what);
      if (dtype == DType::Bool) continue;
      expect_matches(v.make(a) + b, v.make(ga) + gb, 0.0, "add " + what);
      expect_matches(a - v.make(b), ga - v.make(gb), 0.0, "sub " + what);
      expect_matches(v.make(a) * v.make(b), v.make(ga) * v.make(gb), 0.0, "mul " + what);
      expect_matches(v.make(a) / b, v.make(ga) / gb, 0.0, "div " + what);
      expect_matches(a * 2.5 + 1.0, ga * 2.5 + 1.0, 0.0, "scalar " + what);
    }
    // Broadcasting of lower-rank operands.
    const Tensor row = random_tensor({6}, dtype, 4);
    expect_matches(maximum(a, row), maximum(ga, row.to(kGpu)), 0.0, fmt::format("row {}", dtype));
  }
}

TEST(CudaOps, UnaryOpsMatchTheCpu) {
  for (DType dtype : kArithmeticDTypes) {
    if (dtype == DType::Bool) continue;
    const Tensor a = random_tensor({4, 6}, dtype, 5, true);
    const Tensor ga = a.to(kGpu);
    for (const View& v : views()) {
      const std::string what = fmt::format("{} {}", dtype, v.name);
      expect_matches(neg(v.make(a)), neg(v.make(ga)), 0.0, "neg " + what);
      expect_matches(abs(v.make(a)), abs(v.make(ga)), 0.0, "abs " + what);
      expect_matches(relu(v.make(a)), relu(v.make(ga)), 0.0, "relu " + what);
      // Integer inputs compute in F32; the device math library may round the last bit otherwise.
      const double tol = loose(is_floating(dtype) ? dtype : DType::F32);
      expect_matches(exp(v.make(a)), exp(v.make(ga)), tol, "exp " + what);
      expect_matches(log(abs(v.make(a))), log(abs(v.make(ga))), tol, "log " + what);
      expect_matches(sqrt(abs(v.make(a))), sqrt(abs(v.make(ga))), 0.0, "sqrt " + what);
      expect_matches(tanh(v.make(a)), tanh(v.make(ga)), tol, "tanh " + what);
      expect_matches(gelu(v.make(a)), gelu(v.make(ga)), tol, "gelu " + what);
      expect_matches(gelu(v.make(a), GeluApproximate::Tanh),
                     gelu(v.make(ga), GeluApproximate::Tanh), tol, "gelu_tanh " + what);
      expect_matches(erf(v.make(a)), erf(v.make(ga)), tol, "erf " + what);
      expect_matches(sigmoid(v.make(a)), sigmoid(v.make(ga)), tol, "sigmoid " + what);
      expect_matches(silu(v.make(a)), silu(v.make(ga)), tol, "silu " + what);
      expect_matches(log1p(abs(v.make(a))), log1p(abs(v.make(ga))), tol, "log1p " + what);
      expect_matches(expm1(v.make(a)), expm1(v.make(ga)), tol, "expm1 " + what);
      expect_matches(sin(v.make(a)), sin(v.make(ga)), tol, "sin " + what);
      expect_matches(cos(v.make(a)), cos(v.make(ga)), tol, "cos " + what);
      expect_matches(reciprocal(v.make(a)), reciprocal(v.make(ga)), 0.0, "reciprocal " + what);
      expect_matches(clamp(v.make(a), -1.0, 2.0), clamp(v.make(ga), -1.0, 2.0), 0.0,
                     "clamp " + what);
    }
  }
}

TEST(CudaOps, WhereMatchesTheCpu) {
  for (DType dtype : kArithmeticDTypes) {
    const Tensor a = random_tensor({4, 6}, dtype, 21, true);
    const Tensor b = random_tensor({4, 6}, dtype, 22);
    const Tensor c = gt_zero(random_tensor({4, 6}, DType::F32, 23));
    for (const View& v : views()) {
      const std::string what = fmt::format("where {} {}", dtype, v.name);
      expect_matches(where(v.make(c), v.make(a), b),
                     where(v.make(c.to(kGpu)), v.make(a.to(kGpu)), b.to(kGpu)), 0.0, what);
    }
  }
}

// The ordering, scanning and counting ops and the scatters (issue 27) on GPU tensors: their
// results come back to the GPU and equal the CPU's (sort, topk, cumsum and scatter compute on the
// host; the others through the GPU's scatter_add, gather and comparison kernels).
TEST(CudaOps, OrderingScanningCountingAndScattersMatchTheCpu) {
  const Tensor x = random_tensor({6, 5}, DType::F32, 41);
  const Tensor gx = x.to(kGpu);
  const auto top = topk(x, 2);
  const auto gtop = topk(gx, 2);
  expect_matches(top.values, gtop.values, 0.0, "topk values");
  expect_matches(top.indices, gtop.indices, 0.0, "topk indices");
  expect_matches(sort(x, 0, true).values, sort(gx, 0, true).values, 0.0, "sort");
  expect_matches(argsort(x, 1), argsort(gx, 1), 0.0, "argsort");
  expect_matches(max(x, 1).values, max(gx, 1).values, 0.0, "max");
  expect_matches(argmin(x, 0), argmin(gx, 0), 0.0, "argmin");
  expect_matches(cumsum(x, 1), cumsum(gx, 1), 0.0, "cumsum");
  const Tensor ids = from_vector<int64_t>({0, 4, 3, 3, 1, 0, 2, 3}, {8});
  expect_matches(one_hot(ids, 5), one_hot(ids.to(kGpu), 5), 0.0, "one_hot");
  expect_matches(bincount(ids, 6), bincount(ids.to(kGpu), 6), 0.0, "bincount");
  const Tensor src = random_tensor({8, 5}, DType::F64, 42);
  const Tensor base = random_tensor({6, 5}, DType::F64, 43);
  expect_matches(index_add(base, 0, ids, src, 0.5),
                 index_add(base.to(kGpu), 0, ids.to(kGpu), src.to(kGpu), 0.5), 1e-12, "index_add");
  const Tensor index = ids.reshape({8, 1}).expand({8, 5}).contiguous();
  expect_matches(scatter_add(base, 0, index, src),
                 scatter_add(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu)), 1e-12, "scatter_add");
  expect_matches(scatter(base, 0, index, src),
                 scatter(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu)), 0.0, "scatter");
  const Tensor picks = from_vector<int64_t>({4, 0, 2}, {1, 3});
  expect_matches(take_along_dim(x, picks, 1), take_along_dim(gx, picks.to(kGpu), 1), 0.0,
                 "take_along_dim");
}

// The gather and scatter-add kernels, with a block offset (the masked lookup of a vocabulary
// shard) and without, and the index ops built on them.
TEST(CudaOps, GatherAndScatterAddMatchTheCpu) {
  const Tensor table = random_tensor({10, 6}, DType::F32, 31);
  const Tensor ids = from_vector<int64_t>({0, 9, 3, 3, 7, 1, 5, 2}, {8});
  const Tensor index = ids.reshape({8, 1}).expand({8, 6});
  for (int64_t offset : {0, 4}) {
    const Tensor block = table.narrow(0, offset, 4);
    Tensor out = zeros({8, 6});
    Tensor gout = zeros({8, 6}, DType::F32, kGpu);
    ASSERT_TRUE(cpu_ops().gather(out, block, 0, index, offset, 10));
    ASSERT_TRUE(
        kernels_for("test", kGpu).gather(gout, block.to(kGpu), 0, index.to(kGpu), offset, 10));
    expect_matches(out, gout, 0.0, fmt::format("gather at offset {}", offset));
    const Tensor src = random_tensor({8, 6}, DType::F64, 32);
    Tensor acc = zeros({4, 6}, DType::F64);
    Tensor gacc = zeros({4, 6}, DType::F64, kGpu);
    ASSERT_TRUE(cpu_ops().scatter_add(acc, 0, index, src, offset, 10));
    ASSERT_TRUE(
        kernels_for("test", kGpu).scatter_add(gacc, 0, index.to(kGpu), src.to(kGpu), offset, 10));
    expect_matches(acc, gacc, 1e-12, fmt::format("scatter_add at offset {}", offset));
  }
  Tensor gout = zeros({8, 6}, DType::F32, kGpu);
  EXPECT_FALSE(kernels_for("test", kGpu)
                   .gather(gout, table.to(kGpu), 0, index.to(kGpu), 0, 9));  // 9 is out of range
  expect_matches(index_select(table, 1, from_vector<int64_t>({5, 0, 2})),
                 index_select(table.to(kGpu), 1, from_vector<int64_t>({5, 0, 2}).to(kGpu)), 0.0,
                 "index_select");
  expect_matches(embedding(ids.reshape({2, 4}), table),
                 embedding(ids.reshape({2, 4}).to(kGpu), table.to(kGpu)), 0.0, "embedding");
  const Tensor g = random_tensor({2, 4, 6}, DType::F32, 33);
  expect_matches(
      call(op::embedding_backward, {g, ids.reshape({2, 4}), table}),
      call(op::embedding_backward, {g.to(kGpu), ids.reshape({2, 4}).to(kGpu), table.to(kGpu)}),
      1e-6, "embedding_backward");
}

// The transformer ops are built from other ops: on the GPU they run those ops' kernels.
TEST(CudaOps, TransformerOpsMatchTheCpu) {
  const Tensor x = random_tensor({2, 5, 8}, DType::F64, 41);
  const Tensor w = random_tensor({8}, DType::F64, 42);
  const Tensor b = random_tensor({8}, DType::F64, 43);
  auto gpu = [](const Tensor& t) { return t.to(kGpu); };
  expect_matches(layer_norm(x, w, b), layer_norm(gpu(x), gpu(w), gpu(b)), 1e-12, "layer_norm");
  expect_matches(rms_norm(x, w), rms_norm(gpu(x), gpu(w)), 1e-12, "rms_norm");
  expect_matches(dropout(x, 0.3, 7), dropout(gpu(x), 0.3, 7), 0.0, "dropout");
  expect_matches(triu(x, 1), triu(gpu(x), 1), 0.0, "triu");
  expect_matches(argmax(x, 2), argmax(gpu(x), 2), 0.0, "argmax");
  const Tensor q = random_tensor({2, 3, 5, 4}, DType::F64, 44);
  expect_matches(scaled_dot_product_attention(q, q * 0.5, q + 1.0, true),
                 scaled_dot_product_attention(gpu(q), gpu(q) * 0.5, gpu(q) + 1.0, true), 1e-12,
                 "scaled_dot_product_attention");
  // Issue 27's Llama ops: GQA with a Bool mask, rotary embeddings (scaled, with and without
  // positions) and repeat_interleave.
  const Tensor kv = random_tensor({2, 1, 5, 4}, DType::F64, 46);
  const Tensor keep = gt(random_tensor({5, 5}, DType::F64, 47), full({}, -0.5, DType::F64));
  expect_matches(
      scaled_dot_product_attention(q, kv, kv * 2.0, keep, {.enable_gqa = true}),
      scaled_dot_product_attention(gpu(q), gpu(kv), gpu(kv) * 2.0, gpu(keep), {.enable_gqa = true}),
      1e-12, "scaled_dot_product_attention gqa mask");
  const RopeConfig rope{.scaling = RopeScaling{}};
  const Tensor positions = from_vector<int64_t>({3, 9000, 65535}, {3});  // q as [B, S, H, D]
  expect_matches(rotary_embedding(q, positions, rope),
                 rotary_embedding(gpu(q), gpu(positions), rope), 1e-12, "rotary_embedding");
  expect_matches(rotary_embedding(q), rotary_embedding(gpu(q)), 1e-12, "rotary_embedding rows");
  expect_matches(repeat_interleave(q, 3, 1), repeat_interleave(gpu(q), 3, 1), 0.0,
                 "repeat_interleave");
  const Tensor logits = random_tensor({6, 7}, DType::F64, 45);
  const Tensor target = from_vector<int64_t>({0, 6, 3, 3, 1, 2}, {6});
  expect_matches(cross_entropy(logits, target), cross_entropy(gpu(logits), gpu(target)), 1e-12,
                 "cross_entropy");
  expect_matches(
      call(op::cross_entropy_backward, {ones({}, DType::F64), logits, target}),
      call(op::cross_entropy_backward, {ones({}, DType::F64, kGpu), gpu(logits), gpu(target)}),
      1e-12, "cross_entropy_backward");
}

TEST(CudaOps, ReductionsMatchTheCpu) {
  for (DType dtype : kArithmeticDTypes) {
    const Tensor a = random_tensor({3, 5, 70}, dtype, 6);
    const Tensor ga = a.to(kGpu);
    // Short rows take the one-thread-per-output kernel, long ones the block kernel.
    const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {0, 1, 2}};
    for (const auto& dims : dim_sets) {
      for (bool keep : {false, true}) {
        const std::string what = fmt::format("{} dims {} keepdim {}", dtype, shape_str(dims), keep);
        const double tol = is_floating(dtype) ? loose(dtype) : 0.0;
        expect_matches(sum(a, dims, keep), sum(ga, dims, keep), tol, "sum " + what);
        expect_matches(sum(a.transpose(0, 2), dims, keep), sum(ga.transpose(0, 2), dims, keep), tol,
                       "sum of transposed " + what);
        if (dtype != DType::Bool) {
          expect_matches(amax(a, dims, keep), amax(ga, dims, keep), 0.0, "amax " + what);
          expect_matches(amin(a, dims, keep), amin(ga, dims, keep), 0.0, "amin " + what);
        }
        if (is_floating(dtype)) {
          expect_matches(mean(a, dims, keep), mean(ga, dims, keep), tol, "mean " + what);
        }
      }
    }
    if (is_floating(dtype)) {
      const Tensor nans = random_tensor({4, 100}, dtype, 7, true);
      expect_matches(amax(nans, {1}), amax(nans.to(kGpu), {1}), 0.0, "amax with NaN");
      expect_matches(sum(zeros({4, 0}, dtype), {1}), sum(zeros({4, 0}, dtype, kGpu), {1}), 0.0,
                     "empty sum");
      expect_matches(mean(zeros({4, 0}, dtype), {1}), mean(zeros({4, 0}, dtype, kGpu), {1}), 0.0,
                     "empty mean (NaN)");
    }
  }
}

TEST(CudaOps, SoftmaxMatchesTheCpu) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (int64_t length : {1, 7, 33, 300}) {
      const Tensor a = random_tensor({5, length}, dtype, 8);
      for (int64_t d : {0, 1}) {
        const std::string what = fmt::format("{} length {} dim {}", dtype, length, d);
        expect_matches(softmax(a, d), softmax(a.to(kGpu), d), loose(dtype), "softmax " + what);
        expect_matches(log_softmax(a, d), log_softmax(a.to(kGpu), d), loose(dtype),
                       "log_softmax " + what);
        expect_matches(softmax(a.transpose(0, 1), d), softmax(a.to(kGpu).transpose(0, 1), d),
                       loose(dtype), "softmax of transposed " + what);
      }
    }
    const Tensor specials = random_tensor({2, 16}, dtype, 9, true);
    expect_matches(softmax(specials, 1), softmax(specials.to(kGpu), 1), loose(dtype),
                   fmt::format("softmax with NaN and inf {}", dtype));
  }
}

TEST(CudaOps, MatmulMatchesTheCpuForEveryLayout) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    const double tol = is_floating(dtype) ? 4 * loose(dtype) : 0.0;
    const Tensor a = random_tensor({5, 7}, dtype, 10);
    const Tensor b = random_tensor({7, 3}, dtype, 11);
    const Tensor ga = a.to(kGpu);
    const Tensor gb = b.to(kGpu);
    const std::string what = fmt::format("{}", dtype);
    expect_matches(matmul(a, b), matmul(ga, gb), tol, "matmul " + what);
    // Column-major operands (transposed views) map to cuBLAS transposes, not copies.
    const Tensor at = a.transpose(0, 1).contiguous().transpose(0, 1);
    const Tensor bt = b.transpose(0, 1).contiguous().transpose(0, 1);
    expect_matches(matmul(at, bt),
                   matmul(at.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1),
                          bt.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1)),
                   tol, "matmul column-major " + what);
    expect_matches(matmul(a.narrow(1, 1, 5), b.narrow(0, 2, 5)),
                   matmul(ga.narrow(1, 1, 5), gb.narrow(0, 2, 5)), tol, "matmul narrowed " + what);
    // 1-D operands, batches with broadcasting, addmm with alpha and beta, an empty inner dim.
    expect_matches(matmul(a.select(0, 1), b), matmul(ga.select(0, 1), gb), tol, "vec @ mat");
    const Tensor batch = random_tensor({4, 5, 7}, dtype, 12);
    expect_matches(matmul(batch, b), matmul(batch.to(kGpu), gb), tol, "batched " + what);
    expect_matches(bmm(batch, batch.transpose(1, 2)),
                   bmm(batch.to(kGpu), batch.to(kGpu).transpose(1, 2)), tol, "bmm " + what);
    const Tensor c = random_tensor({5, 3}, dtype, 13);
    expect_matches(addmm(c, a, b, 2.0, 3.0), addmm(c.to(kGpu), ga, gb, 2.0, 3.0), tol,
                   "addmm " + what);
    expect_matches(addmm(c, a.narrow(1, 0, 0), b.narrow(0, 0, 0), 2.0, 1.0),
                   addmm(c.to(kGpu), ga.narrow(1, 0, 0), gb.narrow(0, 0, 0), 2.0, 1.0), 0.0,
                   "addmm with an empty inner dim " + what);
  }
}

TEST(CudaOps, ComparisonsMatchTheCpu) {
  for (DType dtype : kArithmeticDTypes) {
    const Tensor a = random_tensor({4, 6}, dtype, 14, true);
    const Tensor b = random_tensor({4, 6}, dtype, 15);
    const Tensor ga = a.to(kGpu);
    const Tensor gb = b.to(kGpu);
    const std::string what = fmt::format("{}", dtype);
    EXPECT_EQ(equal(a, a), equal(ga, ga)) << what;
    EXPECT_EQ(equal(b, b), equal(gb, gb)) << what;
    EXPECT_EQ(equal(a, b), equal(ga, gb)) << what;
    EXPECT_EQ(allclose(a, b), allclose(ga, gb)) << what;
    EXPECT_EQ(allclose(b, b), allclose(gb, gb)) << what;
    EXPECT_EQ(has_nonfinite(a), has_nonfinite(ga)) << what;
    EXPECT_EQ(has_nonfinite(b), has_nonfinite(gb)) << what;
    const double want = max_abs_diff(b, b.transpose(0, 1).contiguous().reshape({4, 6}));
    const double got = max_abs_diff(gb, gb.transpose(0, 1).contiguous().reshape({4, 6}));
    EXPECT_EQ(want, got) << what;
    EXPECT_TRUE(std::isnan(max_abs_diff(ga, gb)) == std::isnan(max_abs_diff(a, b))) << what;
  }
}

TEST(CudaOps, TheCachingAllocatorReusesFreedBlocks) {
  const std::size_t before = gpu::allocated_bytes(0);
  {
    const Tensor t = empty({1 << 20}, DType::F32, kGpu);
    EXPECT_GE(gpu::allocated_bytes(0), before + (std::size_t{4} << 20));
  }
  EXPECT_EQ(gpu::allocated_bytes(0), before);
  EXPECT_GE(gpu::cached_bytes(0), std::size_t{4} << 20);
  const std::size_t cached = gpu::cached_bytes(0);
  {
    const Tensor t = empty({1 << 20}, DType::F32, kGpu);  // the same size class: reused
    EXPECT_EQ(gpu::cached_bytes(0), cached - (std::size_t{4} << 20));
  }
  gpu::release_cached(0);
  EXPECT_EQ(gpu::cached_bytes(0), 0u);
  // Printing a device tensor copies it back; its text names the device.
  EXPECT_NE(ones({2}, DType::F32, kGpu).to_string().find("device=cuda:0"), std::string::npos);
}

}  // namespace
}  // namespace spmd

// Skips (exit code 77) without a usable GPU; test listing works everywhere.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    const spmd::CudaDevices gpus = spmd::probe_cuda_devices();
    if (gpus.count == 0) {
      std::printf("[  SKIPPED ] cuda_ops_test: no usable GPU: %s\n", gpus.error.c_str());
      return 77;
    }
    spmd::install_cuda();
  }
  return RUN_ALL_TESTS();
}
