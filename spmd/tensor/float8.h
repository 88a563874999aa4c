// spmd/tensor/float8.h: the 8-bit floating-point element types Float8E4M3FN and Float8E5M2, and
// their conversions to and from float, once for the CPU and the GPU.
//
// Note [Float8]
// The two formats of FP8 training (OCP 8-bit floating point, as torch.float8_e4m3fn and
// torch.float8_e5m2):
//   f8e4m3fn  1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, NaN is S.1111.111;
//             largest finite 448, smallest normal 2^-6, smallest subnormal 2^-9. Weights and
//             activations.
//   f8e5m2    1 sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like with infinities and
//             NaNs; largest finite 57344, smallest subnormal 2^-16. Gradients (more range).
// Conversion from float rounds to nearest, ties to even, as if the format had one more binade;
// a result past the largest finite value becomes the overflow value: NaN for f8e4m3fn (which has
// no infinity), an infinity for f8e5m2. So f8e4m3fn maps 464 (the tie between 448 and 480) to
// 448 and anything above 464, infinities included, to NaN; f8e5m2 maps 61440 and above to an
// infinity. NaN stays NaN; the sign is kept throughout. These are PyTorch's casts (c10's
// Float8_e4m3fn.h and Float8_e5m2.h): they do not saturate, which is why FP8 recipes scale a
// tensor into range before they cast it (Note [Float8 training] in ops/linalg.cpp).
// As in PyTorch, float8 tensors are storage formats with few ops: casts, copies, views, cat and
// scaled_mm (Note [Float8 ops] in ops/op.h); arithmetic happens in a wider type.
#pragma once

#include <cstdint>

#include <spmd/tensor/half.h>
#include <spmd/tensor/host_device.h>

namespace spmd {
namespace float8_bits {

// One FP8 format: M mantissa bits, exponent bias, the largest finite code (sign clear), the code
// (sign clear) a result past it becomes, and the NaN code.
struct Format {
  uint32_t mantissa_bits;
  int bias;
  uint32_t max_finite;
  uint32_t overflow;
  uint32_t nan;
};

inline constexpr Format kE4M3FN{3, 7, 0x7eu, 0x7fu, 0x7fu};
inline constexpr Format kE5M2{2, 15, 0x7bu, 0x7cu, 0x7fu};

// Round to nearest, ties to even, with Note [Float8]'s overflow rule.
SPMD_HD uint8_t from_float(float value, Format f) {
  const uint32_t u = half_bits::float_bits(value);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | f.nan);
  const uint32_t drop = 23u - f.mantissa_bits;  // float mantissa bits that go
  // The smallest normal of the format, 2^(1 - bias), as float bits.
  const uint32_t min_normal = static_cast<uint32_t>(128 - f.bias) << 23;
  uint32_t code;
  if (abs < min_normal) {
    // Subnormal or zero: count in units of 2^(1 - bias - M), rounding the remainder.
    const uint32_t exponent = abs >> 23;  // biased; 0 for float subnormals (far below range)
    const uint32_t mantissa = (abs & 0x7fffffu) | (exponent ? 0x800000u : 0u);
    // value = mantissa * 2^(exponent - 150) and q = value / 2^(1 - bias - M): a right shift by
    // s, between 24 - M (just below the smallest normal) and 25 (below half the smallest unit).
    const int s = 151 - f.bias - static_cast<int>(f.mantissa_bits) - static_cast<int>(exponent);
    if (exponent == 0 || s > 25) return static_cast<uint8_t>(sign);  // rounds to zero
    uint32_t q = mantissa >> s;
    const uint32_t rest = mantissa & ((1u << s) - 1u);
    const uint32_t half = 1u << (s - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    code = q;  // 2^M is the smallest normal's code, as it should be
  } else {
    const uint32_t rounded = abs + ((1u << (drop - 1u)) - 1u) + ((abs >> drop) & 1u);
    code = (rounded >> drop) - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits);
  }
  if (code > f.max_finite) code = f.overflow;
  return static_cast<uint8_t>(sign | code);
}

SPMD_HD float to_float(uint8_t b, Format f) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t rest = b & 0x7fu;
  if (rest == f.nan) return half_bits::bits_float(sign | 0x7fc00000u);
  if (f.overflow != f.nan && rest == f.overflow) return half_bits::bits_float(sign | 0x7f800000u);
  if (f.overflow != f.nan && rest > f.overflow) return half_bits::bits_float(sign | 0x7fc00000u);
  const uint32_t exponent = rest >> f.mantissa_bits;
  const uint32_t mantissa = rest & ((1u << f.mantissa_bits) - 1u);
  if (exponent == 0) {
    // mantissa * 2^(1 - bias - M): exact in float.
    const float unit = half_bits::bits_float(
        static_cast<uint32_t>(128 - f.bias - static_cast<int>(f.mantissa_bits)) << 23);
    const float magnitude = static_cast<float>(mantissa) * unit;
    return half_bits::bits_float(sign | half_bits::float_bits(magnitude));
  }
  return half_bits::bits_float(sign | ((exponent + static_cast<uint32_t>(127 - f.bias)) << 23) |
                               (mantissa << (23u - f.mantissa_bits)));
}

}  // namespace float8_bits

// A float8 value of format kFormat: a plain byte with explicit conversion to and from float, no
// arithmetic (kernels widen to float), like BFloat16 and Half (tensor/half.h).
template <const float8_bits::Format& kFormat>
struct Float8 {
  uint8_t bits = 0;

  Float8() = default;
  explicit Float8(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  static Float8 from_bits(uint8_t b) {
    Float8 v;
    v.bits = b;
    return v;
  }
  static uint8_t from_float(float value) { return float8_bits::from_float(value, kFormat); }
  static float to_float(uint8_t bits) { return float8_bits::to_float(bits, kFormat); }
  friend bool operator==(Float8 a, Float8 b) { return float(a) == float(b); }
};

using Float8E4M3FN = Float8<float8_bits::kE4M3FN>;
using Float8E5M2 = Float8<float8_bits::kE5M2>;

}  // namespace spmd
