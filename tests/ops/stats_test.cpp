// logsumexp, var, std, norm and prod against brute-force references written here from torch's
// definitions (each output element from its group of input elements, in double), their gradients
// against central differences of those references, prod's gradient with zeros against the
// product of the other elements, and their sharded forms. The conformance table
// (conformance_test.cpp) runs their rows on every kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::expect_throws;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The output of reducing `x` (row-major, of `shape`) over `dims` (empty: every dim) with `f`
// applied to each group of elements, in the order of the output's elements (keepdim or not).
std::vector<double> brute_reduce(const std::vector<double>& x, const Shape& shape,
                                 std::vector<int64_t> dims,
                                 const std::function<double(const std::vector<double>&)>& f) {
  if (dims.empty()) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) dims.push_back(d);
  }
  for (int64_t& d : dims) d = d < 0 ? d + static_cast<int64_t>(shape.size()) : d;
  Shape kept = shape;
  for (int64_t d : dims) kept[static_cast<size_t>(d)] = 1;
  std::vector<std::vector<double>> groups(static_cast<size_t>(shape_numel(kept)));
  for (int64_t i = 0; i < shape_numel(shape); ++i) {
    auto index = testing::unravel(i, shape);
    for (int64_t d : dims) index[static_cast<size_t>(d)] = 0;
    int64_t g = 0;
    for (size_t d = 0; d < kept.size(); ++d) g = g * kept[d] + index[d];
    groups[static_cast<size_t>(g)].push_back(x[static_cast<size_t>(i)]);
  }
  std::vector<double> out;
  for (const auto& group : groups) out.push_back(f(group));
  return out;
}

double brute_logsumexp(const std::vector<double>& v) {
  double total = 0.0;
  for (double e : v) total += std::exp(e);
  return std::log(total);
}

double brute_var(const std::vector<double>& v, double correction) {
  double mean = 0.0;
  for (double e : v) mean += e;
  mean /= static_cast<double>(v.size());
  double ss = 0.0;
  for (double e : v) ss += (e - mean) * (e - mean);
  return ss / std::max(0.0, static_cast<double>(v.size()) - correction);
}

double brute_norm(const std::vector<double>& v, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0.0 : kInf;
    for (double e : v) m = p > 0 ? std::max(m, std::abs(e)) : std::min(m, std::abs(e));
    return m;
  }
  double total = 0.0;
  for (double e : v) total += p == 0.0 ? (e != 0.0 ? 1.0 : 0.0) : std::pow(std::abs(e), p);
  return p == 0.0 ? total : std::pow(total, 1.0 / p);
}

double brute_prod(const std::vector<double>& v) {
  double p = 1.0;
  for (double e : v) p *= e;
  return p;
}

struct StatCase {
  std::string name;
  std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)> op;
  std::function<double(const std::vector<double>&)> reference;
};

std::vector<StatCase> stat_cases() {
  std::vector<StatCase> out;
  out.push_back({"logsumexp",
                 [](const Tensor& x, const auto& d, bool k) { return logsumexp(x, d, k); },
                 brute_logsumexp});
  for (double c : {1.0, 0.0, 2.5}) {
    out.push_back({fmt::format("var correction {}", c),
                   [c](const Tensor& x, const auto& d, bool k) { return var(x, d, c, k); },
                   [c](const std::vector<double>& v) { return brute_var(v, c); }});
    out.push_back({fmt::format("std correction {}", c),
                   [c](const Tensor& x, const auto& d, bool k) { return std(x, d, c, k); },
                   [c](const std::vector<double>& v) { return std::sqrt(brute_var(v, c)); }});
  }
  for (double p : {2.0, 1.0, 3.0, 0.5, 0.0, kInf, -kInf}) {
    out.push_back({fmt::format("norm {}", p),
                   [p](const Tensor& x, const auto& d, bool k) { return norm(x, p, d, k); },
                   [p](const std::vector<double>& v) { return brute_norm(v, p); }});
  }
  out.push_back(
      {"prod", [](const Tensor& x, const auto& d, bool k) { return prod(x, d, k); }, brute_prod});
  return out;
}

struct Dims {
  Shape shape;
  std::vector<int64_t> dims;
  bool keep;
};

const std::vector<Dims> kDims = {{{5, 6}, {1}, false},       {{5, 6}, {0}, true},
                                 {{3, 4, 5}, {0, 2}, false}, {{3, 4, 5}, {-1}, true},
                                 {{2, 3, 2}, {}, false},     {{7}, {0}, false}};

TEST(Stats, MatchABruteForceReferenceWithGradients) {
  uint64_t seed = 1;
  for (const StatCase& c : stat_cases()) {
    for (const Dims& d : kDims) {
      SCOPED_TRACE(fmt::format("{} of {} over {} keepdim {}", c.name, shape_str(d.shape),
                               shape_str(d.dims), d.keep));
      const Tensor x0 = randn(d.shape, ++seed, DType::F64) * 1.5;
      const std::vector<double> xs = x0.to_vector<double>();
      Tensor x = x0.clone().requires_grad_();
      const Tensor out = c.op(x, d.dims, d.keep);
      const std::vector<double> want = brute_reduce(xs, d.shape, d.dims, c.reference);
      const std::vector<double> got = out.to_vector<double>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << "element " << i;
      }
      // The gradient of sum(out * w) against central differences of the reference.
      const Tensor w = randn(out.shape(), ++seed, DType::F64);
      const std::vector<double> ws = w.to_vector<double>();
      backward(out, w);
      const std::vector<double> grad = x.grad().to_vector<double>();
      auto weighted = [&](const std::vector<double>& v) {
        const std::vector<double> o = brute_reduce(v, d.shape, d.dims, c.reference);
        double s = 0.0;
        for (size_t i = 0; i < o.size(); ++i) s += o[i] * ws[i];
        return s;
      };
      for (size_t i = 0; i < xs.size(); ++i) {
        std::vector<double> up = xs;
        std::vector<double> down = xs;
        up[i] += 1e-6;
        down[i] -= 1e-6;
        const double numeric = (weighted(up) - weighted(down)) / 2e-6;
        EXPECT_NEAR(grad[i], numeric, 1e-5 * (1 + std::abs(numeric))) << "gradient " << i;
      }
    }
  }
}

// Large values do not overflow (the shift by the maximum); -inf rows give -inf, +inf gives +inf.
TEST(Stats, LogSumExpIsStable) {
  const Tensor x = from_vector<double>({1000.0, 1000.0, -kInf, -kInf, kInf, 0.0}, {3, 2});
  const std::vector<double> got = logsumexp(x, {1}).to_vector<double>();
  EXPECT_NEAR(got[0], 1000.0 + std::log(2.0), 1e-12);
  EXPECT_EQ(got[1], -kInf);
  EXPECT_EQ(got[2], kInf);
  EXPECT_NEAR(logsumexp(from_vector<float>({100.0f, 100.0f}, {2}), {0}).item<double>(),
              100.0 + std::log(2.0), 1e-4);
  // Integers give F32.
  EXPECT_EQ(logsumexp(arange(4, DType::I64), {0}).dtype(), DType::F32);
}

// torch's prod_backward: with one zero in a group only the zero gets a gradient (the product of
// the others), with two or more none does; no division by zero.
TEST(Stats, ProdGradientWithZeros) {
  const Tensor x0 = from_vector<double>({2.0, 0.0, 3.0, 4.0,    // one zero
                                         0.0, 5.0, 0.0, 1.5,    // two zeros
                                         -1.0, 2.0, 0.5, 3.0},  // none
                                        {3, 4});
  Tensor x = x0.clone().requires_grad_();
  const Tensor p = prod(x, {1});
  EXPECT_TRUE(equal(p, from_vector<double>({0.0, 0.0, -3.0}, {3}))) << p;
  backward(sum(p * from_vector<double>({1.0, 2.0, 3.0}, {3})));
  // The product of the others, brute force, times the row's weight.
  const std::vector<double> xs = x0.to_vector<double>();
  std::vector<double> want;
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 4; ++i) {
      double others = 1.0;
      for (int64_t j = 0; j < 4; ++j) {
        if (j != i) others *= xs[static_cast<size_t>(r * 4 + j)];
      }
      want.push_back(others * static_cast<double>(r + 1));
    }
  }
  const std::vector<double> got = x.grad().to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
    EXPECT_FALSE(std::isnan(got[i]));
  }
  // Integers and Bool give I64; no element gives 1.
  EXPECT_EQ(prod(from_vector<int32_t>({3, -2, 5}, {3})).item<int64_t>(), -30);
  EXPECT_EQ(prod(ones({3}, DType::Bool)).dtype(), DType::I64);
  EXPECT_EQ(prod(zeros({0, 2}), {0}).to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
}

// norm at 0: a zero gradient (torch masks the division by a zero norm); std of equal values too.
TEST(Stats, ZeroNormAndZeroStdHaveZeroGradients) {
  for (double p : {2.0, 3.0}) {
    Tensor x = zeros({2, 3}, DType::F64).requires_grad_();
    backward(sum(norm(x, p, {1})));
    EXPECT_TRUE(equal(x.grad(), zeros({2, 3}, DType::F64))) << p << x.grad();
  }
  Tensor y = full({4}, 2.0, DType::F64).requires_grad_();
  backward(std(y));
  EXPECT_TRUE(equal(y.grad(), zeros({4}, DType::F64))) << y.grad();
  // One element: var divides by max(0, 1 - 1) = 0, NaN (torch's).
  EXPECT_TRUE(std::isnan(var(ones({1}, DType::F64)).item<double>()));
}

TEST(Stats, Errors) {
  expect_throws<Unsupported>([] { var(arange(4, DType::I64)); }, {"var", "i64", "[4]"});
  expect_throws<Unsupported>([] { norm(arange(4, DType::I32)); }, {"norm", "i32"});
  expect_throws<ShapeError>([] { std(ones({2, 3}), {0, 2}); }, {"std", "[2, 3]"});
  expect_throws<ShapeError>([] { prod(ones({2, 3}), {1, -1}); }, {"prod", "more than once"});
  expect_throws<ConfigError>([] { norm(ones({3}), std::nan("")); }, {"norm", "p is NaN"});
  expect_throws<ShapeError>([] { norm(ones({2, 0}), kInf, {1}); }, {"norm", "zero elements"});
}

// Sharded: a reduced dim that is sharded is gathered (prod: P(product) instead), the other dims
// keep their shards; the values and gradients equal the Tensor op's.
TEST(Stats, Sharded) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {2, 2});
  const Tensor g = randn({5, 6}, 40, DType::F64);
  struct Sharded {
    std::string name;
    std::function<DTensor(const DTensor&)> on_dtensor;
    std::function<Tensor(const Tensor&)> on_tensor;
    Placements input;
    Placements output;
  };
  const Placements in{Shard{0}, Shard{1}};
  const Placements rows{Shard{0}, Replicate{}};
  auto lse = [](const auto& x) { return logsumexp(x, {1}); };
  for (const Sharded& s : std::vector<Sharded>{
           // Over the sharded dim: table ops, the shift by the maximum added last (P(max)).
           {"logsumexp", lse, lse, in, {Shard{0}, Partial{ReduceOp::Max}}},
           {"logsumexp of a whole dim", lse, lse, rows, rows},
           {"var", [](const DTensor& x) { return var(x, {1}); },
            [](const Tensor& x) { return var(x, {1}); }, in, rows},
           {"std keepdim",
            [](const DTensor& x) { return std(x, {0}, 1.0, true); },
            [](const Tensor& x) { return std(x, {0}, 1.0, true); },
            in,
            {Replicate{}, Shard{1}}},
           {"norm", [](const DTensor& x) { return norm(x, 2.0, {1}); },
            [](const Tensor& x) { return norm(x, 2.0, {1}); }, in, rows},
           {"norm inf",
            [](const DTensor& x) { return norm(x, kInf, {0}); },
            [](const Tensor& x) { return norm(x, kInf, {0}); },
            in,
            {Replicate{}, Shard{0}}},
           {"prod",
            [](const DTensor& x) { return prod(x, {1}); },
            [](const Tensor& x) { return prod(x, {1}); },
            in,
            {Shard{0}, Partial{ReduceOp::Product}}}}) {
    SCOPED_TRACE(s.name);
    DTensor x = distribute_tensor(g, mesh, s.input);
    x.requires_grad_();
    const DTensor out = s.on_dtensor(x);
    EXPECT_EQ(out.placements(), s.output);
    Tensor leaf = g.clone().requires_grad_();
    const Tensor want = s.on_tensor(leaf);
    EXPECT_TRUE(allclose(out.full_tensor(), want, 1e-12, 1e-12)) << out.full_tensor() << want;
    backward(sum(out));
    backward(sum(want));
    EXPECT_EQ(x.grad().placements(), s.input);
    EXPECT_TRUE(allclose(x.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
  }
  // logsumexp over the sharded dim runs as table ops (the maximum and the sum of exponentials are
  // all_reduced: values of the output's size), not as the entry on a gathered input; -inf and
  // large values as on one device.
  const Tensor h = from_vector<double>({1000.0, 999.0, -kInf, -kInf, 2.0, 3.0, 0.5, -1.0}, {2, 4})
                       .transpose(0, 1)
                       .contiguous();
  DTensor x = distribute_tensor(h, mesh, {Replicate{}, Shard{0}});
  x.requires_grad_();
  std::set<std::string> ran;
  const int observer = add_op_observer([&](const OpEvent& e) { ran.insert(std::string(e.op)); });
  const DTensor out = logsumexp(x, {0}, true);
  remove_op_observer(observer);
  EXPECT_EQ(ran.count("logsumexp"), 0u);
  EXPECT_EQ(ran.count("amax"), 1u);
  Tensor leaf = h.clone().requires_grad_();
  const Tensor want = logsumexp(leaf, {0}, true);
  EXPECT_TRUE(allclose(out.full_tensor(), want, 1e-12, 1e-12)) << out.full_tensor() << want;
  backward(sum(out));
  backward(sum(want));
  EXPECT_EQ(x.grad().placements(), x.placements());
  EXPECT_TRUE(allclose(x.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
}

}  // namespace
}  // namespace spmd
