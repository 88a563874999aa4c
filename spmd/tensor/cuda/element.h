// spmd/tensor/cuda/element.h: element conversions and strided indexing of the CUDA kernels.
//
// Internal to tensor/cuda. Every function here compiles for the host and for the device
// (SPMD_HD), so the CUDA kernels run exactly the code that tests/tensor/cuda/element_test.cpp
// checks on the CPU against the CPU kernels: conversions bit for bit convert_element
// (tensor/dtype.h, BFloat16/Half of tensor/half.h). The per-element math of every elementwise op
// is tensor/element_ops.h's, and the 16-bit floats' conversions are tensor/half.h's: the CPU
// kernels run the same functions.
//
// The storage types Bf16 and F16 are plain 2-byte values (same layout as spmd::BFloat16 and
// spmd::Half) so this header depends on nothing in spmdsim but element_ops.h and half.h, and nvcc
// compiles it alone.
#pragma once

#include <math.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <spmd/tensor/element_ops.h>
#include <spmd/tensor/half.h>

namespace spmd::cuda_math {

using element::math_erf;
using element::math_exp;
using element::math_log;
using element::math_sqrt;
using element::math_tanh;
using half_bits::bf16_to_float;
using half_bits::f16_to_float;
using half_bits::float_to_bf16;
using half_bits::float_to_f16;

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

template <class T>
inline constexpr bool is_half_like = std::is_same_v<T, Bf16> || std::is_same_v<T, F16>;

// ---- bits ------------------------------------------------------------------------------------

SPMD_HD uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

SPMD_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ---- compute types, load and store -------------------------------------------------------------

// What kernels compute in: BF16/F16 widen to float, every other type computes as itself.
template <class T>
using compute_t = std::conditional_t<is_half_like<T>, float, T>;

template <class T>
SPMD_HD compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return bf16_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, F16>) {
    return f16_to_float(v.bits);
  } else {
    return v;
  }
}

template <class T>
SPMD_HD T store(compute_t<T> v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return Bf16{float_to_bf16(v)};
  } else if constexpr (std::is_same_v<T, F16>) {
    return F16{float_to_f16(v)};
  } else {
    return v;
  }
}

template <class T>
struct IntLimits;
template <>
struct IntLimits<int32_t> {
  static constexpr int32_t max = 2147483647;
  static constexpr int32_t min = -2147483647 - 1;
};
template <>
struct IntLimits<int64_t> {
  static constexpr int64_t max = 9223372036854775807LL;
  static constexpr int64_t min = -9223372036854775807LL - 1;
};

// convert_element of tensor/dtype.h: through float for the 16-bit types; floating to integer
// truncates toward zero and saturates, NaN giving 0.
template <class To, class From>
SPMD_HD To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_half_like<From>) {
    return convert<To>(load(v));
  } else if constexpr (is_half_like<To>) {
    return store<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    const From limit = static_cast<From>(IntLimits<To>::max) + From(1);
    if (!(v == v)) return To(0);
    if (v >= limit) return IntLimits<To>::max;
    if (v <= -limit) return IntLimits<To>::min;
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Amax/Amin accumulation: `v` replaces `current` when better; NaN wins and then stays.
template <class C>
SPMD_HD bool extremum_better(bool is_max, C v, C current) {
  return v != v || (current == current && (is_max ? v > current : v < current));
}

// ---- strided indexing --------------------------------------------------------------------------

// The most dims an elementwise kernel walks after merging (make_indexer).
inline constexpr int kMaxDims = 10;

// Maps position i of a row-major walk over `sizes` to each of N operands' element offsets.
template <int N>
struct Indexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  SPMD_HD void offsets(int64_t i, int64_t* out) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t index = i;
      if (d > 0) {
        index = i % sizes[d];
        i /= sizes[d];
      }
      for (int k = 0; k < N; ++k) out[k] += index * strides[k][d];
    }
  }
};

// The Indexer of a walk over `shape` in row-major order with each operand's element strides:
// size-1 dims dropped and neighbouring dims merged where every operand allows it. Throws
// std::length_error when more than kMaxDims dims remain (callers make operands contiguous first).
template <int N>
Indexer<N> make_indexer(const std::vector<int64_t>& shape,
                        const std::array<const std::vector<int64_t>*, N>& strides) {
  Indexer<N> ix;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (ix.ndim > 0) {
      bool merge = true;
      for (int k = 0; k < N && merge; ++k) {
        merge = ix.strides[k][ix.ndim - 1] == (*strides[k])[d] * shape[d];
      }
      if (merge) {
        ix.sizes[ix.ndim - 1] *= shape[d];
        for (int k = 0; k < N; ++k) ix.strides[k][ix.ndim - 1] = (*strides[k])[d];
        continue;
      }
    }
    if (ix.ndim == kMaxDims) throw std::length_error("make_indexer: too many dims");
    ix.sizes[ix.ndim] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][ix.ndim] = (*strides[k])[d];
    ++ix.ndim;
  }
  return ix;
}

}  // namespace spmd::cuda_math
