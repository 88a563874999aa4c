// Tests for tensor/cuda/element.h on the host: the conversions, operators and strided indexing
// the CUDA kernels run must equal the CPU kernels' bit for bit. They need no GPU: element.h is
// the same code on both sides (its transcendentals excepted, whose device versions may differ
// in the last bit; here both sides call glibc).
#include <spmd/tensor/cuda/element.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <spmd/ops/ops.h>
#include <spmd/tensor/dtype.h>

namespace spmd {
namespace {

using namespace cuda_math;

// The storage type the kernels use for each spmd element type.
template <class T>
struct KernelType {
  using type = T;
};
template <>
struct KernelType<BFloat16> {
  using type = Bf16;
};
template <>
struct KernelType<Half> {
  using type = F16;
};
template <class T>
using kernel_t = typename KernelType<T>::type;

template <class T>
kernel_t<T> to_kernel(T v) {
  kernel_t<T> out;
  static_assert(sizeof out == sizeof v);
  std::memcpy(&out, &v, sizeof v);
  return out;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Values that stress conversions: signed zeros, infinities, NaN, the edges of every integer and
// 16-bit float range, halfway cases, subnormals.
std::vector<double> edge_values() {
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           -0.5,
                           1.5,
                           2.5,
                           -2.5,
                           1.0 / 3.0,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN(),
                           65504.0,
                           65519.99,
                           65520.0,
                           -65520.0,
                           6.103515625e-05,
                           5.960464477539063e-08,
                           2.98e-08,
                           1e-45,
                           1e-300,
                           3.4028234663852886e38,
                           3.5e38,
                           1e300,
                           -1e300,
                           2147483647.0,
                           2147483648.0,
                           2147483647.5,
                           -2147483648.0,
                           -2147483649.0,
                           9.223372036854775807e18,
                           -9.223372036854775808e18,
                           1.8446744073709552e19,
                           16777217.0,
                           9007199254740993.0,
                           255.5,
                           -7.75};
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1e3);
  for (int i = 0; i < 200; ++i) v.push_back(normal(rng));
  return v;
}

TEST(CudaElement, SixteenBitFloatsWidenExactlyForEveryBitPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float cpu_bf16 = static_cast<float>(BFloat16::from_bits(bits));
    const float cpu_f16 = Half::to_float(bits);
    const float gpu_bf16 = bf16_to_float(bits);
    const float gpu_f16 = f16_to_float(bits);
    ASSERT_TRUE(same_bits(cpu_bf16, gpu_bf16)) << "bf16 bits " << b;
    ASSERT_TRUE(same_bits(cpu_f16, gpu_f16)) << "f16 bits " << b;
  }
}

TEST(CudaElement, FloatsNarrowToSixteenBitsLikeTheCpu) {
  // Every 16-bit prefix with low halves at and around the rounding points of bf16 (bit 16) and
  // f16 (bit 13), plus random floats.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x17ff, 0x1800, 0x2fff,
                           0x3000, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xefff, 0xffff};
  auto check = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    ASSERT_EQ(float_to_bf16(f), BFloat16::from_float(f)) << "float bits " << std::hex << u;
    ASSERT_EQ(float_to_f16(f), Half::from_float(f)) << "float bits " << std::hex << u;
  };
  for (uint32_t high = 0; high < 65536; ++high) {
    for (uint32_t low : lows) check((high << 16) | low);
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1'000'000; ++i) check(rng());
}

template <class To, class From>
void check_conversion(double value) {
  const From from = convert_element<From>(value);
  const To cpu = convert_element<To>(from);
  const kernel_t<To> gpu = convert<kernel_t<To>>(to_kernel(from));
  if constexpr (std::is_same_v<To, bool>) {
    EXPECT_EQ(cpu, gpu) << dtype_of<From>() << " -> bool of " << value;
  } else {
    EXPECT_TRUE(same_bits(to_kernel(cpu), gpu))
        << dtype_of<From>() << " -> " << dtype_of<To>() << " of " << value;
  }
}

TEST(CudaElement, EveryConversionMatchesConvertElement) {
  for (double value : edge_values()) {
    for (DType from : kArithmeticDTypes) {
      for (DType to : kArithmeticDTypes) {
        dispatch_arithmetic(from, "cuda element test", [&]<class F>() {
          dispatch_arithmetic(to, "cuda element test",
                              [&]<class T>() { check_conversion<T, F>(value); });
        });
      }
    }
  }
}

// Random operands of dtype T (edge values mixed in) as a 1-D CPU tensor.
template <class T>
Tensor operands(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  const std::vector<double> edges = edge_values();
  std::vector<T> values;
  for (int64_t i = 0; i < n; ++i) {
    const double v = i < static_cast<int64_t>(edges.size())
                         ? edges[static_cast<size_t>(i)]
                         : std::uniform_real_distribution<double>(-50, 50)(rng);
    values.push_back(convert_element<T>(v));
  }
  std::shuffle(values.begin(), values.end(), rng);
  return from_vector(values);
}

template <class T, class Op>
void expect_binary(const Tensor& cpu, const Tensor& a, const Tensor& b, Op op, const char* name) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const T* pc = cpu.data<T>();
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const kernel_t<T> gpu = store<kernel_t<T>>(op(load(to_kernel(pa[i])), load(to_kernel(pb[i]))));
    ASSERT_TRUE(same_bits(to_kernel(pc[i]), gpu)) << name << " on " << dtype_of<T>() << " at " << i;
  }
}

TEST(CudaElement, BinaryOperatorsMatchTheCpuKernels) {
  for (DType dtype : kArithmeticDTypes) {
    dispatch_arithmetic(dtype, "cuda element test", [&]<class T>() {
      const Tensor a = operands<T>(1, 600);
      const Tensor b = operands<T>(2, 600);
      expect_binary<T>(maximum(a, b), a, b, element::Maximum{}, "maximum");
      expect_binary<T>(minimum(a, b), a, b, element::Minimum{}, "minimum");
      if constexpr (!std::is_same_v<T, bool>) {
        expect_binary<T>(add(a, b), a, b, element::Add{}, "add");
        expect_binary<T>(sub(a, b), a, b, element::Sub{}, "sub");
        expect_binary<T>(mul(a, b), a, b, element::Mul{}, "mul");
        if constexpr (!std::is_integral_v<T>)
          expect_binary<T>(div(a, b), a, b, element::Div{}, "div");
      }
    });
  }
}

template <class T, class Op>
void expect_unary(const Tensor& cpu, const Tensor& a, Op op, const char* name) {
  const T* pa = a.data<T>();
  const T* pc = cpu.data<T>();
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const kernel_t<T> gpu = store<kernel_t<T>>(op(load(to_kernel(pa[i]))));
    ASSERT_TRUE(same_bits(to_kernel(pc[i]), gpu)) << name << " on " << dtype_of<T>() << " at " << i;
  }
}

TEST(CudaElement, UnaryOperatorsMatchTheCpuKernels) {
  for (DType dtype : kArithmeticDTypes) {
    dispatch_arithmetic(dtype, "cuda element test", [&]<class T>() {
      if constexpr (!std::is_same_v<T, bool>) {
        const Tensor a = operands<T>(3, 600);
        expect_unary<T>(neg(a), a, element::Neg{}, "neg");
        expect_unary<T>(abs(a), a, element::Abs{}, "abs");
        expect_unary<T>(relu(a), a, element::Relu{}, "relu");
        if constexpr (!std::is_integral_v<T>) {
          expect_unary<T>(exp(a), a, element::Exp{}, "exp");
          expect_unary<T>(log(a), a, element::Log{}, "log");
          expect_unary<T>(sqrt(a), a, element::Sqrt{}, "sqrt");
          expect_unary<T>(tanh(a), a, element::Tanh{}, "tanh");
          expect_unary<T>(gelu(a), a, element::Gelu{}, "gelu");
          expect_unary<T>(log1p(a), a, element::Log1p{}, "log1p");
          expect_unary<T>(expm1(a), a, element::Expm1{}, "expm1");
          expect_unary<T>(sin(a), a, element::Sin{}, "sin");
          expect_unary<T>(cos(a), a, element::Cos{}, "cos");
          expect_unary<T>(reciprocal(a), a, element::Reciprocal{}, "reciprocal");
        }
      }
    });
  }
}

TEST(CudaElement, ExtremumKeepsNanAndTheFirstOfEquals) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(extremum_better(true, 2.0f, 1.0f));
  EXPECT_FALSE(extremum_better(true, 1.0f, 2.0f));
  EXPECT_FALSE(extremum_better(true, 1.0f, 1.0f));
  EXPECT_TRUE(extremum_better(false, 1.0f, 2.0f));
  EXPECT_TRUE(extremum_better(true, nan, 1.0f));
  EXPECT_FALSE(extremum_better(true, 5.0f, nan));  // NaN, once in, stays
  EXPECT_FALSE(extremum_better(false, -5.0f, nan));
}

// Every offset the Indexer computes equals the plain sum of index times stride.
void check_indexer(const Shape& shape, const std::vector<Strides>& strides) {
  ASSERT_EQ(strides.size(), 2u);
  const Indexer<2> ix = make_indexer<2>(shape, {&strides[0], &strides[1]});
  const int64_t n = shape_numel(shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t expected[2] = {0, 0};
    int64_t rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t index = rest % shape[d];
      rest /= shape[d];
      for (int k = 0; k < 2; ++k) expected[k] += index * strides[static_cast<size_t>(k)][d];
    }
    int64_t got[2];
    ix.offsets(i, got);
    ASSERT_EQ(got[0], expected[0]) << "shape " << shape_str(shape) << " position " << i;
    ASSERT_EQ(got[1], expected[1]) << "shape " << shape_str(shape) << " position " << i;
  }
}

TEST(CudaElement, IndexerWalksViewsRowMajor) {
  // Contiguous, transposed, narrowed, broadcast (stride 0) and size-1 dims, against a contiguous
  // destination: the views Tensor makes.
  check_indexer({2, 3, 4}, {{12, 4, 1}, {12, 4, 1}});
  check_indexer({3, 4}, {{4, 1}, {1, 3}});
  check_indexer({2, 1, 5}, {{5, 5, 1}, {0, 0, 1}});
  check_indexer({4, 3, 2}, {{6, 2, 1}, {1, 8, 4}});
  check_indexer({2, 3, 4}, {{12, 4, 1}, {40, 8, 2}});
  check_indexer({}, {{}, {}});
  check_indexer({1, 1}, {{1, 1}, {7, 3}});
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const Tensor base = empty({3, 4, 5, 2});
    std::vector<int64_t> perm = {0, 1, 2, 3};
    std::shuffle(perm.begin(), perm.end(), rng);
    Tensor view = base.permute(perm);
    view = view.narrow(0, 0, std::max<int64_t>(1, view.size(0) - static_cast<int64_t>(rng() % 2)));
    if (rng() % 3 == 0) view = view.select(1, 0).unsqueeze(1).expand(view.shape());
    check_indexer(view.shape(), {contiguous_strides(view.shape()), view.strides()});
  }
  // Merging keeps the count under kMaxDims for contiguous operands of any rank.
  const Shape wide(12, 2);
  const Strides wide_strides = contiguous_strides(wide);
  const Indexer<1> merged = make_indexer<1>(wide, {&wide_strides});
  EXPECT_EQ(merged.ndim, 1);
}

TEST(CudaElement, IndexerRejectsWalksTooWideToMerge) {
  // Twelve dims that no stride pattern lets merge: more than kMaxDims.
  const Shape shape(12, 2);
  Strides strides(12);
  for (size_t d = 0; d < 12; ++d) strides[d] = int64_t{1} << (2 * (11 - d));
  EXPECT_THROW(make_indexer<1>(shape, {&strides}), std::length_error);
}

}  // namespace
}  // namespace spmd
