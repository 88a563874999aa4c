// spmd/tensor/random.cpp: Philox4x32-10 and the counter-based random tensors built on it.
#include <spmd/tensor/random.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <spmd/core/check.h>
#include <spmd/core/parallel.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/kernels/loops.h>

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

// The 53 random bits of a uniform value, from two words.
uint64_t unit_bits(uint32_t lo, uint32_t hi) {
  return ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
}

// Uniform [0, 1) with 53 random bits from two words.
double unit_double(uint32_t lo, uint32_t hi) {
  return static_cast<double>(unit_bits(lo, hi)) * 0x1.0p-53;
}

// dropout's test unit_double(lo, hi) >= p on the bits: bits * 2^-53 >= p holds exactly when
// bits >= ceil(p * 2^53) (the scaling by 2^53 is exact, and bits is an integer below 2^53), so
// the mask is the same bit for bit without converting each value to double.
uint64_t keep_threshold(double p) {
  if (std::isnan(p)) return std::numeric_limits<uint64_t>::max();  // nothing is >= NaN
  if (p <= 0.0) return 0;
  const double scaled = std::ceil(p * 0x1.0p53);
  return scaled >= 0x1.0p63 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(scaled);
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
// Blocks of random values are made up to kLanes counters at a time: philox_lanes runs philox4x32's
// rounds over lanes of counters, in vector registers. Philox's round is two 32 x 32 -> 64-bit
// products, and a compiler left to vectorize the scalar round widens every word to 64 bits and
// shuffles it back, four times slower than keeping the words in 32-bit lanes and multiplying the
// even and odd lanes separately (_mm512_mul_epu32 reads the low word of each 64-bit lane; the odd
// words are shifted down first, and the high and low halves of the products are blended back into
// 32-bit lanes). The AVX-512 version runs two 16-lane chains and the AVX2 version four 8-lane
// chains side by side, so that one chain's multiplies fill the others' latency: 0.95 ns a value
// on AVX-512 against 4.3 ns for the compiler's vectorization of the scalar round. The version is
// picked once for the CPU (__builtin_cpu_supports; the package needs no -march), and a CPU with
// neither runs the scalar round. All three give philox4x32's words bit for bit (integer
// arithmetic), so the streams and every digest are the same. random_block walks the block by rows
// of its last dim, whose elements have consecutive flat indices in the full tensor (Note
// [Counter-based RNG]).
constexpr int kLanes = 32;

struct PhiloxLanes {
  std::array<std::array<uint32_t, kLanes>, 4> w;
};

// The counters' words of lanes index0 + l: (low, high) of the 64-bit index.
void lane_counters(uint64_t index0, uint32_t* low, uint32_t* high, int n) {
  for (int l = 0; l < n; ++l) {
    const uint64_t i = index0 + static_cast<uint64_t>(l);
    low[l] = static_cast<uint32_t>(i);
    high[l] = static_cast<uint32_t>(i >> 32);
  }
}

// The words of philox(seed, index0 + l) for lanes l < n (n <= kLanes), one lane at a time.
void philox_lanes_scalar(uint64_t seed, uint64_t index0, PhiloxLanes& out, int n) {
  for (int l = 0; l < n; ++l) {
    const std::array<uint32_t, 4> w = philox_words(seed, index0 + static_cast<uint64_t>(l));
    for (int k = 0; k < 4; ++k) out.w[k][l] = w[k];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32(), which its -Wuninitialized
// reports where they are inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// (hi, lo) words of a x m, per 32-bit lane.
__attribute__((target("avx512f"))) inline void mul_hi_lo(__m512i a, __m512i m, __m512i& hi,
                                                         __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

__attribute__((target("avx2"))) inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi,
                                                      __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Philox's rounds on the kChains vectors of lanes in c at once (V: __m512i or __m256i), as
// philox_round does them on one lane; a macro, so that each use compiles for its function's ISA.
#define SPMD_PHILOX_CHAINS(V, set1, xor3)            \
  do {                                               \
    const V m0 = set1(kPhiloxM0);                    \
    const V m1 = set1(kPhiloxM1);                    \
    uint32_t k0 = static_cast<uint32_t>(seed);       \
    uint32_t k1 = static_cast<uint32_t>(seed >> 32); \
    for (int round = 0; round < 10; ++round) {       \
      if (round > 0) {                               \
        k0 += kPhiloxW0;                             \
        k1 += kPhiloxW1;                             \
      }                                              \
      const V key0 = set1(k0);                       \
      const V key1 = set1(k1);                       \
      for (int j = 0; j < kChains; ++j) {            \
        V hi0, lo0, hi1, lo1;                        \
        mul_hi_lo(c[0][j], m0, hi0, lo0);            \
        mul_hi_lo(c[2][j], m1, hi1, lo1);            \
        c[0][j] = xor3(hi1, c[1][j], key0);          \
        c[1][j] = lo1;                               \
        c[2][j] = xor3(hi0, c[3][j], key1);          \
        c[3][j] = lo0;                               \
      }                                              \
    }                                                \
  } while (false)

__attribute__((target("avx512f"))) inline __m512i set1_512(uint32_t v) {
  return _mm512_set1_epi32(static_cast<int>(v));
}
__attribute__((target("avx512f"))) inline __m512i xor3_512(__m512i a, __m512i b, __m512i c) {
  return _mm512_ternarylogic_epi32(a, b, c, 0x96);
}
__attribute__((target("avx2"))) inline __m256i set1_256(uint32_t v) {
  return _mm256_set1_epi32(static_cast<int>(v));
}
__attribute__((target("avx2"))) inline __m256i xor3_256(__m256i a, __m256i b, __m256i c) {
  return _mm256_xor_si256(_mm256_xor_si256(a, b), c);
}

// kChains x 16 lanes on AVX-512.
template <int kChains>
__attribute__((target("avx512f"))) void philox_avx512(uint64_t seed, uint64_t index0,
                                                      PhiloxLanes& out) {
  alignas(64) uint32_t low[kLanes], high[kLanes];
  lane_counters(index0, low, high, 16 * kChains);
  __m512i c[4][kChains];
  for (int j = 0; j < kChains; ++j) {
    c[0][j] = _mm512_load_si512(low + 16 * j);
    c[1][j] = _mm512_load_si512(high + 16 * j);
    c[2][j] = _mm512_setzero_si512();
    c[3][j] = _mm512_setzero_si512();
  }
  SPMD_PHILOX_CHAINS(__m512i, set1_512, xor3_512);
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < kChains; ++j) _mm512_storeu_si512(out.w[k].data() + 16 * j, c[k][j]);
  }
}

// kChains x 8 lanes on AVX2.
template <int kChains>
__attribute__((target("avx2"))) void philox_avx2(uint64_t seed, uint64_t index0, PhiloxLanes& out) {
  alignas(32) uint32_t low[kLanes], high[kLanes];
  lane_counters(index0, low, high, 8 * kChains);
  __m256i c[4][kChains];
  for (int j = 0; j < kChains; ++j) {
    c[0][j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(low + 8 * j));
    c[1][j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(high + 8 * j));
    c[2][j] = _mm256_setzero_si256();
    c[3][j] = _mm256_setzero_si256();
  }
  SPMD_PHILOX_CHAINS(__m256i, set1_256, xor3_256);
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < kChains; ++j) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.w[k].data() + 8 * j), c[k][j]);
    }
  }
}
#undef SPMD_PHILOX_CHAINS
#pragma GCC diagnostic pop
#endif

// The vector versions, in order: a CPU that runs one runs those before it.
enum class PhiloxIsa { Scalar, Avx2, Avx512 };

PhiloxIsa philox_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return PhiloxIsa::Avx512;
  if (__builtin_cpu_supports("avx2")) return PhiloxIsa::Avx2;
#endif
  return PhiloxIsa::Scalar;
}

// The words of philox(seed, index0 + l) for lanes l < n (n <= kLanes; lanes past n may be
// written too), by the given version.
void philox_lanes_on(PhiloxIsa isa, uint64_t seed, uint64_t index0, PhiloxLanes& out, int n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == PhiloxIsa::Avx512) {
    return n <= 16 ? philox_avx512<1>(seed, index0, out) : philox_avx512<2>(seed, index0, out);
  }
  if (isa == PhiloxIsa::Avx2) {
    return n <= 16 ? philox_avx2<2>(seed, index0, out) : philox_avx2<4>(seed, index0, out);
  }
#endif
  philox_lanes_scalar(seed, index0, out, n);
}

// The same by the best version for this CPU.
void philox_lanes(uint64_t seed, uint64_t index0, PhiloxLanes& out, int n) {
  static const PhiloxIsa isa = philox_isa();
  philox_lanes_on(isa, seed, index0, out, n);
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

// Dropout's keep mask from the lanes' first two words: scale where unit_bits(w0, w1) >= threshold,
// else 0. The bits lie below 2^53, so a threshold above that (keep nothing) is clamped to 2^53 and
// the test is a signed 64-bit comparison, which AVX2 has (vpcmpgtq; AVX-512 compares unsigned
// too): the loop vectorizes in the F32 and F64 clones, the same test bit for bit. tensor_bench
// BM_DropoutMask4M: 2.3 ms against 5.5 with the scalar test per element after the Philox lanes.
template <class T>
inline void keep_run(T* out, const uint32_t* w0, const uint32_t* w1, int64_t n, uint64_t threshold,
                     T scale) {
  const auto t = static_cast<int64_t>(std::min<uint64_t>(threshold, uint64_t{1} << 53));
  for (int64_t l = 0; l < n; ++l) {
    const auto bits = static_cast<int64_t>(unit_bits(w0[l], w1[l]));
    out[l] = bits >= t ? scale : T(0);
  }
}
SPMD_MATH_CLONES void keep_run_cloned(float* out, const uint32_t* w0, const uint32_t* w1, int64_t n,
                                      uint64_t threshold, float scale) {
  keep_run(out, w0, w1, n, threshold, scale);
}
SPMD_MATH_CLONES void keep_run_cloned(double* out, const uint32_t* w0, const uint32_t* w1,
                                      int64_t n, uint64_t threshold, double scale) {
  keep_run(out, w0, w1, n, threshold, scale);
}

// Fills p (the numel elements of the block [start, start + sizes) of a tensor of shape `global`,
// row-major) with element i of the full tensor's value(words of philox(seed, i)), by rows of the
// last dim: run(out, lanes, n) writes n elements from the lanes' words.
template <class T, class Run>
void fill_block(T* p, int64_t numel, const Shape& global, const Shape& start, const Shape& sizes,
                uint64_t seed, Run run) {
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
        const int64_t n = std::min<int64_t>(kLanes, row - j);
        philox_lanes(seed, static_cast<uint64_t>(flat + j), lanes, static_cast<int>(n));
        run(out + j, lanes, n);
      }
    }
  });
}

// fill_block's run for value(w0, w1, w2, w3) of each element's four words.
template <class T, class F>
auto per_element(F value) {
  return [value](T* out, const PhiloxLanes& lanes, int64_t n) {
    for (int64_t l = 0; l < n; ++l) {
      out[l] = value(lanes.w[0][l], lanes.w[1][l], lanes.w[2][l], lanes.w[3][l]);
    }
  };
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
      T* data = out.data<T>();
      if (kind == RandomKind::Uniform) {
        fill_block(data, out.numel(), global, start, sizes, seed,
                   per_element<T>([](uint32_t w0, uint32_t w1, uint32_t, uint32_t) {
                     return round_uniform<T>(unit_double(w0, w1));
                   }));
      } else if (kind == RandomKind::Keep) {
        const T scale = convert_element<T>(p < 1.0 ? 1.0 / (1.0 - p) : 1.0);
        const uint64_t threshold = keep_threshold(p);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          fill_block(data, out.numel(), global, start, sizes, seed,
                     [threshold, scale](T* o, const PhiloxLanes& lanes, int64_t n) {
                       keep_run_cloned(o, lanes.w[0].data(), lanes.w[1].data(), n, threshold,
                                       scale);
                     });
        } else {
          fill_block(data, out.numel(), global, start, sizes, seed,
                     [threshold, scale](T* o, const PhiloxLanes& lanes, int64_t n) {
                       keep_run(o, lanes.w[0].data(), lanes.w[1].data(), n, threshold, scale);
                     });
        }
      } else {
        fill_block(data, out.numel(), global, start, sizes, seed,
                   per_element<T>([](uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
                     return convert_element<T>(normal_from_words(w0, w1, w2, w3));
                   }));
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

namespace detail {
std::vector<std::pair<std::string, std::vector<std::array<uint32_t, 4>>>> philox_lanes_by_version(
    uint64_t seed, uint64_t index0, int n) {
  SPMD_CHECK(n >= 0 && n <= kLanes);
  std::vector<std::pair<std::string, std::vector<std::array<uint32_t, 4>>>> out;
  const PhiloxIsa best = philox_isa();
  for (PhiloxIsa isa : {PhiloxIsa::Scalar, PhiloxIsa::Avx2, PhiloxIsa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) continue;
    PhiloxLanes lanes;
    philox_lanes_on(isa, seed, index0, lanes, n);
    std::vector<std::array<uint32_t, 4>> words(static_cast<std::size_t>(n));
    for (int l = 0; l < n; ++l) {
      for (int k = 0; k < 4; ++k) words[static_cast<std::size_t>(l)][k] = lanes.w[k][l];
    }
    const char* name = isa == PhiloxIsa::Avx512 ? "avx512"
                       : isa == PhiloxIsa::Avx2 ? "avx2"
                                                : "scalar";
    out.emplace_back(name, std::move(words));
  }
  return out;
}
}  // namespace detail

Tensor dropout_mask_block(const Shape& global, uint64_t seed, const Shape& start,
                          const Shape& sizes, double p, DType dtype) {
  return random_block("dropout", global, seed, start, sizes, dtype, RandomKind::Keep, p);
}

}  // namespace spmd
