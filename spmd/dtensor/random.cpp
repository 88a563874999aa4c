// spmd/dtensor/random.cpp: randn/rand DTensors from per-rank Philox blocks.
#include <spmd/dtensor/random.h>

#include <spmd/core/error.h>

namespace spmd {
namespace {

using BlockFn = Tensor (*)(const Shape&, uint64_t, const Shape&, const Shape&, DType);

DTensor random_dtensor(const char* op, BlockFn block_fn, const Shape& global,
                       const DeviceMesh& mesh, const Placements& placements, uint64_t seed,
                       DType dtype) {
  checked_numel(global, op);
  auto spec = std::make_shared<const DTensorSpec>(mesh, placements, global, dtype, op);
  return dtensor_from_blocks(op, std::move(spec), [&](const Shape& offset, const Shape& size) {
    return block_fn(global, seed, offset, size, dtype);
  });
}

}  // namespace

DTensor randn(const Shape& global, const DeviceMesh& mesh, const Placements& placements,
              uint64_t seed, DType dtype) {
  return random_dtensor("randn", randn_block, global, mesh, placements, seed, dtype);
}

DTensor rand(const Shape& global, const DeviceMesh& mesh, const Placements& placements,
             uint64_t seed, DType dtype) {
  return random_dtensor("rand", rand_block, global, mesh, placements, seed, dtype);
}

}  // namespace spmd
