// spmd/tensor/element_ops.h: the math of every elementwise op, once, for the CPU and CUDA kernels.
//
// Each elementwise op is one functor here: its name, the dtypes it computes in (Domain), its
// per-element operator, a template over the compute type C (float, double, int32_t, int64_t,
// bool; BF16/F16 compute in float), and its derivatives for backward (floating C only): a unary
// op's df(x, y) = dy/dx at input x with output y, a binary op's da(g, a, b) and db(g, a, b), the
// gradient g of the output carried to a and to b. The CPU kernels (tensor/kernels/elementwise.cpp)
// and the CUDA kernels (tensor/cuda/elementwise.cu) both walk their operands and call these
// operators, so the two devices run the same code for every op. The lists at the end are the order
// of the ops: a kernel is asked for an op by its index in its list (element_op_index).
//
// Adding an elementwise op: a functor below, its name in UnaryElementOps or BinaryElementOps, and
// its op-table entry in ops/ops.h (docs/design.md, "Adding an op").
//
// This header depends on nothing else in spmdsim but tensor/host_device.h, so nvcc compiles it
// alone; everything in it is callable on the host and the device (SPMD_HD). Transcendentals call
// the C math functions (expf, erff, ...): glibc on the host, CUDA's device library on the GPU
// (whose last bit may differ).
#pragma once

#include <math.h>

#include <cstdint>
#include <string_view>
#include <type_traits>

#include <spmd/tensor/host_device.h>

namespace spmd::element {

// Which dtypes an op computes in (Note [Type promotion] gives the input dtype first):
//   Floating  a floating dtype; integer and Bool inputs compute (and give) F32;
//   Numeric   any dtype but Bool (integer arithmetic wraps around);
//   Any       every dtype, Bool included.
enum class Domain { Floating, Numeric, Any };

// Whether functor F's result is Bool (a comparison) rather than the dtype it computes in. A
// functor says so with `static constexpr bool predicate = true`.
template <class F, class = void>
struct IsPredicate {
  static constexpr bool value = false;
};
template <class F>
struct IsPredicate<F, std::void_t<decltype(F::predicate)>> {
  static constexpr bool value = F::predicate;
};
template <class F>
inline constexpr bool is_predicate = IsPredicate<F>::value;

// How a binary op's gradient reaches operand a (wrt 0) or b (wrt 1): through the derivative
// kernel (da / db), or, where the derivative is the gradient itself or its negation (add, sub),
// without a kernel. A functor says so with `static constexpr GradPass pass_a` / `pass_b`.
enum class GradPass { Kernel, Identity, Negate };
template <class F, int wrt, class = void>
struct GradPassOf {
  static constexpr GradPass value = GradPass::Kernel;
};
template <class F>
struct GradPassOf<F, 0, std::void_t<decltype(F::pass_a)>> {
  static constexpr GradPass value = F::pass_a;
};
template <class F>
struct GradPassOf<F, 1, std::void_t<decltype(F::pass_b)>> {
  static constexpr GradPass value = F::pass_b;
};
template <class F, int wrt>
inline constexpr GradPass grad_pass = GradPassOf<F, wrt>::value;

// Whether functor F computes in compute type C.
template <class F, class C>
inline constexpr bool accepts = F::domain == Domain::Any ||
                                (F::domain == Domain::Numeric && !std::is_same_v<C, bool>) ||
                                (F::domain == Domain::Floating && std::is_floating_point_v<C>);

// ---- math on float and double --------------------------------------------------------------

SPMD_HD float math_exp(float x) {
  return ::expf(x);
}
SPMD_HD double math_exp(double x) {
  return ::exp(x);
}
SPMD_HD float math_log(float x) {
  return ::logf(x);
}
SPMD_HD double math_log(double x) {
  return ::log(x);
}
SPMD_HD float math_sqrt(float x) {
  return ::sqrtf(x);
}
SPMD_HD double math_sqrt(double x) {
  return ::sqrt(x);
}
// exp(z) for z in [-700, 0] in double, with no library call, so that a loop of it vectorizes:
// z = k ln2 + r with |r| <= ln2 / 2 (k by the 1.5 * 2^52 rounding trick, ln2 in two parts so
// k ln2 is exact), exp(r) by its Taylor series to r^13 (truncation below 5e-18), times 2^k built
// in the exponent bits (k >= -1010: a normal double). Within about 1 ulp of exp (measured: 1.01
// ulp over [-700, 0]). Host only; its vector loops are compiled without FMA contraction (Note
// [Vector math clones]).
#if !defined(__CUDA_ARCH__)
inline double exp_nonpositive(double z) {
  constexpr double kShift = 0x1.8p52;
  const double t = z * 1.4426950408889634074 + kShift;
  const double k = t - kShift;
  const double r = (z - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
  // Horner on 1/n! (n = 13 down to 0).
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // t's low bits hold k (two's complement); 2^k's exponent field is k + 1023.
  const uint64_t scale = (__builtin_bit_cast(uint64_t, t) + 1023) << 52;
  return p * __builtin_bit_cast(double, scale);
}
#endif

// exp(z) in float for z <= 0 (softmax's x - max), with no library call, so that a loop of it
// vectorizes in float lanes: z clamped to -104 (exp is below half the least subnormal there),
// z = k ln2 + r with |r| <= ln2 / 2 (k by the 1.5 * 2^23 rounding trick, ln2 in two parts, the
// first of 13 bits so k times it is exact), exp(r) by its Taylor series to r^7 (truncation below
// 3e-9), times 2^k as two powers of two built in the exponent bits (each at least 2^-52, so
// subnormal results round once). Within 1.22 ulp of exp (measured over all 1.1e9 floats in [-104,
// 0]; glibc's expf is within 0.5); NaN stays NaN. Host only; its vector loop is compiled without
// FMA contraction (Note [Vector math clones]).
#if !defined(__CUDA_ARCH__)
inline float expf_nonpositive(float z) {
  constexpr float kShift = 0x1.8p23f;
  const float c = z < -104.0f ? -104.0f : z;
  const float t = c * 1.44269504f + kShift;
  const float k = t - kShift;
  const float r = (c - k * 0x1.62ep-1f) - k * 0x1.0bfbe8p-15f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // t's low 23 bits hold 2^22 + k (k in [-150, 0]); 2^k = 2^(k - k/2) * 2^(k/2).
  const int32_t ki = static_cast<int32_t>(__builtin_bit_cast(uint32_t, t) & 0x7fffffu) - (1 << 22);
  const int32_t half = ki / 2;
  const float s1 = __builtin_bit_cast(float, static_cast<uint32_t>(ki - half + 127) << 23);
  const float s2 = __builtin_bit_cast(float, static_cast<uint32_t>(half + 127) << 23);
  const float e = p * s1 * s2;
  return z != z ? z : e;
}
#endif

// On the host, float tanh goes through double: exp(-2|x|) (exp_nonpositive, |x| clamped to 20
// where tanh is 1 in float) and one division, a polynomial below 2^-13 where 1 - exp(-2|x|) would
// cancel. Rounded once to float it is correctly rounded on all but 11 of the 1.1e9 floats in
// [0, 20] and their negatives (checked exhaustively; the 11 lie in [2^-12, 2^-9], where the
// subtraction cancels, and glibc's exp gives the same 11); glibc's tanhf is off by up to 1.7 ulp.
// It has no branch or call, so the kernels' loops of it (tanh, GELU's forward and backward)
// vectorize (Note [Vector math clones] in kernels/elementwise.cpp).
SPMD_HD float math_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return ::tanhf(x);
#else
  const double d = x;
  const double a = ::fabs(d);
  const double d2 = d * d;
  const double small = d * (1.0 - d2 * (1.0 / 3.0) + d2 * d2 * (2.0 / 15.0));
  const double e = exp_nonpositive(-2.0 * (a < 20.0 ? a : 20.0));
  const double large = ::copysign((1.0 - e) / (1.0 + e), d);
  const double y = a < 0x1p-13 ? small : large;
  return static_cast<float>(d != d ? d : y);
#endif
}
SPMD_HD double math_tanh(double x) {
  return ::tanh(x);
}
SPMD_HD float math_erf(float x) {
  return ::erff(x);
}
SPMD_HD double math_erf(double x) {
  return ::erf(x);
}
SPMD_HD float math_log1p(float x) {
  return ::log1pf(x);
}
SPMD_HD double math_log1p(double x) {
  return ::log1p(x);
}
SPMD_HD float math_expm1(float x) {
  return ::expm1f(x);
}
SPMD_HD double math_expm1(double x) {
  return ::expm1(x);
}
SPMD_HD float math_sin(float x) {
  return ::sinf(x);
}
SPMD_HD double math_sin(double x) {
  return ::sin(x);
}
SPMD_HD float math_cos(float x) {
  return ::cosf(x);
}
SPMD_HD double math_cos(double x) {
  return ::cos(x);
}
SPMD_HD float math_pow(float x, float y) {
  return ::powf(x, y);
}
SPMD_HD double math_pow(double x, double y) {
  return ::pow(x, y);
}

// Integer add/sub/mul/neg wrap around (two's complement) instead of overflowing (undefined).
template <class C>
using wrap_t = std::make_unsigned_t<C>;

// ---- unary ops -----------------------------------------------------------------------------

// What a unary functor's df(x, y) reads: x (the input), y (the output), both or neither. A
// functor without df_reads reads both (Note [Saved values] in ops/autograd.h: the dry run's tape
// keeps only these).
enum class DfReads { None = 0, X = 1, Y = 2, Both = 3 };

struct Neg {
  static constexpr std::string_view name = "neg";
  static constexpr DfReads df_reads = DfReads::None;
  static constexpr Domain domain = Domain::Numeric;
  template <class C>
  SPMD_HD C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(wrap_t<C>{0} - static_cast<wrap_t<C>>(x));
    } else {
      return -x;
    }
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(-1);
  }
};

struct Abs {
  static constexpr std::string_view name = "abs";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Numeric;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return x < C(0) ? Neg{}(x) : x;
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
  }
};

struct Exp {
  static constexpr std::string_view name = "exp";
  static constexpr DfReads df_reads = DfReads::Y;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_exp(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return y;
  }
};

struct Log {
  static constexpr std::string_view name = "log";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_log(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(1) / x;
  }
};

struct Sqrt {
  static constexpr std::string_view name = "sqrt";
  static constexpr DfReads df_reads = DfReads::Y;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_sqrt(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(0.5) / y;
  }
};

struct Tanh {
  static constexpr std::string_view name = "tanh";
  static constexpr DfReads df_reads = DfReads::Y;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_tanh(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(1) - y * y;
  }
};

// 1 / sqrt(x).
struct Rsqrt {
  static constexpr std::string_view name = "rsqrt";
  static constexpr DfReads df_reads = DfReads::Y;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return C(1) / math_sqrt(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(-0.5) * y * y * y;
  }
};

// NaN stays NaN.
struct Relu {
  static constexpr std::string_view name = "relu";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Numeric;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return x > C(0) ? C(1) : C(0);
  }
};

// The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default).
struct Gelu {
  static constexpr std::string_view name = "gelu";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    const C inv_sqrt2 = C(0.70710678118654752440);
    return C(0.5) * x * (C(1) + math_erf(x * inv_sqrt2));
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    const C inv_sqrt2 = C(0.70710678118654752440);
    const C inv_sqrt_2pi = C(0.39894228040143267794);
    return C(0.5) * (C(1) + math_erf(x * inv_sqrt2)) + x * inv_sqrt_2pi * math_exp(C(-0.5) * x * x);
  }
};

// The error function; erf'(x) = 2 / sqrt(pi) exp(-x^2).
struct Erf {
  static constexpr std::string_view name = "erf";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_erf(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    const C two_over_sqrt_pi = C(1.12837916709551257390);
    return two_over_sqrt_pi * math_exp(-x * x);
  }
};

// 1 / (1 + exp(-x)).
struct Sigmoid {
  static constexpr std::string_view name = "sigmoid";
  static constexpr DfReads df_reads = DfReads::Y;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return C(1) / (C(1) + math_exp(-x));
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return y * (C(1) - y);
  }
};

// x * sigmoid(x) (SwiGLU's gate, torch.nn.functional.silu).
struct Silu {
  static constexpr std::string_view name = "silu";
  static constexpr DfReads df_reads = DfReads::X;
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return x / (C(1) + math_exp(-x));
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    const C s = C(1) / (C(1) + math_exp(-x));
    return s * (C(1) + x * (C(1) - s));
  }
};

// GELU's tanh approximation (torch's approximate="tanh", GPT-2's):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
struct GeluTanh {
  static constexpr std::string_view name = "gelu_tanh";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    const C k = C(0.79788456080286535588);
    return C(0.5) * x * (C(1) + math_tanh(k * (x + C(0.044715) * x * x * x)));
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    const C k = C(0.79788456080286535588);
    const C t = math_tanh(k * (x + C(0.044715) * x * x * x));
    return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(0.134145) * x * x);
  }
};

// log(1 + x), accurate for small x.
struct Log1p {
  static constexpr std::string_view name = "log1p";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_log1p(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return C(1) / (C(1) + x);
  }
};

// exp(x) - 1, accurate for small x; its derivative exp(x) is y + 1 (PyTorch's expm1 backward).
struct Expm1 {
  static constexpr std::string_view name = "expm1";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_expm1(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return y + C(1);
  }
};

struct Sin {
  static constexpr std::string_view name = "sin";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_sin(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return math_cos(x);
  }
};

struct Cos {
  static constexpr std::string_view name = "cos";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return math_cos(x);
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return -math_sin(x);
  }
};

// 1 / x (integer and Bool inputs compute in F32); its derivative -1 / x^2 is -y^2.
struct Reciprocal {
  static constexpr std::string_view name = "reciprocal";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C x) const {
    return C(1) / x;
  }
  template <class C>
  SPMD_HD static C df(C x, C y) {
    return -(y * y);
  }
};

// ---- binary ops ----------------------------------------------------------------------------

struct Add {
  static constexpr std::string_view name = "add";
  static constexpr Domain domain = Domain::Numeric;
  static constexpr GradPass pass_a = GradPass::Identity;
  static constexpr GradPass pass_b = GradPass::Identity;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<wrap_t<C>>(a) + static_cast<wrap_t<C>>(b));
    } else {
      return a + b;
    }
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return g;
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return g;
  }
};

struct Sub {
  static constexpr std::string_view name = "sub";
  static constexpr Domain domain = Domain::Numeric;
  static constexpr GradPass pass_a = GradPass::Identity;
  static constexpr GradPass pass_b = GradPass::Negate;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<wrap_t<C>>(a) - static_cast<wrap_t<C>>(b));
    } else {
      return a - b;
    }
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return g;
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return -g;
  }
};

struct Mul {
  static constexpr std::string_view name = "mul";
  static constexpr Domain domain = Domain::Numeric;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<wrap_t<C>>(a) * static_cast<wrap_t<C>>(b));
    } else {
      return a * b;
    }
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return g * b;
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return g * a;
  }
};

// True division: integer and Bool inputs compute in F32.
struct Div {
  static constexpr std::string_view name = "div";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    return a / b;
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return g / b;
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return -g * a / (b * b);
  }
};

// NaN in either operand gives NaN (torch.maximum / torch.minimum).
struct Maximum {
  static constexpr std::string_view name = "maximum";
  static constexpr Domain domain = Domain::Any;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    return (a > b || a != a) ? a : b;
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return (a > b || a != a) ? g : (a == b ? C(0.5) * g : C(0));
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return (b > a || b != b) && a == a ? g : (a == b ? C(0.5) * g : C(0));
  }
};

struct Minimum {
  static constexpr std::string_view name = "minimum";
  static constexpr Domain domain = Domain::Any;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    return (a < b || a != a) ? a : b;
  }
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return (a < b || a != a) ? g : (a == b ? C(0.5) * g : C(0));
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return (b < a || b != b) && a == a ? g : (a == b ? C(0.5) * g : C(0));
  }
};

// a to the power b (integer and Bool inputs compute in F32).
struct Pow {
  static constexpr std::string_view name = "pow";
  static constexpr Domain domain = Domain::Floating;
  template <class C>
  SPMD_HD C operator()(C a, C b) const {
    return math_pow(a, b);
  }
  // An exponent of 0 has a zero derivative everywhere (a^0 is 1), also at a = 0 where
  // b a^(b-1) would be 0 * inf (PyTorch's pow_backward).
  template <class C>
  SPMD_HD static C da(C g, C a, C b) {
    return b == C(0) ? C(0) : g * b * math_pow(a, b - C(1));
  }
  template <class C>
  SPMD_HD static C db(C g, C a, C b) {
    return a == C(0) && b >= C(0) ? C(0) : g * math_pow(a, b) * math_log(a);
  }
};

// ---- comparisons (Bool results; no derivatives) ---------------------------------------------

// a == b, a Bool result (NaN compares unequal to everything).
struct Eq {
  static constexpr std::string_view name = "eq";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a == b;
  }
};

// a != b, a Bool result (NaN compares unequal to everything).
struct Ne {
  static constexpr std::string_view name = "ne";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a != b;
  }
};

// a < b, a Bool result (NaN compares unequal to everything).
struct Lt {
  static constexpr std::string_view name = "lt";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a < b;
  }
};

// a <= b, a Bool result (NaN compares unequal to everything).
struct Le {
  static constexpr std::string_view name = "le";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a <= b;
  }
};

// a > b, a Bool result (NaN compares unequal to everything).
struct Gt {
  static constexpr std::string_view name = "gt";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a > b;
  }
};

// a >= b, a Bool result (NaN compares unequal to everything).
struct Ge {
  static constexpr std::string_view name = "ge";
  static constexpr Domain domain = Domain::Any;
  static constexpr bool predicate = true;
  template <class C>
  SPMD_HD bool operator()(C a, C b) const {
    return a >= b;
  }
};

// ---- the lists -----------------------------------------------------------------------------

template <class... Fs>
struct List {
  static constexpr int size = static_cast<int>(sizeof...(Fs));
};

using UnaryOps = List<Neg, Abs, Exp, Log, Sqrt, Rsqrt, Tanh, Relu, Gelu, Erf, Sigmoid, Silu,
                      GeluTanh, Log1p, Expm1, Sin, Cos, Reciprocal>;
using BinaryOps = List<Add, Sub, Mul, Div, Maximum, Minimum, Pow, Eq, Ne, Lt, Le, Gt, Ge>;

namespace detail {
template <class F, class... Fs>
constexpr int index_in() {
  int i = 0;
  int found = -1;
  ((found = (found < 0 && std::is_same_v<F, Fs>) ? i : found, ++i), ...);
  return found;
}
template <class F, class L>
struct IndexOf;
template <class F, class... Fs>
struct IndexOf<F, List<Fs...>> {
  static constexpr int value = index_in<F, Fs...>();
  static_assert(value >= 0, "the functor is not in the list");
};
template <class L>
struct Visit;
template <class... Fs>
struct Visit<List<Fs...>> {
  template <class Fn>
  static bool run(int index, Fn&& fn) {
    int i = 0;
    return ((i++ == index ? (fn.template operator()<Fs>(), true) : false) || ...);
  }
  static std::string_view name(int index) {
    int i = 0;
    std::string_view out = "?";
    ((out = i++ == index ? Fs::name : out), ...);
    return out;
  }
};
}  // namespace detail

// The index of functor F in list L (a compile-time constant).
template <class F, class L>
inline constexpr int index_of = detail::IndexOf<F, L>::value;

// Calls fn.template operator()<F>() with the functor F at `index` of L; false when out of range.
template <class L, class Fn>
bool visit(int index, Fn&& fn) {
  return detail::Visit<L>::run(index, fn);
}

// The name of the op at `index` of L ("?" when out of range).
template <class L>
std::string_view name_of(int index) {
  return detail::Visit<L>::name(index);
}

}  // namespace spmd::element
