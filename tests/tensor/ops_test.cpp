// Tensor ops beyond the op table's elementwise rows (tests/ops/conformance_test.cpp): broadcasting
// runs, NaN, wrapping, scalar promotion, special values, reductions, softmax, joining, comparisons.
//
// Every op runs on seeded random shapes (0-size dims included) with every memory layout of
// reference.h, for every dtype (pair) it takes, against a naive loop in double; see
// reference.h for why most comparisons are exact.
#include <spmd/core/parallel.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/element_ops.h>
#include <spmd/tensor/random.h>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::broadcast;
using testing::broadcast_index;
using testing::element;
using testing::expect_throws;
using testing::expect_values;
using testing::Gen;
using testing::layout_name;
using testing::round_to;
using testing::unravel;
using testing::values;

TEST(BinaryOps, LargeContiguousAndBroadcastRunsInParallelChunks) {
  // Big enough for parallel_for; offsets and tails of every chunk must line up.
  Gen gen(2);
  const Tensor a = gen.tensor({3, 700001}, DType::F32, testing::Layout::Contiguous);
  const Tensor b = gen.tensor({700001}, DType::F32, testing::Layout::Contiguous);
  const Tensor out = a * b;
  std::vector<double> want;
  for (int64_t i = 0; i < out.numel(); ++i) {
    want.push_back(
        round_to(DType::F32, element(a, {i / 700001, i % 700001}) * element(b, {i % 700001})));
  }
  expect_values(out, want, 0, 0, "a * b broadcast");
  const Tensor t = a.transpose(0, 1) + 1.0;
  EXPECT_EQ(element(t, {700000, 2}), element(a, {2, 700000}) + 1);
}

// A walk of more than 8 dims that cannot merge (StridedLoop's DimVec holds 8 in place, the rest
// on the heap): a reversed 10-d tensor plus a broadcast row, element by element.
TEST(BinaryOps, WalksOfMoreThanEightDimsThatCannotMerge) {
  const Shape shape(10, 2);
  std::vector<int64_t> reversed(10);
  for (int64_t d = 0; d < 10; ++d) reversed[static_cast<size_t>(d)] = 9 - d;
  const Tensor x = spmd::rand(shape, 7, DType::F64).permute(reversed);
  const Tensor row = spmd::rand({2}, 8, DType::F64);
  const Tensor sum = x + row;
  const std::vector<double> xv = values(x);  // in x's logical (row-major) order
  const std::vector<double> rv = values(row);
  const std::vector<double> got = values(sum);
  ASSERT_EQ(got.size(), size_t{1024});
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], xv[i] + rv[i % 2]) << "element " << i;
  }
}

TEST(BinaryOps, NaNPropagatesThroughMaximumAndMinimum) {
  const Tensor a = from_vector<float>({NAN, 1, 2, NAN});
  const Tensor b = from_vector<float>({0, NAN, 1, NAN});
  for (const Tensor& r : {maximum(a, b), minimum(a, b), maximum(b, a), minimum(b, a)}) {
    const auto v = values(r);
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[3]));
  }
  EXPECT_EQ(values(maximum(a, b))[2], 2);
  EXPECT_EQ(values(minimum(a, b))[2], 1);
}

TEST(BinaryOps, IntegerArithmeticWrapsAround) {
  const Tensor big = full({1}, 2147483647, DType::I32);
  EXPECT_EQ(values(big + big)[0], -2);
  EXPECT_EQ(values(full({1}, -2147483648.0, DType::I32) - full({1}, 1, DType::I32))[0], 2147483647);
  EXPECT_EQ(values(neg(full({1}, -2147483648.0, DType::I32)))[0], -2147483648.0);
  EXPECT_EQ(values(full({1}, 3, DType::I64) / full({1}, 0, DType::I64))[0], INFINITY);
}

TEST(BinaryOps, ScalarOperandsFollowPromotionNote) {
  Gen gen(3);
  using Fn = std::function<Tensor(const Tensor&, double)>;
  struct ScalarCase {
    const char* name;
    Fn op;
    std::function<double(double, double)> ref;  // (tensor element, scalar)
    bool arithmetic;
    bool divides;
  };
  const ScalarCase cases[] = {
      {"t+s", [](const Tensor& t, double s) { return t + s; },
       [](double x, double s) { return x + s; }, true, false},
      {"s+t", [](const Tensor& t, double s) { return s + t; },
       [](double x, double s) { return s + x; }, true, false},
      {"t-s", [](const Tensor& t, double s) { return t - s; },
       [](double x, double s) { return x - s; }, true, false},
      {"s-t", [](const Tensor& t, double s) { return s - t; },
       [](double x, double s) { return s - x; }, true, false},
      {"t*s", [](const Tensor& t, double s) { return t * s; },
       [](double x, double s) { return x * s; }, true, false},
      {"s*t", [](const Tensor& t, double s) { return s * t; },
       [](double x, double s) { return s * x; }, true, false},
      {"t/s", [](const Tensor& t, double s) { return t / s; },
       [](double x, double s) { return x / s; }, false, true},
      {"s/t", [](const Tensor& t, double s) { return s / t; },
       [](double x, double s) { return s / x; }, false, true},
  };
  for (const ScalarCase& c : cases) {
    for (DType d : kArithmeticDTypes) {
      for (double s : {3.0, 0.5, -1.25}) {
        const Shape shape = gen.shape(0, 3);
        const auto layout = gen.layout();
        const Tensor t = gen.tensor(shape, d, layout);
        const std::string context = fmt::format("{} with t {} {} ({}), s = {}", c.name, d,
                                                shape_str(shape), layout_name(layout), s);
        DType want_dtype = d;
        if (!is_floating(d) && (s != std::trunc(s) || c.divides)) want_dtype = DType::F32;
        // Only Bool arithmetic with an integral scalar stays Bool, and is refused.
        if (c.arithmetic && want_dtype == DType::Bool) {
          expect_throws<Unsupported>([&] { c.op(t, s); }, {"bool"});
          continue;
        }
        const Tensor out = c.op(t, s);
        ASSERT_EQ(out.dtype(), want_dtype) << context;
        ASSERT_EQ(out.shape(), shape) << context;
        std::vector<double> want;
        for (double x : values(t)) want.push_back(round_to(want_dtype, c.ref(x, s)));
        expect_values(out, want, 0, 0, context);
      }
    }
  }
  // The scalar keeps F32 precision with half types: 0.1 is not rounded to BF16 first.
  const Tensor x = full({1}, 3, DType::BF16);
  EXPECT_EQ(values(x * 0.1)[0], round_to(DType::BF16, 3.0f * 0.1f));
  EXPECT_EQ((-from_vector<int32_t>({1, -2})).to_vector<int32_t>(), (std::vector<int32_t>{-1, 2}));
}

// F32 tanh (element_ops.h's math_tanh, through double) is the double tanh rounded to float: at
// most half an ulp off, on a sweep from subnormals to past saturation, both signs.
TEST(UnaryOps, F32TanhIsCorrectlyRounded) {
  std::vector<float> xs;
  for (float x = 1e-40f; x < 20.0f; x *= 1.0001f) xs.push_back(x);
  for (int i = 0; i < 20000; ++i) xs.push_back(static_cast<float>(i) * 1e-3f);
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  const Tensor t = from_vector<float>(xs, {static_cast<int64_t>(xs.size())});
  const std::vector<double> got = values(tanh(t));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double exact = std::tanh(static_cast<double>(xs[i]));
    const auto f = static_cast<float>(got[i]);
    // The float next to f on the exact value's side.
    const float toward = exact > f ? INFINITY : -INFINITY;
    const double ulp = std::fabs(static_cast<double>(std::nextafter(f, toward)) - f);
    ASSERT_LE(std::fabs(got[i] - exact), 0.5 * ulp) << "tanh(" << xs[i] << ")";
  }
  const std::vector<double> special =
      values(tanh(from_vector<float>({INFINITY, -INFINITY, NAN, 0.0f, -0.0f}, {5})));
  EXPECT_EQ(special[0], 1.0);
  EXPECT_EQ(special[1], -1.0);
  EXPECT_TRUE(std::isnan(special[2]));
  EXPECT_EQ(special[3], 0.0);
  EXPECT_TRUE(std::signbit(special[4]));
}

// Note [Vector math clones] (tensor/kernels/elementwise.cpp): the cloned loops (contiguous F32
// runs, AVX-512 or AVX2 where the CPU has it) give the bits of the scalar loop (the same values
// at stride 2), for tanh and GELU's tanh form forward and backward, over small, large and special
// inputs. A clone with fused multiply-adds fails it.
TEST(UnaryOps, ClonedLoopsGiveTheScalarBits) {
  std::vector<float> pairs;
  for (int i = 0; i < 6000; ++i) {
    const float x = i % 3 == 0   ? static_cast<float>(i - 3000) * 4e-3f
                    : i % 3 == 1 ? static_cast<float>(i - 3000) * 1e-7f
                                 : std::ldexp(1.0f, -30 + i % 40) * (i % 2 == 0 ? 1.0f : -1.0f);
    pairs.push_back(x);
    pairs.push_back(static_cast<float>(i % 17) * 0.25f - 2.0f);  // the gradient
  }
  for (float special : {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 9.5f, -30.0f}) {
    pairs.push_back(special);
    pairs.push_back(1.0f);
  }
  const auto n = static_cast<int64_t>(pairs.size() / 2);
  const Tensor both = from_vector<float>(pairs, {n, 2});
  const Tensor x_strided = both.select(1, 0);
  const Tensor g_strided = both.select(1, 1);
  const Tensor x = x_strided.contiguous();
  const Tensor g = g_strided.contiguous();
  auto bits = [](const Tensor& t) {
    std::vector<uint32_t> out;
    for (float v : t.contiguous().to_vector<float>()) out.push_back(std::bit_cast<uint32_t>(v));
    return out;
  };
  EXPECT_EQ(bits(tanh(x)), bits(tanh(x_strided))) << "tanh";
  const Tensor y = gelu(x, GeluApproximate::Tanh);
  EXPECT_EQ(bits(y), bits(gelu(x_strided, GeluApproximate::Tanh))) << "gelu tanh";
  const OpDef& backward = pointwise::kUnaryDerivative<element::GeluTanh>;
  EXPECT_EQ(bits(call(backward, {g, x, y})), bits(call(backward, {g_strided, x_strided, y})))
      << "gelu tanh backward";
}

TEST(UnaryOps, SpecialValues) {
  const Tensor t = from_vector<float>({NAN, -INFINITY, INFINITY, -0.0f, -1});
  const auto r = values(relu(t));
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(r[2], INFINITY);
  EXPECT_EQ(values(exp(t))[1], 0);
  EXPECT_TRUE(std::isnan(values(log(t))[4]));
  EXPECT_EQ(values(log(full({1}, 0)))[0], -INFINITY);
  EXPECT_EQ(values(gelu(t))[2], INFINITY);
  EXPECT_EQ(values(tanh(t))[1], -1);
}

enum class Red { Sum, Mean, Amax, Amin };

struct ReductionCase {
  const char* name;
  Red kind;
  std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)> op;
  std::function<Tensor(const Tensor&)> op_all;
};

const ReductionCase kReductionCases[] = {
    {"sum", Red::Sum,
     [](const Tensor& t, const std::vector<int64_t>& d, bool k) { return sum(t, d, k); },
     [](const Tensor& t) { return sum(t); }},
    {"mean", Red::Mean,
     [](const Tensor& t, const std::vector<int64_t>& d, bool k) { return mean(t, d, k); },
     [](const Tensor& t) { return mean(t); }},
    {"amax", Red::Amax,
     [](const Tensor& t, const std::vector<int64_t>& d, bool k) { return amax(t, d, k); },
     [](const Tensor& t) { return amax(t); }},
    {"amin", Red::Amin,
     [](const Tensor& t, const std::vector<int64_t>& d, bool k) { return amin(t, d, k); },
     [](const Tensor& t) { return amin(t); }},
};

TEST(Reductions, MatchReferenceOverRandomDimsForEveryDType) {
  Gen gen(5);
  for (const ReductionCase& c : kReductionCases) {
    for (DType d : kArithmeticDTypes) {
      for (int trial = 0; trial < 12; ++trial) {
        const Shape shape = gen.shape(0, 4);
        const auto layout = gen.layout();
        const Tensor t = gen.tensor(shape, d, layout);
        const int64_t ndim = static_cast<int64_t>(shape.size());
        // A random subset of dims, some written negative; none means all (or the no-dims form).
        std::vector<int64_t> dims;
        std::vector<bool> reduced(shape.size(), false);
        for (int64_t k = 0; k < ndim; ++k) {
          if (gen.uniform(0, 1)) {
            dims.push_back(gen.uniform(0, 1) ? k : k - ndim);
            reduced[static_cast<std::size_t>(k)] = true;
          }
        }
        const bool use_all_overload = trial % 4 == 0;
        const bool keepdim = !use_all_overload && gen.uniform(0, 1);
        if (dims.empty() || use_all_overload) {
          dims.clear();
          std::fill(reduced.begin(), reduced.end(), true);
        }
        const std::string context =
            fmt::format("{}({} {} {}, dims {}, keepdim {})", c.name, d, shape_str(shape),
                        layout_name(layout), shape_str(dims), keepdim);
        auto run = [&] { return use_all_overload ? c.op_all(t) : c.op(t, dims, keepdim); };
        if (c.kind == Red::Mean && !is_floating(d)) {
          expect_throws<Unsupported>(run, {"mean", std::string(dtype_name(d)), shape_str(shape)});
          continue;
        }
        Shape kept = shape;
        Shape result_shape;
        int64_t count = 1;
        for (std::size_t k = 0; k < shape.size(); ++k) {
          if (reduced[k]) {
            kept[k] = 1;
            count *= shape[k];
            if (keepdim) result_shape.push_back(1);
          } else {
            result_shape.push_back(shape[k]);
          }
        }
        const bool extremum = c.kind == Red::Amax || c.kind == Red::Amin;
        if (extremum && count == 0 && shape_numel(kept) > 0) {
          expect_throws<ShapeError>(run, {c.name, "zero elements", shape_str(shape)});
          continue;
        }
        const Tensor out = run();
        const DType want_dtype = c.kind == Red::Sum && !is_floating(d) ? DType::I64 : d;
        ASSERT_EQ(out.dtype(), want_dtype) << context;
        ASSERT_EQ(out.shape(), result_shape) << context;
        std::vector<double> acc(static_cast<std::size_t>(shape_numel(kept)),
                                c.kind == Red::Amax   ? -INFINITY
                                : c.kind == Red::Amin ? INFINITY
                                                      : 0.0);
        const Strides kept_strides = contiguous_strides(kept);
        for (int64_t i = 0; i < t.numel(); ++i) {
          const auto index = unravel(i, shape);
          int64_t o = 0;
          for (std::size_t k = 0; k < shape.size(); ++k) {
            if (!reduced[k]) o += index[k] * kept_strides[k];
          }
          const double v = element(t, index);
          double& a = acc[static_cast<std::size_t>(o)];
          a = c.kind == Red::Amax ? std::max(a, v) : c.kind == Red::Amin ? std::min(a, v) : a + v;
        }
        std::vector<double> want;
        for (double a : acc) {
          want.push_back(
              round_to(want_dtype, c.kind == Red::Mean ? a / static_cast<double>(count) : a));
        }
        expect_values(out, want, 0, 0, context);
      }
    }
  }
}

// Note [Parallel reductions] (tensor/kernels/reduce.cpp): large reductions and softmaxes split over
// threads along a kept dim give the bits of one thread, for row and column sums, sums over
// several dims, means, maxima, transposed inputs and softmax along either dim, with sizes that
// split unevenly.
TEST(Reductions, SplitOverThreadsIsBitwiseTheSame) {
  const Tensor a = randn({1023, 701}, 5) * 3.0;
  const Tensor b = randn({6, 67, 1301}, 6);
  const std::vector<std::pair<std::string, std::function<Tensor()>>> cases = {
      {"column sum", [&] { return sum(a, {0}); }},
      {"row sum", [&] { return sum(a, {1}, true); }},
      {"sum of a transpose", [&] { return sum(a.transpose(0, 1), {1}); }},
      {"sum over dims 0 and 1",
       [&] {
         return sum(b, {0, 1});
       }},
      {"sum over dim 1", [&] { return sum(b, {1}); }},
      {"mean over dim 2", [&] { return mean(b, {2}); }},
      {"amax over dim 0", [&] { return amax(b, {0}); }},
      {"F64 sum over dim 1", [&] { return sum(b.to(DType::F64), {1}); }},
      {"softmax along dim 1", [&] { return softmax(a, 1); }},
      {"softmax along dim 0", [&] { return softmax(a, 0); }},
      {"log_softmax of a transpose", [&] { return log_softmax(a.transpose(0, 1), 1); }},
      {"softmax along dim 1 of 3", [&] { return softmax(b, 1); }},
  };
  const int saved = num_threads();
  for (const auto& [name, fn] : cases) {
    set_num_threads(1);
    const Tensor one = fn();
    set_num_threads(4);
    const Tensor many = fn();
    set_num_threads(saved);
    ASSERT_EQ(one.shape(), many.shape()) << name;
    EXPECT_TRUE(std::memcmp(one.contiguous().data_ptr(), many.contiguous().data_ptr(),
                            static_cast<size_t>(one.numel()) * itemsize(one.dtype())) == 0)
        << name;
  }
}

TEST(Reductions, EmptyAndSpecialCases) {
  EXPECT_EQ(sum(empty({0, 3})).item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(mean(empty({0})).item<float>()));
  EXPECT_EQ(amax(empty({0, 3}), {1}).shape(), (Shape{0}));  // nothing to reduce per output
  EXPECT_EQ(sum(from_vector<bool>({true, true, false})).item<int64_t>(), 2);
  EXPECT_EQ(sum(full({3}, 2147483647, DType::I32)).item<int64_t>(), 3 * int64_t{2147483647});
  EXPECT_TRUE(std::isnan(amax(from_vector<float>({1, NAN, 3})).item<float>()));
  EXPECT_TRUE(std::isnan(amin(from_vector<float>({NAN, 1, 3})).item<float>()));
  EXPECT_EQ(sum(full({}, 2.5), {0}).item<float>(), 2.5f);  // a 0-d tensor takes dim 0
  EXPECT_EQ(amax(from_vector<bool>({false, true})).item<bool>(), true);
  // Large enough that accumulating in float would round: F32 sums accumulate in double.
  const Tensor ones_big = full({1 << 25}, 1.0);
  EXPECT_EQ(sum(ones_big).item<double>(), static_cast<double>(1 << 25));
  expect_throws<ShapeError>([] { amax(empty({0})); }, {"amax", "zero elements", "[0]"});
  expect_throws<ShapeError>(
      [] {
        sum(empty({2, 3}), {0, -2});
      },
      {"sum", "more than once", "[0, -2]", "[2, 3]"});
  expect_throws<ShapeError>([] { sum(empty({2, 3}), {2}); }, {"sum", "dim 2", "[2, 3]"});
  expect_throws<Unsupported>([] { mean(full({2}, 1, DType::I64)); }, {"mean", "i64", "[2]"});
}

TEST(Softmax, MatchesReferenceAndIsStable) {
  Gen gen(6);
  for (DType d : kArithmeticDTypes) {
    for (bool log_form : {false, true}) {
      for (int trial = 0; trial < 8; ++trial) {
        const Shape shape = gen.shape(0, 4);
        const auto layout = gen.layout();
        const Tensor t = gen.tensor(shape, d, layout);
        const int64_t ndim = static_cast<int64_t>(shape.size());
        const int64_t dim =
            gen.uniform(-std::max<int64_t>(ndim, 1), std::max<int64_t>(ndim, 1) - 1);
        const std::string context =
            fmt::format("{}({} {} {}, dim {})", log_form ? "log_softmax" : "softmax", d,
                        shape_str(shape), layout_name(layout), dim);
        if (d == DType::Bool) {  // refused: a softmax of truth values is a mistake
          expect_throws<Unsupported>([&] { log_form ? log_softmax(t, dim) : softmax(t, dim); },
                                     {log_form ? "log_softmax" : "softmax", "bool"});
          continue;
        }
        const Tensor out = log_form ? log_softmax(t, dim) : softmax(t, dim);
        const DType want_dtype = is_floating(d) ? d : DType::F32;
        ASSERT_EQ(out.dtype(), want_dtype) << context;
        ASSERT_EQ(out.shape(), shape) << context;
        const std::size_t ud = ndim == 0 ? 0 : static_cast<std::size_t>(dim < 0 ? dim + ndim : dim);
        std::vector<double> want;
        for (int64_t i = 0; i < t.numel(); ++i) {
          const auto index = unravel(i, shape);
          double total = 0;
          auto other = index;
          const int64_t len = ndim == 0 ? 1 : shape[ud];
          for (int64_t j = 0; j < len; ++j) {
            if (ndim > 0) other[ud] = j;
            total += std::exp(element(t, other));
          }
          const double x = element(t, index);
          want.push_back(
              round_to(want_dtype, log_form ? x - std::log(total) : std::exp(x) / total));
        }
        const double rtol = testing::transcendental_rtol(want_dtype);
        expect_values(out, want, rtol, rtol, context);
      }
    }
  }
  // Stable: huge logits do not overflow; a row of -inf gives NaN as in torch.
  const Tensor big = from_vector<float>({1000, 1000, -INFINITY});
  EXPECT_EQ(values(softmax(big, 0)), (std::vector<double>{0.5, 0.5, 0}));
  EXPECT_EQ(values(log_softmax(big, 0))[2], -INFINITY);
  EXPECT_TRUE(std::isnan(values(softmax(full({2}, -INFINITY), 0))[0]));
  expect_throws<ShapeError>([] { softmax(empty({2, 3}), 2); }, {"softmax", "dim 2", "[2, 3]"});
}

// Note [F32 softmax]: the contiguous F32 rows' kernel (float exp in lanes, eight partial sums)
// against double at every length through two vector widths and a tail, and its special values.
TEST(Softmax, F32RowsMatchDoubleAtEveryLength) {
  for (int64_t n = 1; n <= 70; ++n) {
    const Tensor t = randn({3, n}, static_cast<uint64_t>(100 + n), DType::F32) * 12.0;
    const std::vector<double> x = values(t);
    for (bool log_form : {false, true}) {
      const std::vector<double> got = values(log_form ? log_softmax(t, 1) : softmax(t, 1));
      for (int64_t r = 0; r < 3; ++r) {
        double max = -INFINITY, total = 0;
        for (int64_t i = 0; i < n; ++i) max = std::max(max, x[static_cast<size_t>(r * n + i)]);
        for (int64_t i = 0; i < n; ++i) total += std::exp(x[static_cast<size_t>(r * n + i)] - max);
        for (int64_t i = 0; i < n; ++i) {
          const double s = x[static_cast<size_t>(r * n + i)] - max;
          const double want = log_form ? s - std::log(total) : std::exp(s) / total;
          const double g = got[static_cast<size_t>(r * n + i)];
          // A few float ulps of the value (log_softmax: of its magnitude, and at least of 1);
          // softmax also carries the rounding of x - max in float, |s| ulps of 1 relative.
          const double tol =
              log_form ? 4e-7 * std::max(std::abs(want), 1.0) : want * (4e-7 + 6e-8 * -s) + 1e-44;
          ASSERT_NEAR(g, want, tol)
              << (log_form ? "log_softmax" : "softmax") << " n " << n << " row " << r << " i " << i;
        }
      }
    }
  }
  // A strided row gives the bits of the same row laid out contiguously.
  const Tensor m = randn({37, 6}, 7, DType::F32) * 5.0;
  for (bool log_form : {false, true}) {
    const Tensor strided = log_form ? log_softmax(m, 0) : softmax(m, 0);
    const Tensor rows = m.transpose(0, 1).contiguous();
    const Tensor contiguous = (log_form ? log_softmax(rows, 1) : softmax(rows, 1)).transpose(0, 1);
    EXPECT_EQ(values(strided), values(contiguous)) << log_form;
  }
  // -inf entries give exactly 0 (log: -inf); a NaN or +inf anywhere, or a row of -inf, give NaN.
  std::vector<float> row(19, 1.0f);
  row[3] = -INFINITY;
  row[17] = -INFINITY;
  const std::vector<double> p = values(softmax(from_vector<float>(row), 0));
  EXPECT_EQ(p[3], 0.0);
  EXPECT_EQ(p[17], 0.0);
  EXPECT_NEAR(p[0], 1.0 / 17.0, 1e-7);
  EXPECT_EQ(values(log_softmax(from_vector<float>(row), 0))[3], -INFINITY);
  for (float bad : {NAN, INFINITY}) {
    std::vector<float> b(19, 1.0f);
    b[11] = bad;
    for (double v : values(softmax(from_vector<float>(b), 0))) EXPECT_TRUE(std::isnan(v)) << bad;
  }
  for (double v : values(softmax(full({19}, -INFINITY), 0))) EXPECT_TRUE(std::isnan(v));
}

// expf_nonpositive (element_ops.h) against exp in double: within 1.22 ulp of the float result at
// 2^20 points of [-104, 0], subnormal results included, and its special values.
TEST(Softmax, FloatExpOfNonpositiveValuesIsWithinItsUlpBound) {
  double worst = 0;
  for (int i = 0; i <= (1 << 20); ++i) {
    const float z = -104.0f * static_cast<float>(i) / static_cast<float>(1 << 20);
    const double want = std::exp(static_cast<double>(z));
    const float wf = static_cast<float>(want);
    const double ulp =
        wf == 0.0f ? std::ldexp(1.0, -149) : static_cast<double>(std::nextafter(wf, INFINITY)) - wf;
    worst = std::max(worst, std::abs(element::expf_nonpositive(z) - want) / ulp);
  }
  EXPECT_LE(worst, 1.22);
  EXPECT_EQ(element::expf_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(element::expf_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(element::expf_nonpositive(-INFINITY), 0.0f);
  EXPECT_EQ(element::expf_nonpositive(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(element::expf_nonpositive(NAN)));
}

TEST(Joining, CatMatchesReference) {
  Gen gen(8);
  for (int trial = 0; trial < 150; ++trial) {
    const Shape base = gen.shape(1, 4);
    const int64_t ndim = static_cast<int64_t>(base.size());
    const int64_t dim = gen.uniform(-ndim, ndim - 1);
    const std::size_t ud = static_cast<std::size_t>(dim < 0 ? dim + ndim : dim);
    std::vector<Tensor> parts;
    DType want_dtype = kAllDTypes[gen.uniform(0, 6)];
    std::string context = fmt::format("cat dim {}:", dim);
    for (int64_t k = gen.uniform(1, 3); k > 0; --k) {
      Shape s = base;
      s[ud] = gen.uniform(0, 3);
      const DType d = gen.uniform(0, 2) ? want_dtype : kAllDTypes[gen.uniform(0, 6)];
      const auto layout = gen.layout();
      parts.push_back(gen.tensor(s, d, layout));
      context += fmt::format(" {} {} ({})", d, shape_str(s), layout_name(layout));
    }
    want_dtype = parts[0].dtype();
    for (const Tensor& p : parts) want_dtype = promote_types(want_dtype, p.dtype());
    const Tensor out = cat(parts, dim);
    ASSERT_EQ(out.dtype(), want_dtype) << context;
    std::vector<double> want;
    Shape out_shape = base;
    out_shape[ud] = 0;
    for (const Tensor& p : parts) out_shape[ud] += p.size(dim);
    ASSERT_EQ(out.shape(), out_shape) << context;
    for (int64_t i = 0; i < out.numel(); ++i) {
      auto index = unravel(i, out_shape);
      std::size_t part = 0;
      while (index[ud] >= parts[part].size(dim)) index[ud] -= parts[part++].size(dim);
      want.push_back(round_to(want_dtype, element(parts[part], index)));
    }
    expect_values(out, want, 0, 0, context);
  }
}

TEST(Joining, StackPadUnpad) {
  Gen gen(9);
  for (int trial = 0; trial < 100; ++trial) {
    const Shape shape = gen.shape(0, 3);
    const int64_t ndim = static_cast<int64_t>(shape.size());
    const DType d = kAllDTypes[gen.uniform(0, 6)];
    std::vector<Tensor> parts;
    for (int64_t k = gen.uniform(1, 3); k > 0; --k)
      parts.push_back(gen.tensor(shape, d, gen.layout()));
    const int64_t sdim = gen.uniform(-(ndim + 1), ndim);
    const Tensor stacked = stack(parts, sdim);
    const std::size_t us = static_cast<std::size_t>(sdim < 0 ? sdim + ndim + 1 : sdim);
    for (int64_t i = 0; i < stacked.numel(); ++i) {
      auto index = unravel(i, stacked.shape());
      const int64_t which = index[us];
      index.erase(index.begin() + static_cast<std::ptrdiff_t>(us));
      ASSERT_EQ(element(stacked, unravel(i, stacked.shape())),
                element(parts[static_cast<std::size_t>(which)], index))
          << "stack dim " << sdim << " of " << shape_str(shape);
    }
    if (ndim == 0) continue;
    const int64_t pdim = gen.uniform(-ndim, ndim - 1);
    const std::size_t up = static_cast<std::size_t>(pdim < 0 ? pdim + ndim : pdim);
    const int64_t before = gen.uniform(0, 2);
    const int64_t after = gen.uniform(0, 2);
    const Tensor padded = pad(parts[0], pdim, before, after, 1.5);
    Shape want_shape = shape;
    want_shape[up] += before + after;
    ASSERT_EQ(padded.shape(), want_shape);
    std::vector<double> want;
    for (int64_t i = 0; i < padded.numel(); ++i) {
      auto index = unravel(i, want_shape);
      if (index[up] < before || index[up] >= before + shape[up]) {
        want.push_back(round_to(d, 1.5));
      } else {
        index[up] -= before;
        want.push_back(element(parts[0], index));
      }
    }
    expect_values(padded, want, 0, 0,
                  fmt::format("pad {} dim {} by {}/{}", shape_str(shape), pdim, before, after));
    const Tensor back = unpad(padded, pdim, before, after);
    EXPECT_EQ(back.storage(), padded.storage());
    EXPECT_EQ(values(back), values(parts[0]));
  }
}

TEST(Joining, Errors) {
  const Tensor a = empty({2, 3});
  expect_throws<ShapeError>([] { cat({}, 0); }, {"cat", "at least one"});
  expect_throws<ShapeError>(
      [&] {
        cat({a, empty({2, 4})}, 0);
      },
      {"cat", "tensor 1", "[2, 4]", "[2, 3]", "dim 0"});
  expect_throws<ShapeError>([&] { cat({a, empty({2})}, 0); }, {"cat", "tensor 1", "[2]"});
  expect_throws<ShapeError>([&] { cat({a}, 2); }, {"cat", "dim 2"});
  expect_throws<ShapeError>([] { cat({full({}, 1)}, 0); }, {"cat", "0-d"});
  expect_throws<ShapeError>(
      [&] {
        stack({a, empty({3, 2})}, 0);
      },
      {"stack", "tensor 1", "[3, 2]", "[2, 3]"});
  expect_throws<ShapeError>([&] { stack({a}, 3); }, {"stack", "dim 3"});
  expect_throws<ShapeError>([] { stack({}, 0); }, {"stack"});
  expect_throws<ShapeError>([&] { pad(a, 1, -1, 0); }, {"pad", "-1", "[2, 3]"});
  expect_throws<ShapeError>([&] { pad(a, 2, 1, 1); }, {"pad", "dim 2"});
  expect_throws<ShapeError>([&] { unpad(a, 1, 2, 2); }, {"unpad", "2 + 2", "size 3", "[2, 3]"});
  expect_throws<ShapeError>([&] { unpad(a, 0, -1, 0); }, {"unpad"});
}

TEST(Comparisons, EqualAllcloseMaxAbsDiffHasNonfinite) {
  const Tensor a = from_vector<float>({1, 2, 3});
  EXPECT_TRUE(equal(a, from_vector<int64_t>({1, 2, 3})));
  EXPECT_TRUE(equal(a, a.to(DType::BF16)));
  EXPECT_FALSE(equal(a, from_vector<float>({1, 2, 4})));
  EXPECT_FALSE(equal(a, from_vector<float>({1, 2, 3}, {1, 3})));
  EXPECT_FALSE(equal(from_vector<float>({NAN}), from_vector<float>({NAN})));
  EXPECT_TRUE(equal(empty({0, 2}), empty({0, 2}, DType::I32)));
  EXPECT_TRUE(equal(full({2, 3}, 1).transpose(0, 1), full({1}, 1).expand({3, 2})));
  // Integers compare exactly, beyond double's 53 bits.
  EXPECT_FALSE(
      equal(from_vector<int64_t>({9007199254740993}), from_vector<int64_t>({9007199254740992})));
  const Tensor b = from_vector<float>({1, 2, 3.0001f});
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(a, b, 1e-4, 0));
  EXPECT_TRUE(allclose(a, b, 0, 2e-4));
  EXPECT_TRUE(allclose(from_vector<float>({INFINITY}), from_vector<float>({INFINITY})));
  EXPECT_FALSE(allclose(from_vector<float>({INFINITY}), from_vector<float>({-INFINITY}), 1, 1));
  EXPECT_FALSE(allclose(from_vector<float>({NAN}), from_vector<float>({NAN}), 1, 1));
  EXPECT_FALSE(allclose(a, empty({2})));
  EXPECT_NEAR(max_abs_diff(a, b), 1e-4, 1e-6);
  EXPECT_EQ(max_abs_diff(empty({0}), empty({0})), 0);
  EXPECT_EQ(max_abs_diff(from_vector<float>({INFINITY, 1}), from_vector<float>({INFINITY, 2})), 1);
  EXPECT_TRUE(std::isnan(max_abs_diff(from_vector<float>({NAN, 1}), from_vector<float>({0, 1}))));
  expect_throws<ShapeError>([&] { max_abs_diff(a, empty({2})); }, {"max_abs_diff", "[3]", "[2]"});
  EXPECT_FALSE(has_nonfinite(a));
  EXPECT_TRUE(has_nonfinite(from_vector<float>({1, INFINITY})));
  EXPECT_TRUE(has_nonfinite(full({2, 2}, NAN, DType::BF16).transpose(0, 1)));
  EXPECT_FALSE(has_nonfinite(full({3}, 7, DType::I32)));
  EXPECT_FALSE(has_nonfinite(empty({0})));
}

TEST(Factories, ValuesAndErrors) {
  for (DType d : kAllDTypes) {
    EXPECT_EQ(values(zeros({2, 2}, d)), (std::vector<double>(4, 0.0))) << d;
    EXPECT_EQ(values(ones({3}, d)), (std::vector<double>(3, 1.0))) << d;
    EXPECT_EQ(values(full({2}, -2, d)), (std::vector<double>(2, round_to(d, -2)))) << d;
    EXPECT_EQ(scalar_tensor(3, d).dim(), 0);
  }
  EXPECT_EQ(values(arange(4, DType::I64)), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(values(arange(3, DType::F16)), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}).shape(), (Shape{2, 3}));
  EXPECT_EQ(values(from_vector<bool>({true, false})), (std::vector<double>{1, 0}));
  EXPECT_EQ(values(from_vector<Half>({Half(1.5f)})), (std::vector<double>{1.5}));
  EXPECT_EQ(from_vector<double>({}).shape(), (Shape{0}));
  expect_throws<ShapeError>([] { zeros({2, -3}); }, {"zeros", "-3", "[2, -3]"});
  expect_throws<ShapeError>([] { arange(-1); }, {"arange", "-1"});
  expect_throws<Unsupported>([] { arange(3, DType::Bool); }, {"arange", "bool"});
  expect_throws<ShapeError>(
      [] {
        from_vector<float>({1, 2, 3}, {2, 2});
      },
      {"from_vector", "3 values", "[2, 2]"});
  expect_throws<ShapeError>([] { add(empty({2, 3}), empty({3, 2})); }, {"add", "[2, 3]", "[3, 2]"});
  expect_throws<Unsupported>([] { sub(ones({2}, DType::Bool), ones({1}, DType::Bool)); },
                             {"sub", "bool", "[2]", "[1]"});
}

}  // namespace
}  // namespace spmd
