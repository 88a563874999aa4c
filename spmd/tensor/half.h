// spmd/tensor/half.h: the 16-bit floating-point element types BFloat16 and Half, and their
// conversions to and from float, once for the CPU and the GPU.
//
// Plain 2-byte values with explicit conversion to and from float. Conversion from float rounds
// to nearest, ties to even; NaN stays NaN. Arithmetic happens in float (kernels widen, compute,
// and round once), so these types deliberately offer no operators beyond comparison.
//
// The conversions are the functions of namespace half_bits, on the bits: callable on the host and
// the device (SPMD_HD), and this header depends on nothing else in spmdsim but
// tensor/host_device.h, so the CUDA kernels (tensor/cuda/element.h) run these same functions and
// both devices round alike, bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include <spmd/tensor/host_device.h>

namespace spmd {
namespace half_bits {

SPMD_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

SPMD_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// bfloat16: the high half of a float.
SPMD_HD float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest, ties to even; NaN stays NaN (quiet bit set).
SPMD_HD uint16_t float_to_bf16(float value) {
  uint32_t u = float_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
SPMD_HD uint16_t float_to_f16(float value) {
  const uint32_t u = float_bits(value);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half precision: scale into the 10-bit mantissa with rounding.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to zero
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t half_mant = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  // Normal: rebias the exponent, round the mantissa from 23 to 10 bits (ties to even).
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

SPMD_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0) {
    if (mantissa == 0) {
      u = sign;
    } else {  // subnormal: normalise
      uint32_t e = 0;
      mantissa <<= 1;
      while ((mantissa & 0x400u) == 0) {
        ++e;
        mantissa <<= 1;
      }
      u = sign | ((112u - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else {
    u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return bits_float(u);
}

}  // namespace half_bits

struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return half_bits::bf16_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 v;
    v.bits = b;
    return v;
  }
  static uint16_t from_float(float value) { return half_bits::float_to_bf16(value); }
  friend bool operator==(BFloat16 a, BFloat16 b) { return float(a) == float(b); }
};

struct Half {
  uint16_t bits = 0;

  Half() = default;
  explicit Half(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half v;
    v.bits = b;
    return v;
  }
  static uint16_t from_float(float value) { return half_bits::float_to_f16(value); }
  static float to_float(uint16_t bits) { return half_bits::f16_to_float(bits); }
  friend bool operator==(Half a, Half b) { return float(a) == float(b); }
};

}  // namespace spmd
