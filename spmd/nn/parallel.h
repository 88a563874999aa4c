// spmd/nn/parallel.h: parallel styles as plain functions, for models that are structs of DTensor
// parameters (no module classes).
//
// Each style is two things: where a parameter lives (its placements, so that the mesh-invariant
// initializers of dtensor/random.h create it shard by shard) and what happens to the activations
// around its use (a few redistributions). The math in between is ordinary DTensor ops; autograd
// turns every redistribution into its transpose in the backward (docs/concepts.md, "Autograd").
//
//   tensor parallelism over `tp` (Megatron-LM; PyTorch's ColwiseParallel and RowwiseParallel):
//     h = colwise_linear(x, w1, b1, "tp");          // w1 [d, 4d] S(1): x Replicate -> h S(-1)
//     y = rowwise_linear(gelu(h), w2, b2, "tp",     // w2 [4d, d] S(0): partial sums reduced:
//                        Shard{1});                 //   Replicate (all_reduce) or, with
//                                                   //   sequence parallelism, S(seq)
//                                                   //   (reduce_scatter)
//   sequence parallelism (PyTorch's SequenceParallel): between the tensor-parallel regions the
//     activations (norms, dropout, residual adds) are sharded along the sequence over tp;
//     colwise_linear gathers them (all_gather) on the way in, rowwise_linear scatters on the way
//     out.
//   FSDP over `dp` (PyTorch's fully_shard): every parameter is stored sharded over dp as well
//     (fsdp_placements), gathered just before use (fsdp_unshard: all_gather), and its gradient,
//     arriving P(sum) over dp, is reduce-scattered back to the shard where it is accumulated.
//   gradient accumulation (no_sync in dtensor/dtensor.h, Note [No sync]): the dp reductions of
//     every parameter's gradient (all_reduce, FSDP's reduce_scatter) run once per step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/ops.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/placement.h>
#include <spmd/tensor/dtype.h>

namespace spmd {

// `p` on mesh dim `dim` of `mesh`, Replicate on the others.
Placements placed_on(const DeviceMesh& mesh, MeshDim dim, Placement p);
// `placements` with mesh dim `dim` of `mesh` replaced by `p`.
Placements with_placement(const Placements& placements, const DeviceMesh& mesh, MeshDim dim,
                          Placement p);

// `t` with `wanted`'s placement on each mesh dim of size 1 where t's differs: along a dim of one
// rank every placement holds the same piece, so this moves no data (a local redistribute; the
// gradient flows through). Layers that require a placement on a dim (context_attention's cp,
// moe's ep) call it first, so they also run with that dim of size 1: a mesh without it, the
// one-rank run of --spmd-debug=parity. Other dims are left as they are.
DTensor with_size_one_dims(const DTensor& t, const Placements& wanted,
                           SourceLocation loc = SourceLocation::current());

// LocalTensor::from_fn over the held ranks `mesh` holds (`held`, mesh.local_rank(d).ranks()): the
// world's form (typed: V on every axis) when they are all of the world's held ranks, else the rank
// list's (untyped): a layer in local code on a pipeline stage's mesh.
LocalTensor mesh_from_fn(const DeviceMesh& mesh, const std::vector<int>& held,
                         const std::function<Tensor(int rank)>& fn,
                         SourceLocation loc = SourceLocation::current());

// ---- where parameters live ----------------------------------------------------------------------

// A weight [in, out] used as x @ w, split by columns over tp (Shard(1)); its bias [out] (Shard(0)).
Placements colwise_placements(const DeviceMesh& mesh, MeshDim tp);
Placements colwise_bias_placements(const DeviceMesh& mesh, MeshDim tp);
// A weight [in, out] split by rows over tp (Shard(0)); also an embedding table [vocab, dim] split
// by vocabulary rows (Megatron's VocabParallelEmbedding: embedding() then gives P(sum)).
Placements rowwise_placements(const DeviceMesh& mesh, MeshDim tp);
// Replicate everywhere (a row-wise layer's bias, norm weights).
Placements replicate_placements(const DeviceMesh& mesh);
// `placements` of a parameter of `shape` with FSDP over dp added: its first dim that no placement
// shards is split over dp (uneven pieces allowed; a Shard over a mesh dim of size 1 leaves its dim
// free). `placements` must be Replicate on dp; a parameter with no free dim (every dim sharded
// already) stays Replicate on dp.
Placements fsdp_placements(const Placements& placements, const Shape& shape, const DeviceMesh& mesh,
                           MeshDim dp);

// ---- what happens around their use --------------------------------------------------------------

// x @ w (+ bias) with w column-wise over tp: x is made Replicate over tp first (sequence-parallel
// shards are gathered: all_gather), the result is sharded on its last dim over tp. An undefined
// bias is none.
DTensor colwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       SourceLocation loc = SourceLocation::current());
// x @ w (+ bias) with w row-wise over tp and x sharded on its last dim over tp (a column-wise
// output): each rank's partial sums are reduced to `output` over tp: Replicate{} (all_reduce) or
// Shard{seq} (reduce_scatter: sequence parallelism). The bias (Replicate) is added after.
DTensor rowwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       Placement output, SourceLocation loc = SourceLocation::current());
// Into the sequence-parallel layout: x sharded along `seq_dim` over tp (from Replicate: a local
// chunk; from P(sum): reduce_scatter).
DTensor sequence_parallel(const DTensor& x, MeshDim tp, int seq_dim,
                          SourceLocation loc = SourceLocation::current());
// The parameter gathered over dp for its use (all_gather, gather_param); recorded by autograd, so
// its gradient is reduce-scattered back to the FSDP shard: where the parameter's gradient is
// accumulated, once per backward, or once per step under no_sync (Note [No sync]). As FSDP2
// (fully_shard's reshard_after_forward=True), the gathered parameter is not kept from the forward
// to the backward: what autograd saves of it is gathered again in backward (Note [Regathered
// parameters] in ops/autograd.h). The overloads with reshard_after_forward = false keep it, as
// FSDP2 does for its root module (the embeddings, the final norm and the output layer: backward
// would gather them again at once).
DTensor fsdp_unshard(const DTensor& param, MeshDim dp,
                     SourceLocation loc = SourceLocation::current());
DTensor fsdp_unshard(const DTensor& param, MeshDim dp, bool reshard_after_forward,
                     SourceLocation loc = SourceLocation::current());

// ---- mixed precision
// ------------------------------------------------------------------------------

// Note [Mixed precision]
// What PyTorch's FSDP2 MixedPrecisionPolicy says, for the styles above. Parameters are stored in
// their own dtype (the master weights: F32, so the optimizer steps in F32) and:
//   param_dtype: the dtype they are used in. fsdp_unshard casts the shard before its all_gather
//     (the gather moves param_dtype bytes); the linears cast a weight that is not in it yet.
//   reduce_dtype: the dtype gradients are reduced in: the gradient arriving in param_dtype is cast
//     to reduce_dtype before the reduction, and the reduced gradient to the stored dtype after.
//     Under FSDP that is the reduce_scatter of fsdp_unshard's backward (the sharded gradient is
//     never rounded to param_dtype; under no_sync, and in the synced backward after it, the
//     leaf's pending sum is reduced once instead, in the stored dtype: Note [No sync] in
//     dtensor/dtensor.h); under tp the reduction of the input gradient of
//     colwise_linear (all_reduce, or reduce_scatter under sequence parallelism), which PyTorch's
//     policy leaves in the compute dtype (PyTorch #190626). The collectives' dtype in the trace is
//     reduce_dtype. A replicated parameter's dp reduction runs where its gradient accumulates, in
//     the stored dtype.
//   output_dtype: the dtype the linears' outputs are cast to (nullopt: as computed).
// Unset fields change nothing: a default policy computes exactly as the overloads without one.
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> output_dtype;
};

// x cast to `dtype` (nullopt: its own) and redistributed to `placements`, recorded by autograd as
// one step whose backward casts the gradient to `reduce_dtype` (nullopt: as it arrives),
// redistributes it to x's placements (a Partial gradient is reduced there, in reduce_dtype) and
// casts it to x's dtype. Recorded also when the forward moves nothing, so the reduction of the
// gradient happens here.
DTensor cast_redistribute(const DTensor& x, std::optional<DType> dtype,
                          const Placements& placements, std::optional<DType> reduce_dtype,
                          SourceLocation loc = SourceLocation::current());

// The styles under a policy (Note [Mixed precision]).
DTensor fsdp_unshard(const DTensor& param, MeshDim dp, const MixedPrecisionPolicy& policy,
                     SourceLocation loc = SourceLocation::current());
DTensor fsdp_unshard(const DTensor& param, MeshDim dp, const MixedPrecisionPolicy& policy,
                     bool reshard_after_forward, SourceLocation loc = SourceLocation::current());
DTensor colwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       const MixedPrecisionPolicy& policy,
                       SourceLocation loc = SourceLocation::current());
DTensor rowwise_linear(const DTensor& x, const DTensor& w, const DTensor& bias, MeshDim tp,
                       Placement output, const MixedPrecisionPolicy& policy,
                       SourceLocation loc = SourceLocation::current());

// ---- FP8 training: FSDP's float8 all-gather
// ------------------------------------------------------

// Note [Float8 all-gather]
// torchao's enable_fsdp_float8_all_gather, for the weights of float8_matmul (Note [Float8
// training] in ops/linalg.cpp). fsdp_unshard_float8(param, dp, amax) casts the parameter's shard
// to f8e4m3fn with the tensorwise scale of `amax`, the largest magnitude of the whole parameter,
// and gathers the float8 shards (an all_gather of 1 byte per element, half of bf16's): a
// Float8Weight that float8_matmul(x, w) uses as it is. The cast is elementwise and its scale
// global, so the gathered weight is exactly the cast float8_matmul makes of a gathered wider
// weight, and the results are the same to the bit; what changes is the bytes moved and held: the
// gathered weights, and what backward keeps of them or gathers again (reshard_after_forward), are
// 1 byte per element, and the cast runs on the shard (1/dp of the elements).
//   The amax: float8_amaxes(params) reduces every parameter's in one all_reduce max per mesh and
// placements (torchao's precompute_float8_dynamic_scale_for_fsdp, which torchtitan runs once per
// step, after the optimizer step); an undefined amax makes fsdp_unshard_float8 reduce the
// parameter's own (torchao without it: one all_reduce per parameter per gather).
//   Autograd: float8_mm gives the weight's gradient (x^T @ g) in x's dtype, and it stays there
// (a float8 value's gradient keeps the dtype it arrives in: the gradient is never float8). It
// reaches the cast with its sum over dp pending (gather_param), is reduced there to the shard in
// the policy's reduce_dtype (without one, in the dtype it arrives in) and cast to the parameter's
// dtype; under no_sync it waits in the leaf's pending sum (Note [No sync]). The cast passes the
// gradient straight through, as torchao's does.

// The global amaxes (0-d f32, Replicate) of `params` (floating, not float8), in the order given:
// one all_reduce max for all the parameters with the same mesh and placements.
std::vector<DTensor> float8_amaxes(std::span<const DTensor* const> params,
                                   SourceLocation loc = SourceLocation::current());
// The parameter cast to float8 with the scale of `amax` (its float8_amaxes entry; undefined: its
// own is reduced here) and gathered over dp, recorded by autograd as fsdp_unshard is (Note [Float8
// all-gather]; `policy` gives reduce_dtype, the dtype of the gradient's reduce-scatter).
Float8Weight fsdp_unshard_float8(const DTensor& param, MeshDim dp, const DTensor& amax,
                                 const MixedPrecisionPolicy& policy = {},
                                 bool reshard_after_forward = true,
                                 SourceLocation loc = SourceLocation::current());

}  // namespace spmd
