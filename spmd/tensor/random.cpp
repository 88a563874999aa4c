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
  if (!is_floating(dtype)) {
    throw_error<Unsupported>("{}: dtype {} is not supported (floating dtypes only)", op, dtype);
  }
}

// The block [start, start + sizes) of a random tensor of shape `global`, element i of the full
// tensor being value(i).
template <class F>
Tensor random_block(const char* op, const Shape& global, const Shape& start, const Shape& sizes,
                    DType dtype, bool uniform, F value) {
  check_random_dtype(op, dtype);
  checked_numel(global, op);
  bool inside = start.size() == global.size() && sizes.size() == global.size();
  for (std::size_t d = 0; inside && d < global.size(); ++d) {
    inside = start[d] >= 0 && sizes[d] >= 0 && start[d] <= global[d] - sizes[d];
  }
  if (!inside) {
    throw_error<ShapeError>("{}: block at {} of sizes {} does not lie inside shape {}", op,
                            shape_str(start), shape_str(sizes), shape_str(global));
  }
  Tensor out = empty_for(op, sizes, dtype);
  // Random initialization is free in a dry run (Note [Shape-only tensors]).
  if (out.is_meta()) return out;
  const int64_t numel = out.numel();
  const Strides global_strides = contiguous_strides(global);
  const std::size_t nd = sizes.size();
  dispatch_dtype(dtype, [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      T* p = out.data<T>();
      parallel_for(numel, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          // The element's flat index in the full tensor.
          int64_t rest = i;
          int64_t flat = 0;
          for (std::size_t d = nd; d-- > 0;) {
            flat += (start[d] + rest % sizes[d]) * global_strides[d];
            rest /= sizes[d];
          }
          const double v = value(static_cast<uint64_t>(flat));
          p[i] = uniform ? round_uniform<T>(v) : convert_element<T>(v);
        }
      });
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
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * counter[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return counter;
}

double philox_uniform(uint64_t seed, uint64_t index) {
  const std::array<uint32_t, 4> w = philox_words(seed, index);
  return unit_double(w[0], w[1]);
}

double philox_normal(uint64_t seed, uint64_t index) {
  const std::array<uint32_t, 4> w = philox_words(seed, index);
  // Box-Muller; 1 - u lies in (0, 1], so the log is finite.
  const double u1 = 1.0 - unit_double(w[0], w[1]);
  const double u2 = unit_double(w[2], w[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Tensor rand(const Shape& shape, uint64_t seed, DType dtype) {
  return rand_block(shape, seed, Shape(shape.size(), 0), shape, dtype);
}

Tensor randn(const Shape& shape, uint64_t seed, DType dtype) {
  return randn_block(shape, seed, Shape(shape.size(), 0), shape, dtype);
}

Tensor rand_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                  DType dtype) {
  return random_block("rand", global, start, sizes, dtype, true,
                      [seed](uint64_t i) { return philox_uniform(seed, i); });
}

Tensor randn_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                   DType dtype) {
  return random_block("randn", global, start, sizes, dtype, false,
                      [seed](uint64_t i) { return philox_normal(seed, i); });
}

}  // namespace spmd
