// spmd/nn/parallel.cpp: the parallel styles (nn/parallel.h).
#include <spmd/nn/parallel.h>

#include <algorithm>
#include <optional>

#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/local_ops.h>

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
  // A Shard over a mesh dim of size 1 splits nothing: its tensor dim is still free.
  const std::vector<int64_t> sizes = mesh.shape();
  for (int k = 0; k < static_cast<int>(shape.size()); ++k) {
    bool sharded = false;
    for (size_t i = 0; i < placements.size(); ++i) {
      sharded = sharded || (is_shard(placements[i], k) && sizes[i] > 1);
    }
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
  return fsdp_unshard(param, dp, true, loc);
}

DTensor fsdp_unshard(const DTensor& param, MeshDim dp, bool reshard_after_forward,
                     SourceLocation loc) {
  const UserCallSite site(loc);
  return gather_param(param, with_placement(param.placements(), param.mesh(), dp, Replicate{}),
                      reshard_after_forward, loc);
}

// ---- mixed precision (Note [Mixed precision])
// -----------------------------------------------------

namespace {

// `g` in `dtype` piece by piece: a gradient pending a sum (Partial) is converted on each rank and
// summed in `dtype` after, which is what reducing in reduce_dtype means (a cast of the summed
// value would round the sum in the narrower dtype first). Through the pieces, so the debug checks
// do not hold it against that cast.
DTensor pieces_to(const DTensor& g, DType dtype) {
  if (g.dtype() == dtype) return g;
  const bool pending = std::any_of(g.placements().begin(), g.placements().end(),
                                   [](const Placement& p) { return is_partial(p); });
  if (!pending || !g.participates()) return to(g, dtype);
  return DTensor::from_local(g.local().to(dtype), g.mesh(), g.placements(), g.shape());
}

struct CastRedistribute {
  Placements input_placements;
  DType input_dtype;
  std::optional<DType> reduce_dtype;
};

void cast_redistribute_backward(BackwardContext& c) {
  const auto& how = c.payload<CastRedistribute>();
  const NoGradGuard no_grad;
  DTensor g = c.grad().as<DTensor>();
  if (how.reduce_dtype) g = pieces_to(g, *how.reduce_dtype);
  // A Partial gradient is reduced to the input's placement; a Partial input takes it pending.
  Placements target = how.input_placements;
  for (size_t i = 0; i < target.size(); ++i) {
    if (is_partial(target[i]) && !is_partial(g.placements()[i])) target[i] = Replicate{};
  }
  g = g.redistribute(target);
  if (g.dtype() != how.input_dtype) g = to(g, how.input_dtype);
  c.set_grad(0, dtensor_var(g));
}

// A parameter cast to the policy's param_dtype for its gather. Its backward receives the gradient
// with its sum over dp pending (gather_param) and reduces it here, in reduce_dtype, to the
// parameter's placements, then casts it to the parameter's dtype: the reduction never sees
// param_dtype's rounding when reduce_dtype is wider. Under no_sync, and in the synced backward
// after it, it hands the gradient on unreduced: the leaf's pending sum takes it and reduces the
// total once, in the leaf's dtype (Note [No sync] in dtensor/dtensor.h).
struct CastParam {
  Placements placements;
  DType dtype;
  std::optional<DType> reduce_dtype;
  std::weak_ptr<AutogradMeta> leaf;  // the parameter's autograd state (its pending sum)
};

void cast_param_backward(BackwardContext& c) {
  const auto& how = c.payload<CastParam>();
  const NoGradGuard no_grad;
  DTensor g = c.grad().as<DTensor>();
  // A leaf with a pending sum reduces it with this gradient, once, in its own dtype.
  const std::shared_ptr<AutogradMeta> meta = how.leaf.lock();
  const auto* leaf = dynamic_cast<const DTensorAutogradMeta*>(meta.get());
  const bool pending = leaf != nullptr && leaf->pending_grad.defined();
  // FSDP2 makes the reduced gradient, and its cast to the parameter's dtype, on its
  // reduce-scatter stream (Note [Allocation streams] in tensor/meta.h).
  std::optional<MetaStreamScope> stream;
  if (requires_gradient_sync() && !pending) {
    if (how.reduce_dtype) g = pieces_to(g, *how.reduce_dtype);
    Placements target = how.placements;
    for (Placement& p : target) {
      if (is_partial(p)) p = Replicate{};
    }
    if (scatters_pending_sum(g.placements(), target)) stream.emplace(MetaStream::reduce_scatter);
    g = g.redistribute(target);
  }
  c.set_grad(0, dtensor_var(pieces_to(g, how.dtype)));
}

// `amax` (defined for a float8 dtype): the scale's (Note [Float8 all-gather]).
DTensor cast_param(const DTensor& param, DType dtype, std::optional<DType> reduce_dtype,
                   const DTensor& amax = {}) {
  DTensor out;
  {
    const NoGradGuard no_grad;
    if (is_float8(dtype)) {
      out = float8_cast(dtensor_var(param), dtensor_var(amax), dtype).value<DTensor>();
    } else {
      out = dtype != param.dtype() ? to(param, dtype) : param.detach();
    }
  }
  const Var in = dtensor_var(param);
  if (!grad_enabled() || !any_requires_grad({&in, 1}) || !is_floating(param.dtype())) return out;
  return record("cast_param", nullptr, {&in, 1}, {}, dtensor_var(out), cast_param_backward,
                std::make_shared<const CastParam>(
                    CastParam{param.placements(), param.dtype(), reduce_dtype, param.autograd()}))
      .value<DTensor>();
}

// `w` in the policy's param_dtype (a weight already in it, or no param_dtype: as it is).
DTensor in_param_dtype(const DTensor& w, const MixedPrecisionPolicy& policy) {
  if (!w.defined() || !policy.param_dtype || w.dtype() == *policy.param_dtype) return w;
  return to(w, *policy.param_dtype);
}

DTensor in_output_dtype(const DTensor& y, const MixedPrecisionPolicy& policy) {
  if (!policy.output_dtype || y.dtype() == *policy.output_dtype) return y;
  return to(y, *policy.output_dtype);
}

void check_float(std::optional<DType> dtype, const char* field, std::string_view op) {
  if (dtype && !is_floating(*dtype)) {
    throw_error<Unsupported>("{}: MixedPrecisionPolicy.{} must be a float dtype, got {}", op, field,
                             dtype_name(*dtype));
  }
}

void check_policy(const MixedPrecisionPolicy& policy, std::string_view op) {
  check_float(policy.param_dtype, "param_dtype", op);
  check_float(policy.reduce_dtype, "reduce_dtype", op);
  check_float(policy.output_dtype, "output_dtype", op);
}

}  // namespace

DTensor cast_redistribute(const DTensor& x, std::optional<DType> dtype,
                          const Placements& placements, std::optional<DType> reduce_dtype,
                          SourceLocation loc) {
  const UserCallSite site(loc);
  if (!x.defined()) throw_error<PlacementError>("cast_redistribute: the DTensor is undefined");
  check_float(dtype, "param_dtype", "cast_redistribute");
  check_float(reduce_dtype, "reduce_dtype", "cast_redistribute");
  DTensor out;
  {
    const NoGradGuard no_grad;
    out = dtype && *dtype != x.dtype() ? to(x, *dtype) : x.detach();
    out = out.redistribute(placements);
  }
  const Var in = dtensor_var(x);
  if (!grad_enabled() || !any_requires_grad({&in, 1}) || !is_floating(x.dtype())) return out;
  auto how = std::make_shared<const CastRedistribute>(
      CastRedistribute{x.placements(), x.dtype(), reduce_dtype});
  return record("cast_redistribute", nullptr, {&in, 1}, {}, dtensor_var(out),
                cast_redistribute_backward, std::move(how))
      .value<DTensor>();
}

DTensor fsdp_unshard(const DTensor& param, MeshDim dp, const MixedPrecisionPolicy& policy,
                     SourceLocation loc) {
  return fsdp_unshard(param, dp, policy, true, loc);
}

DTensor fsdp_unshard(const DTensor& param, MeshDim dp, const MixedPrecisionPolicy& policy,
                     bool reshard_after_forward, SourceLocation loc) {
  const UserCallSite site(loc);
  check_policy(policy, "fsdp_unshard");
  if (!param.defined()) throw_error<PlacementError>("fsdp_unshard: the parameter is undefined");
  // The gather leaves the gradient's sum over dp pending (Note [No sync]); cast_param reduces it
  // in reduce_dtype. A default policy is the plain fsdp_unshard (the reduction at the leaf).
  const DType dtype = policy.param_dtype.value_or(param.dtype());
  const DTensor cast = dtype != param.dtype() || policy.reduce_dtype
                           ? cast_param(param, dtype, policy.reduce_dtype)
                           : param;
  return gather_param(cast, with_placement(param.placements(), param.mesh(), dp, Replicate{}),
                      reshard_after_forward, loc);
}

std::vector<DTensor> float8_amaxes(std::span<const DTensor* const> params, SourceLocation loc) {
  const UserCallSite site(loc);
  const NoGradGuard no_grad;
  // Each amax is pending a max over the mesh dims that split its parameter.
  std::vector<DTensor> pending;
  for (size_t i = 0; i < params.size(); ++i) {
    const DTensor* p = params[i];
    if (p == nullptr || !p->defined()) {
      throw_error<PlacementError>("float8_amaxes: parameter {} of {} is undefined", i,
                                  params.size());
    }
    if (!is_floating(p->dtype()) || is_float8(p->dtype())) {
      throw_error<Unsupported>(
          "float8_amaxes: parameter {} is {} {} on mesh {}; FP8 training casts f32, f64, bf16 or "
          "f16 weights",
          i, shape_str(p->shape()), p->dtype(), p->mesh().to_string());
    }
    pending.push_back(float8_amax(dtensor_var(*p)).value<DTensor>());
  }
  // Those with the same mesh and placements reduce together: their local amaxes stacked, one
  // all_reduce, the entries taken out.
  std::vector<DTensor> out(params.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    if (out[i].defined()) continue;
    const DTensor& first = pending[i];
    const Placements replicated = replicate_placements(first.mesh());
    std::vector<size_t> group;
    for (size_t j = i; j < pending.size(); ++j) {
      if (!out[j].defined() && pending[j].mesh() == first.mesh() &&
          pending[j].placements() == first.placements()) {
        group.push_back(j);
      }
    }
    if (group.size() == 1 || !first.participates()) {
      for (size_t j : group) out[j] = pending[j].redistribute(replicated);
      continue;
    }
    std::vector<LocalTensor> locals;
    for (size_t j : group) locals.push_back(pending[j].local());
    const DTensor stacked = DTensor::from_local(stack(locals), first.mesh(), first.placements(),
                                                Shape{static_cast<int64_t>(group.size())})
                                .redistribute(replicated);
    for (size_t k = 0; k < group.size(); ++k) {
      out[group[k]] = select(stacked, 0, static_cast<int64_t>(k));
    }
  }
  return out;
}

Float8Weight fsdp_unshard_float8(const DTensor& param, MeshDim dp, const DTensor& amax,
                                 const MixedPrecisionPolicy& policy, bool reshard_after_forward,
                                 SourceLocation loc) {
  const UserCallSite site(loc);
  check_policy(policy, "fsdp_unshard_float8");
  if (!param.defined()) {
    throw_error<PlacementError>("fsdp_unshard_float8: the parameter is undefined");
  }
  if (!is_floating(param.dtype()) || is_float8(param.dtype())) {
    throw_error<Unsupported>(
        "fsdp_unshard_float8: the parameter is {} {} on mesh {}; FP8 training casts f32, f64, bf16 "
        "or f16 weights",
        shape_str(param.shape()), param.dtype(), param.mesh().to_string());
  }
  const DTensor* one[] = {&param};
  const DTensor scale_amax = amax.defined() ? amax : float8_amaxes(one, loc).front();
  const bool replicated =
      std::all_of(scale_amax.placements().begin(), scale_amax.placements().end(),
                  [](const Placement& p) { return is_replicate(p); });
  if (!scale_amax.shape().empty() || scale_amax.dtype() != DType::F32 || !replicated ||
      !(scale_amax.mesh() == param.mesh())) {
    throw_error<Unsupported>(
        "fsdp_unshard_float8: the amax must be a 0-d f32 DTensor replicated on the parameter's "
        "mesh {} (float8_amaxes), got {} {} {} on mesh {} (parameter {})",
        param.mesh().to_string(), shape_str(scale_amax.shape()), scale_amax.dtype(),
        to_string(scale_amax.placements()), scale_amax.mesh().to_string(),
        shape_str(param.shape()));
  }
  const DTensor cast = cast_param(param, DType::F8E4M3FN, policy.reduce_dtype, scale_amax);
  return {gather_param(cast, with_placement(param.placements(), param.mesh(), dp, Replicate{}),
                       reshard_after_forward, loc),
          scale_amax};
}

DTensor colwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       const MixedPrecisionPolicy& policy, SourceLocation loc) {
  const UserCallSite site(loc);
  check_policy(policy, "colwise_linear");
  const DTensor input =
      cast_redistribute(x, std::nullopt, with_placement(x.placements(), x.mesh(), tp, Replicate{}),
                        policy.reduce_dtype, loc);
  const DTensor y = matmul(input, in_param_dtype(w, policy));
  return in_output_dtype(bias.defined() ? y + in_param_dtype(bias, policy) : y, policy);
}

DTensor rowwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       Placement output, const MixedPrecisionPolicy& policy, SourceLocation loc) {
  const UserCallSite site(loc);
  check_policy(policy, "rowwise_linear");
  const DTensor partial = matmul(x, in_param_dtype(w, policy));
  const DTensor y =
      partial.redistribute(with_placement(partial.placements(), partial.mesh(), tp, output));
  return in_output_dtype(bias.defined() ? y + in_param_dtype(bias, policy) : y, policy);
}

}  // namespace spmd
