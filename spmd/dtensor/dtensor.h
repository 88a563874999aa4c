// spmd/dtensor/dtensor.h: DTensor, a global tensor laid out over a DeviceMesh: the LocalTensor of
// the pieces the held ranks own plus the DTensorSpec (mesh, placements, global shape, dtype).
//
//   DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
//   DTensor x = distribute_tensor(randn({8, 16}, 1), mesh, {Shard{0}, Replicate{}});
//   DTensor y = x.redistribute({Replicate{}, Shard{1}});   // planned, cached, then run
//   Tensor full = y.full_tensor();                          // the same on every rank
//   fmt::print("{}\n", visualize_sharding(y));              // debug/visualize.h
//
// Under sim the LocalTensor holds the piece of every rank of the mesh; under threads, mpi and
// nccl it holds the caller's rank. Everything here runs the same code on both: per-rank sizes
// and offsets come from the spec (dtensor/spec.h), data moves only through the functional
// collectives. Ops on DTensors (matmul, +, sum, softmax, ...) are in dtensor/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>

#include <spmd/dtensor/redistribute.h>
#include <spmd/dtensor/spec.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/placement.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

class DTensor {
 public:
  // An undefined DTensor; defined() is false.
  DTensor() = default;
  // The pieces `local` of a DTensor of `spec`, trusted as they are (from_local checks; ops and
  // redistribute use this). `local` must hold spec.rank_info().ranks.
  DTensor(LocalTensor local, SpecPtr spec);

  // A DTensor from each rank's piece. The global shape is inferred when not given: along a
  // sharded dim the pieces must follow torch.chunk sizes (Note [Uneven sharding]), otherwise a
  // PlacementError names the ranks and their shapes (pytorch/pytorch#144109 silently returned
  // wrong full tensors instead). A given global shape is checked against every held piece.
  // Inference and the consistency checks use small all_gather/all_reduce collectives of the
  // local sizes (so they also hold under mpi, where a process sees only its own piece).
  //
  // Under autograd (Note [Autograd] in ops/autograd.h) the result is recorded when `local` requires
  // grad: the gradient of the DTensor is redistributed to `grad_placements` (default:
  // `placements`) and its pieces become the LocalTensor's gradient. Say what the gradient really
  // is: a Replicate claim over values each rank computed alone usually needs a Partial gradient
  // (pytorch/pytorch#175867, torchtitan#2416).
  static DTensor from_local(LocalTensor local, DeviceMesh mesh, Placements placements,
                            std::optional<Shape> global_shape = {},
                            std::optional<Placements> grad_placements = {},
                            SourceLocation loc = SourceLocation::current());

  bool defined() const { return spec_ != nullptr; }
  // Whether a rank this process holds is in the mesh (Note [Ranks outside the mesh]).
  bool participates() const;
  // Each held rank's piece, as a new LocalTensor handle (cheap: it shares the shards; keep it in a
  // variable before binding references into its shards). Under autograd the result is recorded:
  // its gradient becomes this DTensor's gradient with `grad_placements` (default: this DTensor's
  // placements).
  LocalTensor to_local(std::optional<Placements> grad_placements = {},
                       SourceLocation loc = SourceLocation::current()) const;
  // Each held rank's piece, as stored (no copy, not recorded by autograd).
  const LocalTensor& local() const;
  // The global tensor, the same on every rank: redistributes to all-Replicate and returns a held
  // rank's copy. It may share storage with the DTensor's pieces; clone() before writing to it.
  // Recorded by autograd: the Tensor's gradient flows back to this DTensor.
  Tensor full_tensor(SourceLocation loc = SourceLocation::current()) const;
  // The same global tensor with other placements (same mesh). Plans are cached.
  DTensor redistribute(const Placements& placements,
                       SourceLocation loc = SourceLocation::current()) const;
  DTensor redistribute(const Placements& placements, RedistributePlanner planner,
                       SourceLocation loc = SourceLocation::current()) const;

  const DeviceMesh& mesh() const;
  const Placements& placements() const;
  // The global shape.
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  const DTensorSpec& spec() const;
  const SpecPtr& spec_ptr() const;

  // "DTensor(S(0),R, [8, 16] f32, DeviceMesh(...))" followed by the pieces.
  std::string to_string() const;

  // ---- autograd (Note [Autograd] in ops/autograd.h) -----------------------------------------
  // Makes this DTensor a leaf whose gradient backward() accumulates; floating dtypes only; Error
  // for one made by recorded ops. Returns *this.
  DTensor& requires_grad_(bool requires_grad = true);
  bool requires_grad() const;
  // The gradient accumulated into this leaf, with this DTensor's placements (a Partial placement's
  // gradient is Replicate); undefined when there is none. A sum that no_sync left pending is
  // reduced now and kept reduced (Note [No sync]): outside a no_sync guard this is a collective,
  // which every rank calls; inside one, with a sum pending, an Error.
  DTensor grad() const;
  // The sum of gradients no_sync left pending on this leaf, unreduced: Partial(sum) on the mesh
  // dims it still has to be reduced over (PyTorch's no_sync leaves such local sums in .grad);
  // undefined when nothing is pending. No communication.
  DTensor pending_grad() const;
  // The same DTensor without autograd state.
  DTensor detach() const;
  const std::shared_ptr<AutogradMeta>& autograd() const { return autograd_; }
  void set_autograd(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }

 private:
  void check_defined(const char* op) const;
  LocalTensor local_;
  SpecPtr spec_;
  std::shared_ptr<AutogradMeta> autograd_;
};

// A DTensor's autograd state: its gradient is a DTensor with the leaf's placements, and the
// gradients no_sync kept unreduced (Note [No sync]).
struct DTensorAutogradMeta : AutogradMeta {
  DTensor dtensor_grad;
  DTensor pending_grad;
};

// The DTensor kind of autograd values (Note [Autograd]): ops run through dispatch(), so gradients
// get their placements by sharding propagation.
const VarKind& dtensor_kind();
Var dtensor_var(const DTensor& t);
inline Var to_var(const DTensor& t) {
  return dtensor_var(t);
}

// backward(loss) of a DTensor of one element; or with an explicit output gradient (a DTensor of
// the output's shape, any placements).
void backward(const DTensor& loss, SourceLocation loc = SourceLocation::current());
void backward(const DTensor& output, const DTensor& grad,
              SourceLocation loc = SourceLocation::current());
// Drops the accumulated gradients of `params` (pending sums too).
void zero_grad(const std::vector<DTensor*>& params);

// Note [No sync]
// Gradient accumulation over microbatches without a reduction per microbatch (PyTorch's DDP
// no_sync, FSDP2's set_requires_gradient_sync(False)):
//
//   for (int m = 0; m < n - 1; ++m) {
//     const auto guard = no_sync();
//     backward(forward(microbatch(m)) / n);   // gradients stay pending: no reduction
//   }
//   backward(forward(microbatch(n - 1)) / n); // adds its gradient, reduces each total once
//   clip_grad_norm(params, 1.0); opt.step(); zero_grad(params);
//
// A gradient reaches a leaf with the placements autograd gave it; a dp-replicated weight's arrives
// P(sum) over dp (each rank's batch rows), and the leaf's accumulation redistributes it to the
// leaf's placements: an all_reduce (R) or a reduce_scatter (FSDP's S(k)). While a guard returned by
// no_sync() lives on this thread (set_requires_gradient_sync(false) until it is set true), the
// accumulation keeps the gradient as it arrives (P(sum) over dp, and over tp where the sequence
// was split; shards as they are) and adds it to the leaf's pending sum (pending_grad()): local
// adds, no communication. The first accumulation with sync on adds its gradient to the pending sum
// and redistributes the total to the leaf's placements: the collectives of one backward's
// reductions, once per step instead of once per microbatch. Sums are linear, so the result is the
// gradient of the summed losses (up to the order of floating additions). FSDP's gather
// (gather_param, used by fsdp_unshard) leaves its backward's P(sum) to the leaf for the same
// reason: the reduce_scatter runs in the leaf's accumulation, after the last microbatch. What is
// pending costs memory: a replicated weight's local sum, an FSDP weight's whole unsharded gradient
// per rank, as in PyTorch. grad() of a leaf with a pending sum reduces it then (outside a guard;
// inside one it refuses, as reading the gradient there means stepping on a partial sum); zero_grad
// drops it.
//
// Whether gradient reductions run on this thread (default true). Every rank sets it alike.
bool requires_gradient_sync();
// FSDP2's spelling: false keeps the gradients of later backwards pending until it is set true.
void set_requires_gradient_sync(bool sync);
// Turns gradient sync off for its lifetime (nestable), restoring the previous setting.
class [[nodiscard]] NoSyncGuard {
 public:
  NoSyncGuard() : previous_(requires_gradient_sync()) { set_requires_gradient_sync(false); }
  ~NoSyncGuard() { set_requires_gradient_sync(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  bool previous_;
};
// `const auto guard = no_sync();`: gradients accumulate unreduced while `guard` lives.
[[nodiscard]] inline NoSyncGuard no_sync() {
  return {};
}

// `param` redistributed to `placements` for its use in a forward (FSDP's gather: S(k) -> R over
// dp, fsdp_unshard in nn/parallel.h). The same as param.redistribute(placements), except that its
// backward hands the gradient on with its P(sum) mesh dims still pending, to be reduced where it
// is accumulated: a leaf reduces it to its placements once per backward, or once per step under
// no_sync (Note [No sync]). With reshard_after_forward (FSDP2's default), what autograd saves of
// the gathered value is gathered again in backward instead of kept (Note [Regathered
// parameters] in ops/autograd.h); without it the gathered value stays alive to the backward
// (FSDP2's root module).
DTensor gather_param(const DTensor& param, const Placements& placements,
                     SourceLocation loc = SourceLocation::current());
DTensor gather_param(const DTensor& param, const Placements& placements, bool reshard_after_forward,
                     SourceLocation loc = SourceLocation::current());

// Whether redistributing a gradient from `from` to `to` reduce-scatters a pending sum (Partial
// on a mesh dim where `to` is Shard): FSDP's gradient reduction, whose output a real run makes
// on FSDP2's reduce-scatter stream (Note [Allocation streams] in tensor/meta.h). The leaf's
// accumulation here and nn/'s fsdp_unshard open a MetaStreamScope for it.
bool scatters_pending_sum(const Placements& from, const Placements& to);

// A DTensor whose global value is `global`, on every rank (no communication: each rank takes its
// own piece, Note [Uneven sharding]; a Partial mesh dim holds the R -> P partition of
// Note [Redistribute steps]: sum divides by the mesh dim's size, avg/min/max keep the value).
// Ranks whose pieces coincide share one buffer (Note [Copy-on-write replicas]).
DTensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh,
                          const Placements& placements);

// Note [Ranks outside the mesh]
// A process whose ranks are all outside a DTensor's mesh (threads, mpi, nccl: a pipeline stage's
// mesh seen from another stage) holds an empty piece, as in PyTorch: distribute_tensor, from_local,
// the DTensor ops, redistribute and backward run there without computing or communicating, and
// give DTensors of the right spec whose pieces are empty tensors of shape [0]; full_tensor gives an
// empty tensor. Under sim every rank is held, so the DTensor holds the mesh's ranks' pieces and
// the others hold nothing. print_digest counts an empty piece as nothing held, so both agree.
LocalTensor outside_mesh_local(const DTensorSpec& spec);

// The pieces a shape-only DTensor of `spec` holds (Note [Shape-only tensors] in tensor/meta.h):
// one meta shard per class of ranks with the same local shape (Note [Shard classes]).
LocalTensor shape_only_local(const DTensorSpec& spec);

// A DTensor of `spec` (`op` names the caller in errors) from its global value given block by block:
// block(offset, size) returns that block of the global tensor (a fresh tensor or a view it may
// keep). Each held rank gets its block with the Partial partition applied; ranks with the same
// block and partition share one buffer. distribute_tensor and the random DTensors
// (dtensor/random.h) are built on it. Under --spmd-tensors=meta the blocks are never asked for:
// the DTensor is shape_only_local(spec) (random initialization is free).
DTensor dtensor_from_blocks(
    const char* op, SpecPtr spec,
    const std::function<Tensor(const Shape& offset, const Shape& size)>& block);

std::ostream& operator<<(std::ostream& os, const DTensor& tensor);

}  // namespace spmd

template <>
struct fmt::formatter<spmd::DTensor> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const spmd::DTensor& t, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", t.to_string());
  }
};
