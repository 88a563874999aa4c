// spmd/runtime/digest.cpp: FNV-1a digests of tensors, gathered over the world.
#include <spmd/runtime/digest.h>

#include <algorithm>
#include <bit>
#include <cstdio>

#include <fmt/format.h>

#include <spmd/collectives/functional.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/meta.h>

namespace spmd {

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

uint64_t digest(const Tensor& t) {
  const auto dtype = static_cast<uint8_t>(t.dtype());
  uint64_t h = fnv1a(&dtype, 1);
  const int64_t ndim = t.dim();
  h = fnv1a(&ndim, sizeof ndim, h);
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t size = t.size(d);
    h = fnv1a(&size, sizeof size, h);
  }
  // A shape-only tensor's digest covers its dtype and shape (Note [Shape-only tensors]).
  if (t.is_meta()) return h;
  const Tensor c = t.detach().to(cpu()).contiguous();
  return fnv1a(c.data_ptr(), c.nbytes(), h);
}

uint64_t combined_digest(const std::vector<Tensor>& tensors) {
  uint64_t h = kFnvOffset;
  for (const Tensor& t : tensors) {
    const uint64_t d = digest(t);
    h = fnv1a(&d, sizeof d, h);
  }
  return h;
}

uint64_t digest(const World& world, const std::vector<LocalTensor>& tensors, SourceLocation loc) {
  const UserCallSite site(loc);
  const int size = world.size();
  const int64_t k = static_cast<int64_t>(tensors.size());
  // Row r: rank r's shard digest of every tensor.
  auto rank_row = [&](int r) {
    std::vector<int64_t> row(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      const LocalTensor& t = tensors[static_cast<size_t>(i)];
      // A shard without elements counts as none held (Note [Ranks outside the mesh]).
      const bool held = t.defined() && t.holds(r) && t.shard(r).numel() > 0;
      row[static_cast<size_t>(i)] = held ? std::bit_cast<int64_t>(digest(t.shard(r))) : 0;
    }
    return row;
  };
  // All-gathered under every backend, sim included, so that the digest's collective is in every
  // backend's trace and a sim trace agrees with a threads or cluster trace (spmd trace diff).
  DeviceMesh mesh = init_device_mesh(world, {size}, {"digest"});
  // The digests are values even in a dry run.
  const MetaTensorsScope real_values(false);
  LocalTensor rows = LocalTensor::from_fn(world, [&](int r) {
    return from_vector(rank_row(r), {1, k});
  });
  const std::vector<int64_t> table =  // [size, k]
      all_gather(rows, mesh, 0, 0, loc).shard_at(0).to_vector<int64_t>();
  // One row per rank of the mesh: the world's size, or 1 on the one-rank world of a parity run
  // (Note [Parity run] in debug/parity.h), whose meshes have every dim of size 1.
  const int64_t gathered = mesh.size(0);
  uint64_t h = kFnvOffset;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t r = 0; r < gathered; ++r) {
      const int64_t v = table[static_cast<size_t>(r * k + i)];
      h = fnv1a(&v, sizeof v, h);
    }
  }
  return h;
}

std::string digest_hex(uint64_t digest) {
  return fmt::format("{:016x}", digest);
}

uint64_t print_digest(const World& world, const std::vector<LocalTensor>& tensors,
                      SourceLocation loc) {
  const uint64_t d = digest(world, tensors, loc);
  if (world.is_coordinator()) {
    // A dry run's digest covers shapes and dtypes only: it differs from a real run's.
    const bool shape_only = std::any_of(tensors.begin(), tensors.end(), [](const LocalTensor& t) {
      return t.defined() && t.shard_at(0).is_meta();
    });
    fmt::print("{}: {}\n", shape_only ? "shape digest" : "digest", digest_hex(d));
    std::fflush(stdout);
  }
  return d;
}

}  // namespace spmd
