// spmd/dtensor/random.h: mesh-invariant random DTensors.
//
// randn(global, mesh, placements, seed) equals distribute_tensor(randn(global, seed), mesh,
// placements) bit for bit, for every mesh and placement, uneven and empty shards included, yet
// each rank generates only its own block: element i (flat row-major index of the global tensor)
// is a pure function of (seed, i) (Note [Counter-based RNG], tensor/random.h). So a model
// initialized on 8 ranks with any sharding holds the same weights as on 1 rank.
//
//   DTensor w = randn({1024, 512}, mesh, {Shard{0}, Replicate{}}, /*seed=*/0);
//   // w.full_tensor() == randn({1024, 512}, 0)
#pragma once

#include <cstdint>

#include <spmd/dtensor/dtensor.h>
#include <spmd/tensor/random.h>

namespace spmd {

// Standard normal / uniform [0, 1) DTensors; see the banner. (The Tensor forms are
// randn(Shape, seed, DType) and rand(Shape, seed, DType) in tensor/random.h.)
DTensor randn(const Shape& global, const DeviceMesh& mesh, const Placements& placements,
              uint64_t seed, DType dtype = DType::F32);
DTensor rand(const Shape& global, const DeviceMesh& mesh, const Placements& placements,
             uint64_t seed, DType dtype = DType::F32);

}  // namespace spmd
