// spmd/core/hash.h: combining hashes of the small values (layouts, options, placements) that key
// spmdsim's caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace spmd {

// Mixes `value`'s hash into `seed` (the boost recipe with a 64-bit constant).
template <class T>
void hash_combine(std::size_t& seed, const T& value) {
  seed ^= std::hash<T>{}(value) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}

template <class Range>
std::size_t hash_range(const Range& range) {
  std::size_t seed = 0;
  for (const auto& v : range) hash_combine(seed, v);
  return seed;
}

}  // namespace spmd
