// spmd/runtime/digest.h: one short hex string that identifies a program's results, the same under
// every backend.
//
// Every example ends with `print_digest(world, {y, z})`, which prints `digest: 1f0c...` on the
// coordinator. Run it under sim and under `mpirun -n 8 ... --spmd-backend=mpi`: equal digests mean
// every rank computed the same bytes (tests/examples compares them).
//
// The digest is FNV-1a (64-bit) over, for each tensor in order and each world rank 0..size-1 in
// order, the 64-bit digest of that rank's shard: FNV-1a over its dtype, its shape and its
// elements' bytes in row-major order (independent of strides). A rank whose shard the
// LocalTensor does not hold, or whose shard has no elements (the empty piece of a rank outside a
// DTensor's mesh, Note [Ranks outside the mesh] in dtensor/dtensor.h), contributes 0. The per-rank
// digests are all-gathered over the world under every backend, sim included, so it is a collective:
// every process must call it, in the same order, and every backend's trace records it as one
// all_gather over a mesh dim named "digest", so that a sim trace of a correct program equals its
// cluster traces (and its threads trace, with the exception docs/debugging.md names).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/local_tensor.h>
#include <spmd/world/world.h>

namespace spmd {

// FNV-1a 64-bit over `bytes` bytes, continuing from `hash`.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash = kFnvOffset);

// The digest of one tensor: dtype, shape and elements.
uint64_t digest(const Tensor& t);
// The digest of plain tensors (the same in every process): FNV-1a over their digests, in order.
// For programs without a World, such as examples/tensor_tour.
uint64_t combined_digest(const std::vector<Tensor>& tensors);
// The digest of `tensors` over every rank of `world` (a collective under real backends).
// Traced at the caller's line.
uint64_t digest(const World& world, const std::vector<LocalTensor>& tensors,
                SourceLocation loc = SourceLocation::current());
// 16 lowercase hex digits.
std::string digest_hex(uint64_t digest);
// Prints "digest: <hex>" on the coordinator and returns the digest (a collective, as above);
// "shape digest: <hex>" when a tensor is shape-only (--spmd-tensors=meta: dtypes and shapes only).
uint64_t print_digest(const World& world, const std::vector<LocalTensor>& tensors,
                      SourceLocation loc = SourceLocation::current());

}  // namespace spmd
