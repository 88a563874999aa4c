// spmd/tensor/random.h: counter-based random numbers (Philox4x32-10).
//
// Note [Counter-based RNG]
// Element i (flat row-major index) of rand(shape, seed) / randn(shape, seed) is a pure function
// of (seed, i): Philox4x32-10 keyed by the seed, counter = i. So any block of a random tensor can
// be generated without the rest (rand_block / randn_block), which is how DTensor's mesh-invariant
// random init gives every rank exactly its slice of the single-device tensor. Values are made in
// double and rounded to the requested dtype, so every dtype sees the same underlying numbers.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <spmd/tensor/tensor.h>

namespace spmd {

// One Philox4x32-10 evaluation: 10 rounds over the 128-bit counter with the 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Uniform [0, 1) from the first two words of philox(seed, i) (53 random bits).
double philox_uniform(uint64_t seed, uint64_t index);
// Standard normal from philox(seed, i) by Box-Muller.
double philox_normal(uint64_t seed, uint64_t index);

// Uniform [0, 1).
Tensor rand(const Shape& shape, uint64_t seed, DType dtype = DType::F32);
// Standard normal.
Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::F32);
// The block [start, start + sizes) of rand(global, seed) / randn(global, seed), computed alone.
// ShapeError when the block does not lie inside `global`.
Tensor rand_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                  DType dtype = DType::F32);
Tensor randn_block(const Shape& global, uint64_t seed, const Shape& start, const Shape& sizes,
                   DType dtype = DType::F32);
// Dropout's scaled keep mask, without an F64 tensor: where rand_block(global, seed, start, sizes,
// F64) >= p, 1 / (1 - p) rounded to dtype (floating), else 0 (all 0 for p = 1). dropout is x
// times it.
Tensor dropout_mask_block(const Shape& global, uint64_t seed, const Shape& start,
                          const Shape& sizes, double p, DType dtype);

namespace detail {
// Note [Philox in lanes], for tests: philox(seed, index0 + l) for l < n (n <= 32) from each
// vector version this CPU can run ("avx512", "avx2") and the scalar one, by name.
std::vector<std::pair<std::string, std::vector<std::array<uint32_t, 4>>>> philox_lanes_by_version(
    uint64_t seed, uint64_t index0, int n);
}  // namespace detail

}  // namespace spmd
