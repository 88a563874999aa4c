// spmd/nn/parallel.cpp: the parallel styles (nn/parallel.h).
#include <spmd/nn/parallel.h>

#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>

namespace spmd {

Placements placed_on(const DeviceMesh& mesh, MeshDim dim, Placement p) {
  return with_placement(replicate_placements(mesh), mesh, std::move(dim), std::move(p));
}

Placements with_placement(const Placements& placements, const DeviceMesh& mesh, MeshDim dim,
                          Placement p) {
  Placements out = placements;
  out.at(static_cast<size_t>(mesh.resolve(std::move(dim)))) = std::move(p);
  return out;
}

LocalTensor mesh_from_fn(const DeviceMesh& mesh, const std::vector<int>& held,
                         const std::function<Tensor(int rank)>& fn, SourceLocation loc) {
  const World& world = mesh.world();
  if (held.size() == world.held_ranks().size()) return LocalTensor::from_fn(world, fn, loc);
  return LocalTensor::from_fn(held, fn);
}

DTensor with_size_one_dims(const DTensor& t, const Placements& wanted, SourceLocation loc) {
  const UserCallSite site(loc);
  Placements out = t.placements();
  bool changed = false;
  for (size_t m = 0; m < out.size() && m < wanted.size(); ++m) {
    if (t.mesh().size(static_cast<int>(m)) == 1 && !(out[m] == wanted[m])) {
      out[m] = wanted[m];
      changed = true;
    }
  }
  return changed ? t.redistribute(out) : t;
}

Placements colwise_placements(const DeviceMesh& mesh, MeshDim tp) {
  return placed_on(mesh, std::move(tp), Shard{1});
}
Placements colwise_bias_placements(const DeviceMesh& mesh, MeshDim tp) {
  return placed_on(mesh, std::move(tp), Shard{0});
}
Placements rowwise_placements(const DeviceMesh& mesh, MeshDim tp) {
  return placed_on(mesh, std::move(tp), Shard{0});
}
Placements replicate_placements(const DeviceMesh& mesh) {
  return Placements(static_cast<size_t>(mesh.ndim()), Replicate{});
}

Placements fsdp_placements(const Placements& placements, const Shape& shape, const DeviceMesh& mesh,
                           MeshDim dp) {
  const size_t d = static_cast<size_t>(mesh.resolve(dp));
  if (placements.size() != static_cast<size_t>(mesh.ndim()) || !is_replicate(placements.at(d))) {
    throw_error<PlacementError>(
        "fsdp_placements: placements {} must have one entry per dim of mesh {} and be Replicate on "
        "the FSDP dim {}",
        to_string(placements), mesh.to_string(), mesh.dim_name(static_cast<int>(d)));
  }
  for (int k = 0; k < static_cast<int>(shape.size()); ++k) {
    bool sharded = false;
    for (const Placement& p : placements) sharded = sharded || is_shard(p, k);
    if (!sharded) return with_placement(placements, mesh, static_cast<int>(d), Shard{k});
  }
  return placements;
}

DTensor colwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       SourceLocation loc) {
  const UserCallSite site(loc);
  const DTensor input = x.redistribute(with_placement(x.placements(), x.mesh(), tp, Replicate{}));
  const DTensor y = matmul(input, w);
  return bias.defined() ? y + bias : y;
}

DTensor rowwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       Placement output, SourceLocation loc) {
  const UserCallSite site(loc);
  const DTensor partial = matmul(x, w);
  const DTensor y =
      partial.redistribute(with_placement(partial.placements(), partial.mesh(), tp, output));
  return bias.defined() ? y + bias : y;
}

DTensor sequence_parallel(const DTensor& x, MeshDim tp, int seq_dim, SourceLocation loc) {
  const UserCallSite site(loc);
  return x.redistribute(with_placement(x.placements(), x.mesh(), tp, Shard{seq_dim}));
}

DTensor fsdp_unshard(const DTensor& param, MeshDim dp, SourceLocation loc) {
  const UserCallSite site(loc);
  return gather_param(param, with_placement(param.placements(), param.mesh(), dp, Replicate{}));
}

}  // namespace spmd
