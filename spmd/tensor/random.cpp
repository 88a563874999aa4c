// spmd/tensor/random.cpp: Philox4x32-10 and the counter-based random tensors built on it.
#include <spmd/tensor/random.h>

#include <cmath>
#include <numbers>

#include <spmd/core/parallel.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace {

// The constants of Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), as in
// Random123's philox.h: round multipliers and the Weyl sequence that bumps the key.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

// One Philox round on counter words (c0, c1, c2, c3) with key words (k0, k1).
inline void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0,
                         uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
  c0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
  c1 = static_cast<uint32_t>(p1);
  c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c3 = static_cast<uint32_t>(p0);
}

std::array<uint32_t, 4> philox_words(uint64_t seed, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// Uniform [0, 1) with 53 random bits from two words.
double unit_double(uint32_t lo, uint32_t hi) {
  const uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

// Rounds v to T, keeping rand's values strictly below 1 after rounding to a coarse dtype.
template <class T>
T round_uniform(double v) {
  T out = convert_element<T>(v);
  if (convert_element<double>(out) >= 1.0) {
    // The largest T below 1: 1 - 2^-p for p mantissa bits (with the implicit one).
    constexpr int kBits = std::is_same_v<T, double>  ? 53
                          : std::is_same_v<T, float> ? 24
                          : std::is_same_v<T, Half>  ? 11
                                                     : 8;
    out = convert_element<T>(1.0 - std::ldexp(1.0, -kBits));
  }
  return out;
}

void check_random_dtype(const char* op, DType dtype) {
  check_dtype(dtype, op);
  if (!is_floating(dtype) || is_float8(dtype)) {
    throw_error<Unsupported>(
        "{}: dtype {} is not supported (f32, f64, bf16, f16; draw float8 values in a wider dtype "
        "and convert)",
        op, dtype);
  }
}

// Note [Philox in lanes]
// Blocks of random values are made kLanes counters at a time: philox_lanes runs philox4x32's
// rounds over arrays of lanes, which the compiler turns into vector multiplies. It is compiled for
// AVX-512, AVX2 and baseline x86-64 and the loader picks one for the CPU (target_clones), so the
// package needs no -march; every clone gives philox4x32's words bit for bit (integer arithmetic),
// so the streams and every digest are the same. random_block walks the block by rows of its last
// dim, whose elements have consecutive flat indices in the full tensor (Note [Counter-based RNG]).
constexpr int kLanes = 16;

struct PhiloxLanes {
  std::array<std::array<uint32_t, kLanes>, 4> w;
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define SPMD_PHILOX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPMD_PHILOX_CLONES
#endif

// The words of philox(seed, index0 + l) for the kLanes lanes l.
SPMD_PHILOX_CLONES void philox_lanes(uint64_t seed, uint64_t index0, PhiloxLanes& out) {
  std::array<uint32_t, kLanes> c0{}, c1{}, c2{}, c3{};
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t i = index0 + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(i);
    c1[l] = static_cast<uint32_t>(i >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    for (int l = 0; l < kLanes; ++l) philox_round(c0[l], c1[l], c2[l], c3[l], k0, k1);
  }
  out.w = {c0, c1, c2, c3};
}

// What a block holds: rand's values, randn's, or dropout's scaled keep mask (rand's F64 value
// >= p: 1 / (1 - p), else 0).
enum class RandomKind { Uniform, Normal, Keep };

double normal_from_words(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  // Box-Muller; 1 - u lies in (0, 1], so the log is finite.
  const double u1 = 1.0 - unit_double(w0, w1);
  const double u2 = unit_double(w2, w3);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void check_block(const char* op, const Shape& global, const Shape& start, const Shape& sizes) {
  checked_numel(global, op);
  bool inside = start.size() == global.size() && sizes.size() == global.size();
  for (std::size_t d = 0; inside && d < global.size(); ++d) {
    inside = start[d] >= 0 && sizes[d] >= 0 && start[d] <= global[d] - sizes[d];
  }
  if (!inside) {
    throw_error<ShapeError>("{}: block at {} of sizes {} does not lie inside shape {}", op,
                            shape_str(start), shape_str(sizes), shape_str(global));
  }
}

// Fills p (the numel elements of the block [start, start + sizes) of a tensor of shape `global`,
// row-major) with element i of the full tensor's value(words of philox(seed, i)), by rows of the
// last dim.
template <class T, class F>
void fill_block(T* p, int64_t numel, const Shape& global, const Shape& start, const Shape& sizes,
                uint64_t seed, F value) {
  const std::size_t nd = sizes.size();
  if (numel == 0) return;
  const int64_t row = nd == 0 ? 1 : sizes[nd - 1];
  const int64_t rows = numel / row;
  const Strides global_strides = contiguous_strides(global);
  const int64_t grain = std::max<int64_t>(1, 4096 / row);
  parallel_for(rows, grain, [&](int64_t first, int64_t last) {
    PhiloxLanes lanes;
    for (int64_t r = first; r < last; ++r) {
      // The flat index in the full tensor of the row's first element.
      int64_t rest = r;
      int64_t flat = nd == 0 ? 0 : start[nd - 1];
      for (std::size_t d = nd - (nd == 0 ? 0 : 1); d-- > 0;) {
        flat += (start[d] + rest % sizes[d]) * global_strides[d];
        rest /= sizes[d];
      }
      T* out = p + r * row;
      for (int64_t j = 0; j < row; j += kLanes) {
        philox_lanes(seed, static_cast<uint64_t>(flat + j), lanes);
        const int64_t n = std::min<int64_t>(kLanes, row - j);
        for (int64_t l = 0; l < n; ++l) {
          out[j + l] = value(lanes.w[0][l], lanes.w[1][l], lanes.w[2][l], lanes.w[3][l]);
        }
      }
    }
  });
}

Tensor random_block(const char* op, const Shape& global, uint64_t seed, const Shape& start,
                    const Shape& sizes, DType dtype, RandomKind kind, double p = 0.0) {
  check_random_dtype(op, dtype);
  check_block(op, global, start, sizes);
  Tensor out = empty_for(op, sizes, dtype);
  // Random initialization is free in a dry run (Note [Shape-only tensors]).
  if (out.is_meta()) return out;
  dispatch_dtype(dtype, [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      if (kind == RandomKind::Uniform) {
        fill_block(out.data<T>(), out.numel(), global, start, sizes, seed,
                   [](uint32_t w0, uint32_t w1, uint32_t, uint32_t) {
                     return round_uniform<T>(unit_double(w0, w1));
                   });
      } else if (kind == RandomKind::Keep) {
        const T scale = convert_element<T>(p < 1.0 ? 1.0 / (1.0 - p) : 1.0);
        fill_block(out.data<T>(), out.numel(), global, start, sizes, seed,
                   [p, scale](uint32_t w0, uint32_t w1, uint32_t, uint32_t) {
                     return unit_double(w0, w1) >= p ? scale : T(0);
                   });
      } else {
        fill_block(out.data<T>(), out.numel(), global, start, sizes, seed,
                   [](uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
                     return convert_element<T>(normal_from_words(w0, w1, w2, w3));
                   });
      }
    }
  });
  return out;
}

}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    philox_round(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  }
  return counter;
}

double philox_uniform(uint64_t seed, uint64_t index) {
  const std::array<uint32_t, 4> w = philox_words(seed, index);
  return unit_double(w[0], w[1]);
}

double philox_normal(uint64_t seed, uint64_t index) {
  const std::array<uint32_t, 4> w = philox_words(seed, index);
  return normal_from_words(w[0], w[1], w[2], w[3]);
}

Tensor rand(const Shape& shape, uint64_t seed, DType dtype) {
  return rand_block(shape, seed, Shape(shape.size(), 0), shape, dtype);
}

Tensor randn(const Shape& shape, uint64_t seed, DType dtype) {
  return randn_block(shape, seed, Shape(shape.size(), 0), shape, dtype);
}

Tensor rand_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                  DType dtype) {
  return random_block("rand", global, seed, start, sizes, dtype, RandomKind::Uniform);
}

Tensor randn_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                   DType dtype) {
  return random_block("randn", global, seed, start, sizes, dtype, RandomKind::Normal);
}

Tensor dropout_mask_block(const Shape& global, uint64_t seed, const Shape& start,
                          const Shape& sizes, double p, DType dtype) {
  return random_block("dropout", global, seed, start, sizes, dtype, RandomKind::Keep, p);
}

}  // namespace spmd
