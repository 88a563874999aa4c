// spmd/dtensor/dtensor.cpp: DTensor construction (distribute_tensor, from_local), full_tensor,
// redistribute and printing.
#include <spmd/dtensor/dtensor.h>

#include <map>
#include <optional>
#include <ostream>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/typed.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/dtensor/dispatch.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

Tensor identity_reference(std::span<const Tensor> inputs, const OpArgs&) {
  return inputs[0];
}

// The entries op observers see for what is not a table op: they name the event and run nothing
// (no meta, compute or strategies).
// DTensor::redistribute: the value does not change.
const OpDef kRedistributeOp{
    .name = "redistribute",
    .meta = nullptr,
    .compute = nullptr,
    .strategies = nullptr,
    .reference = identity_reference,
};
// DTensor::from_local (no DTensor inputs, no reference).
const OpDef kFromLocalOp{
    .name = "from_local", .meta = nullptr, .compute = nullptr, .strategies = nullptr};
// When to_local's gradient arrives: the LocalTensor gradient laid out as grad_placements claim (no
// DTensor inputs), at the line of the to_local that made the claim.
const OpDef kToLocalGradOp{
    .name = "to_local", .meta = nullptr, .compute = nullptr, .strategies = nullptr};

const DTensor& dtensor_of(const Var& v) {
  return v.as<DTensor>();
}

// The placements a gradient arriving with `grad` placements takes for a value placed `value`
// (PyTorch's rule): a Partial of the value that the gradient does not share becomes Replicate.
// Empty `grad`: every Partial becomes Replicate (a leaf's gradient).
Placements grad_target(const Placements& value, const Placements& grad) {
  Placements out = value;
  for (size_t i = 0; i < out.size(); ++i) {
    if (is_partial(out[i]) && (grad.empty() || !is_partial(grad[i]))) out[i] = Replicate{};
  }
  return out;
}

// `grad_placements` of to_local/from_local, checked against the value's spec: the same shards
// (only Replicate and Partial may differ: the pieces must keep their shapes).
Placements normalized_grad_placements(const DTensorSpec& spec, const Placements& grad_placements,
                                      const char* op) {
  const DTensorSpec checked = spec.with_placements(grad_placements);
  for (size_t i = 0; i < checked.placements().size(); ++i) {
    const Placement& a = spec.placements()[i];
    const Placement& b = checked.placements()[i];
    if (is_shard(a) != is_shard(b) || (is_shard(a) && !(a == b))) {
      throw_error<PlacementError>(
          "DTensor::{}: grad_placements {} shard differently from placements {} on mesh dim {} "
          "(mesh {}); a gradient's pieces have the value's shapes, so only Replicate and Partial "
          "may differ",
          op, spmd::to_string(grad_placements), spmd::to_string(spec.placements()), i,
          spec.mesh().to_string());
    }
  }
  return checked.placements();
}

void redistribute_backward(BackwardContext& c) {
  const DTensor& g = dtensor_of(c.grad());
  const DTensor& in = dtensor_of(c.input(0));
  NoGradGuard no_grad;
  c.set_grad(0, dtensor_var(g.redistribute(grad_target(in.placements(), g.placements()))));
}

bool is_partial_sum(const Placement& p) {
  const Partial* partial = std::get_if<Partial>(&p);
  return partial != nullptr && partial->op == ReduceOp::Sum;
}

// gather_param's backward: the gradient laid out for the input (redistribute_backward's rule) with
// its P(sum) mesh dims kept, for the accumulation to reduce (Note [No sync]).
void gather_param_backward(BackwardContext& c) {
  const DTensor& g = dtensor_of(c.grad());
  const DTensor& in = dtensor_of(c.input(0));
  Placements target = grad_target(in.placements(), g.placements());
  for (size_t i = 0; i < target.size(); ++i) {
    if (is_partial_sum(g.placements()[i])) target[i] = g.placements()[i];
  }
  NoGradGuard no_grad;
  c.set_grad(0, dtensor_var(g.redistribute(target)));
}

// Where a leaf's gradient placed `grad` waits in its pending sum (Note [No sync]): as it came, so
// adding it moves no data, except that a Partial other than sum (no gradient's, but its sums
// would not add up) takes the leaf's placement.
Placements pending_placements(const Placements& value, const Placements& grad) {
  Placements out = grad;
  const Placements leaf = grad_target(value, {});
  for (size_t i = 0; i < out.size(); ++i) {
    if (is_partial(out[i]) && !is_partial_sum(out[i])) out[i] = leaf[i];
  }
  return out;
}

void full_tensor_backward(BackwardContext& c) {
  const DTensor& in = dtensor_of(c.input(0));
  const Placements replicate(in.placements().size(), Replicate{});
  const DTensor g = distribute_tensor(c.grad().tensor(), in.mesh(), replicate);
  c.set_grad(0, dtensor_var(g.redistribute(grad_target(in.placements(), replicate))));
}

void to_local_backward(BackwardContext& c) {
  const DTensor& in = dtensor_of(c.input(0));
  const auto& placements = c.payload<Placements>();
  const LocalTensor& g = c.grad().as<LocalTensor>();
  DTensor grad(g.detach(),
               std::make_shared<const DTensorSpec>(in.spec().with_placements(placements)));
  // The debug checks see grad_placements as a claim about pieces the local code computed, when
  // they arrive (the current call site is the to_local's line: Note [User call sites]).
  if (has_op_observers() && grad.participates()) {
    if (const SourceLocation* site = current_call_site()) {
      static const OpArgs kNoArgs;
      notify_op_observers(OpEvent{kToLocalGradOp.name, &kToLocalGradOp, kNoArgs, {}, grad, *site});
    }
  }
  c.set_grad(0, dtensor_var(grad));
}

// The gradient of the pieces: the DTensor's gradient laid out as grad_placements say, except that
// a Partial the gradient does not share stays Replicate (PyTorch's backward rule: the gradient of a
// Partial sum with respect to each piece is the whole gradient).
void from_local_backward(BackwardContext& c) {
  const DTensor& g = dtensor_of(c.grad());
  c.set_grad(
      0, local_var(g.redistribute(grad_target(c.payload<Placements>(), g.placements())).local()));
}

// Typed pieces (Note [SPMD types]) with explicit grad_placements: the gradient laid out exactly as
// they say, so an R piece whose grad_placements are Partial gets its share of a pending sum (R -> P
// partitions). Without them the default rule above applies.
void from_local_typed_backward(BackwardContext& c) {
  const DTensor& g = dtensor_of(c.grad());
  c.set_grad(0, local_var(g.redistribute(c.payload<Placements>()).local()));
}

uint64_t local_version(const LocalTensor& t) {
  uint64_t version = 0;
  for (const Tensor& shard : t.class_shards()) version += shard.storage()->version();
  return version;
}

const VarKind kDTensorKind{
    "DTensor",
    [](const OpDef& op, std::span<const Var> inputs, const OpArgs& args) {
      std::vector<const DTensor*> operands;
      operands.reserve(inputs.size());
      for (const Var& v : inputs) operands.push_back(&dtensor_of(v));
      return dtensor_var(dispatch(op, std::span<const DTensor* const>(operands), args));
    },
    [](const Var& leaf, const Var& grad) {
      const DTensor& value = dtensor_of(leaf);
      auto& meta = static_cast<DTensorAutogradMeta&>(*leaf.meta());
      DTensor g = dtensor_of(grad).detach();
      // Note [No sync]: without sync the P(sum) dims wait in the pending sum (in the leaf's
      // dtype); with sync a pending sum joins this gradient before the one reduction.
      if (!requires_gradient_sync() || meta.pending_grad.defined()) {
        if (g.dtype() != value.dtype()) g = to(g, value.dtype());
        DTensor& pending = meta.pending_grad;
        const DTensor part = g.redistribute(
            pending.defined() ? pending.placements()
                              : pending_placements(value.placements(), g.placements()));
        g = pending.defined() ? pending + part : part;
        pending = DTensor();
        if (!requires_gradient_sync()) {
          pending = g;
          return;
        }
      }
      // A leaf's gradient has the leaf's placements, a Partial becoming Replicate (a pending
      // sum of gradients, or a Partial(max) placement, is no gradient to step with).
      const Placements target = grad_target(value.placements(), {});
      // FSDP's reduction returns the gradient on its reduce-scatter stream.
      std::optional<MetaStreamScope> stream;
      if (scatters_pending_sum(g.placements(), target)) stream.emplace(MetaStream::reduce_scatter);
      DTensor placed = g.redistribute(target);
      if (placed.dtype() != value.dtype()) placed = to(placed, value.dtype());
      meta.dtensor_grad = meta.dtensor_grad.defined() ? meta.dtensor_grad + placed : placed;
    },
    [](const Var& v) { return local_version(dtensor_of(v).local()); },
    [](const Var& v) -> const Shape& { return dtensor_of(v).shape(); },
    [](const Var& v) { return dtensor_of(v).dtype(); },
    [](const Var& v) {
      const DTensor& t = dtensor_of(v);
      return fmt::format("{} {} {}", spmd::to_string(t.placements()), shape_str(t.shape()),
                         t.dtype());
    },
    nullptr,
    nullptr,
    nullptr,
    [](const Var& leaf) {
      auto& meta = static_cast<DTensorAutogradMeta&>(*leaf.meta());
      meta.dtensor_grad = DTensor();
      meta.pending_grad = DTensor();
    },
    [](const Var& v) {
      const DTensor& t = dtensor_of(v);
      const Var local = local_kind().shape_stub(local_var(t.local()));
      return dtensor_var(DTensor(local.as<LocalTensor>(), t.spec_ptr()));
    }};

thread_local bool t_gradient_sync = true;

bool outside_mesh(const DTensorSpec& spec) {
  return spec.rank_info().ranks.empty();
}

}  // namespace

DTensor::DTensor(LocalTensor local, SpecPtr spec)
    : local_(std::move(local)), spec_(std::move(spec)) {
  if (spec_ == nullptr) throw_error<PlacementError>("DTensor: the spec is null");
  if (!local_.defined()) {
    throw_error<PlacementError>("DTensor: the LocalTensor is undefined (spec {})",
                                spec_->to_string());
  }
  // The pieces inside a DTensor are untyped: its placements say what they are (Note [SPMD types]).
  if (local_.spmd_types() != nullptr) [[unlikely]]
    local_ = std::move(local_).with_types(nullptr);
}

void DTensor::check_defined(const char* op) const {
  if (!spec_) throw_error<PlacementError>("DTensor::{}: the DTensor is undefined", op);
}

const LocalTensor& DTensor::local() const {
  check_defined("local");
  return local_;
}
const DeviceMesh& DTensor::mesh() const {
  check_defined("mesh");
  return spec_->mesh();
}
const Placements& DTensor::placements() const {
  check_defined("placements");
  return spec_->placements();
}
const Shape& DTensor::shape() const {
  check_defined("shape");
  return spec_->shape();
}
int64_t DTensor::size(int64_t d) const {
  return shape()[static_cast<size_t>(normalize_dim(d, dim(), "DTensor::size", shape()))];
}
int64_t DTensor::numel() const {
  return shape_numel(shape());
}
DType DTensor::dtype() const {
  check_defined("dtype");
  return spec_->dtype();
}
const DTensorSpec& DTensor::spec() const {
  check_defined("spec");
  return *spec_;
}
const SpecPtr& DTensor::spec_ptr() const {
  check_defined("spec_ptr");
  return spec_;
}

Tensor DTensor::full_tensor(SourceLocation loc) const {
  const UserCallSite site(loc);
  check_defined("full_tensor");
  // Note [Ranks outside the mesh]: an empty tensor, as in PyTorch.
  if (!participates()) return empty({0}, dtype(), local_.shard_at(0).device());
  notify_value("full_tensor", *this, loc);
  Tensor full = local_.shard_at(0);
  if (!spec_->is_replicated()) {
    NoGradGuard no_grad;
    full = redistribute(Placements(spec_->placements().size(), Replicate{})).local_.shard_at(0);
  }
  if (!grad_enabled() || !requires_grad() || !is_floating(dtype())) return full;
  const Var in = dtensor_var(*this);
  return record("full_tensor", nullptr, {&in, 1}, {}, Var(full), full_tensor_backward)
      .value<Tensor>();
}

DTensor DTensor::redistribute(const Placements& placements, SourceLocation loc) const {
  return redistribute(placements, default_redistribute_planner(), loc);
}

DTensor DTensor::redistribute(const Placements& placements, RedistributePlanner planner,
                              SourceLocation loc) const {
  const UserCallSite site(loc);
  check_defined("redistribute");
  // Observers see every call, one that moves nothing too: whether a redistribution moves data
  // can depend on the mesh (a dim of size 1), and a parity run matches calls by their count at
  // each line (Note [Parity run] in debug/parity.h).
  auto observed = [&](const DTensor& out) {
    if (has_op_observers() && out.participates()) {
      const DTensor* input = this;
      static const OpArgs kNoArgs;
      notify_op_observers(OpEvent{kRedistributeOp.name, &kRedistributeOp, kNoArgs,
                                  std::span<const DTensor* const>(&input, 1), out,
                                  user_site_or(loc), nested_call(loc)});
    }
    return out;
  };
  if (placements == spec_->placements()) return observed(*this);
  DTensorSpec target = spec_->with_placements(placements, "DTensor::redistribute");
  if (target == *spec_) return observed(*this);
  DTensor out;
  if (!participates()) {
    create_plan_communicators(*cached_redistribute_plan(*spec_, target, planner));
    auto spec = std::make_shared<const DTensorSpec>(std::move(target));
    LocalTensor empty_pieces = outside_mesh_local(*spec);
    out = DTensor(std::move(empty_pieces), std::move(spec));
  } else {
    auto plan = cached_redistribute_plan(*spec_, target, planner);
    out = DTensor(execute_redistribute(local_, *spec_, *plan),
                  std::make_shared<const DTensorSpec>(std::move(target)));
  }
  if (grad_enabled() && requires_grad() && is_floating(dtype())) {
    const Var in = dtensor_var(*this);
    out = record("redistribute", nullptr, {&in, 1}, {}, dtensor_var(out), redistribute_backward,
                 nullptr, kSavesNone)
              .value<DTensor>();
  }
  return observed(out);
}

namespace {

// Note [SPMD types] (world/spmd_types.h) at from_local: the placement of each mesh dim claims a
// type of the pieces along it (Shard: V, Replicate: R or I, Partial: P, or V read as P), and when
// the pieces take part in autograd, grad_placements must hand back the gradient their type has (an
// R piece's gradient is pending a sum, P; an I piece's is reduced, R).
void check_from_local_types(const LocalTensor& local, const DeviceMesh& mesh,
                            const Placements& placements,
                            const std::optional<Placements>& grad_placements,
                            const SourceLocation& loc) {
  if (!types_active()) return;
  const UserCallSite site(loc);
  const uint64_t from = local.spmd_types()->world;
  if (from != 0 && from != mesh.world().state().id) {
    throw_error<TypeError>(
        "DTensor::from_local: the LocalTensor comes from world #{}, the mesh {} from {}: a DTensor "
        "holds the pieces of its own world",
        from, mesh.to_string(), mesh.world().to_string());
  }
  const bool grads = grad_enabled() && local.requires_grad();
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (mesh.size(i) == 1) continue;  // one rank: nothing to be identical, distinct or pending
    const std::string axis = mesh.dim_name(i);
    const AxisType& got = local.spmd_types()->of(axis);
    const Placement& p = placements[static_cast<size_t>(i)];
    const std::string claim = to_string(p);
    auto fail = [&](std::string_view why) {
      throw_error<TypeError>(
          "DTensor::from_local: along mesh axis '{}' the LocalTensor is {}, but placement {} "
          "claims {}",
          axis, describe(got), claim, why);
    };
    switch (got.type) {
      case SpmdType::V:
        if (std::holds_alternative<Replicate>(p)) {
          fail(
              "identical pieces, and its pieces differ per rank (all_gather or all_reduce them "
              "first)");
        }
        break;
      case SpmdType::P:
        if (std::holds_alternative<Replicate>(p)) {
          fail(
              "identical pieces, and its pieces are terms of a pending sum (to_local + "
              "from_local on a Partial: keep Partial, or all_reduce first)");
        }
        if (std::holds_alternative<Shard>(p)) {
          fail(
              "distinct pieces, and its pieces are terms of a pending sum (reduce_scatter it "
              "first)");
        }
        break;
      case SpmdType::R:
      case SpmdType::I:
        if (std::holds_alternative<Shard>(p)) {
          fail(
              "distinct pieces, and its pieces are identical along the axis (the global tensor "
              "would repeat them)");
        }
        if (std::holds_alternative<Partial>(p)) {
          fail(
              "terms of a sum, and its pieces are identical along the axis (the sum would count "
              "them once per rank)");
        }
        if (grads) {
          const Placement& gp = grad_placements ? (*grad_placements)[static_cast<size_t>(i)] : p;
          if (got.type == SpmdType::R && !std::holds_alternative<Partial>(gp)) {
            throw_error<TypeError>(
                "DTensor::from_local: along mesh axis '{}' the LocalTensor is {}: its gradient "
                "must stay Partial (R's gradient is P, reduced once where the value became R), but "
                "grad_placements {} hand it back reduced, so the backward all-reduces it here "
                "too; pass grad_placements with Partial on '{}'",
                axis, describe(got), to_string(gp), axis);
          }
          if (got.type == SpmdType::I && !std::holds_alternative<Replicate>(gp)) {
            throw_error<TypeError>(
                "DTensor::from_local: along mesh axis '{}' the LocalTensor is {}: its gradient "
                "must be reduced (I's gradient is I), but grad_placements {} hand it back "
                "pending; pass grad_placements Replicate on '{}'",
                axis, describe(got), to_string(gp), axis);
          }
        }
        break;
    }
  }
  check_types_against_data(local, "DTensor::from_local", loc);
}

// The types of the pieces of `spec` from to_local at `loc`: Shard V, Partial P, Replicate R; but
// when to_local is recorded for autograd (`grad_placements` set), a Replicate whose gradient is
// claimed Replicate is I (the gradient must arrive identical on every rank: reduced), and one whose
// gradient is claimed Partial is R (each rank's gradient is its term of a pending sum).
TypesPtr to_local_types(const DTensorSpec& spec, const Placements* grad_placements,
                        const SourceLocation& loc) {
  auto types = std::make_shared<SpmdTypes>();
  types->rest = AxisType{"", SpmdType::R, "to_local", loc, nullptr, nullptr};
  const DeviceMesh& mesh = spec.mesh();
  types->world = mesh.world().state().id;
  types->axis_names = mesh.world().axis_names();
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = spec.placements()[static_cast<size_t>(i)];
    SpmdType t = std::holds_alternative<Shard>(p)     ? SpmdType::V
                 : std::holds_alternative<Partial>(p) ? SpmdType::P
                                                      : SpmdType::R;
    // Over a mesh dim of one rank nothing can differ between ranks: no claim to check.
    if (t == SpmdType::R && grad_placements != nullptr && mesh.size(i) > 1 &&
        is_replicate((*grad_placements)[static_cast<size_t>(i)])) {
      t = SpmdType::I;
    }
    *types = types->with(axis_type(mesh, i, t, "to_local", loc));
  }
  return types;
}

}  // namespace

LocalTensor DTensor::to_local(std::optional<Placements> grad_placements, SourceLocation loc) const {
  const UserCallSite site(loc);
  check_defined("to_local");
  const bool recorded = grad_enabled() && requires_grad() && is_floating(dtype());
  std::shared_ptr<const Placements> placements;
  if (recorded) {
    placements = std::make_shared<const Placements>(
        grad_placements ? normalized_grad_placements(*spec_, *grad_placements, "to_local")
                        : spec_->placements());
  }
  LocalTensor typed = local_;
  if (types_active()) {
    typed = local_.with_types(to_local_types(*spec_, placements.get(), user_site_or(loc)));
  }
  if (!recorded) return typed;
  const Var in = dtensor_var(*this);
  return record("to_local", nullptr, {&in, 1}, {}, local_var(typed), to_local_backward,
                std::move(placements))
      .value<LocalTensor>();
}

std::string DTensor::to_string() const {
  if (!spec_) return "DTensor(undefined)";
  return fmt::format("DTensor({}, {} {}, {})\n{}", spmd::to_string(spec_->placements()),
                     shape_str(spec_->shape()), spec_->dtype(), spec_->mesh().to_string(),
                     local_.to_string());
}

std::ostream& operator<<(std::ostream& os, const DTensor& tensor) {
  return os << tensor.to_string();
}

// ---- distribute_tensor -------------------------------------------------------------------------

LocalTensor outside_mesh_local(const DTensorSpec& spec) {
  const World& world = spec.mesh().world();
  return LocalTensor::from_fn(world.held_ranks(), [&](int rank) {
    return empty({0}, spec.dtype(), meta_tensors() ? meta_device() : world.device_of(rank));
  });
}

bool DTensor::participates() const {
  check_defined("participates");
  return !outside_mesh(*spec_);
}

LocalTensor shape_only_local(const DTensorSpec& spec) {
  const DTensorSpec::RankInfo& info = spec.rank_info();
  std::vector<Tensor> shards;
  shards.reserve(info.class_shapes.size());
  for (const Shape& shape : info.class_shapes) {
    shards.push_back(empty(shape, spec.dtype(), meta_device()));
  }
  return LocalTensor(info.shared_ranks, std::move(shards), info.shape_classes);
}

DTensor dtensor_from_blocks(const char* op, SpecPtr spec,
                            const std::function<Tensor(const Shape&, const Shape&)>& block) {
  if (outside_mesh(*spec)) {
    LocalTensor empty_pieces = outside_mesh_local(*spec);
    return DTensor(std::move(empty_pieces), std::move(spec));
  }
  if (meta_tensors()) {
    LocalTensor local = shape_only_local(*spec);
    return DTensor(std::move(local), std::move(spec));
  }
  const DTensorSpec::RankInfo& info = spec->rank_info();
  const World& world = spec->mesh().world();
  std::map<std::vector<int64_t>, Tensor> pieces;
  std::vector<Tensor> shards;
  shards.reserve(info.ranks.size());
  for (size_t r = 0; r < info.ranks.size(); ++r) {
    const Shape& offset = info.local_offsets[r];
    const Shape& size = info.local_shapes[r];
    // The block, and on Partial mesh dims whether the partition keeps the value (group rank 0).
    std::vector<int64_t> key = offset;
    key.insert(key.end(), size.begin(), size.end());
    for (int i = 0; i < spec->mesh_ndim(); ++i) {
      if (is_partial(spec->placements()[static_cast<size_t>(i)])) {
        key.push_back(info.coordinates[r][static_cast<size_t>(i)] == 0);
      }
    }
    // Each rank's piece on its device (Note [NCCL device placement]), shared by the ranks there.
    const Device device = world.device_of(info.ranks[r]);
    key.push_back(device.is_cpu() ? -1 : device.index);
    auto it = pieces.find(key);
    if (it == pieces.end()) {
      Tensor piece = partition_local(block(offset, size).to(device), *spec, info.coordinates[r]);
      it = pieces.emplace(std::move(key), std::move(piece)).first;
    }
    shards.push_back(it->second);
  }
  return DTensor(LocalTensor(info.ranks, std::move(shards)), std::move(spec));
}

DTensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh,
                          const Placements& placements) {
  if (!global.defined()) {
    throw_error<PlacementError>("distribute_tensor: the tensor is undefined (placements {})",
                                to_string(placements));
  }
  auto spec = std::make_shared<const DTensorSpec>(mesh, placements, global.shape(), global.dtype(),
                                                  "distribute_tensor");
  if (global.is_meta()) {
    if (outside_mesh(*spec)) {
      LocalTensor empty_pieces = outside_mesh_local(*spec);
      return DTensor(std::move(empty_pieces), std::move(spec));
    }
    LocalTensor local = shape_only_local(*spec);
    return DTensor(std::move(local), std::move(spec));
  }
  return dtensor_from_blocks("distribute_tensor", std::move(spec),
                             [&](const Shape& offset, const Shape& size) {
                               Tensor view = global;
                               for (size_t d = 0; d < offset.size(); ++d) {
                                 if (size[d] != global.size(static_cast<int64_t>(d))) {
                                   view = view.narrow(static_cast<int64_t>(d), offset[d], size[d]);
                                 }
                               }
                               // A copy: the DTensor must not alias the caller's tensor.
                               return view.clone();
                             });
}

// ---- from_local --------------------------------------------------------------------------------

namespace {

std::string held_shapes(const LocalTensor& local) {
  std::string out;
  for (size_t i = 0; i < local.num_shards(); ++i) {
    out += fmt::format("{}rank {}: {}", i ? ", " : "", local.ranks()[i],
                       shape_str(local.shard_at(i).shape()));
  }
  return out;
}

// The global shape from the pieces' shapes (Note [Uneven sharding]), by collectives over the
// mesh so that every backend sees every rank's size: inner -> outer, each mesh dim sharding a
// tensor dim gathers the group's sizes, checks they are the torch.chunk split of their sum, and
// replaces the size by the sum. Then every rank must have found the same shape.
Shape infer_global_shape(const LocalTensor& local, const DeviceMesh& mesh,
                         const Placements& placements, const std::vector<int>& ranks) {
  const int64_t nd = local.dim();
  const std::vector<int64_t> mesh_shape = mesh.shape();
  // The sizes are values even in a dry run (Note [Shape-only tensors]).
  const MetaTensorsScope real_values(false);
  LocalTensor sizes = local.map([&](int, const Tensor& t) {
    std::vector<int64_t> s = t.shape();
    return from_vector(s, {1, nd});
  });
  for (int i = mesh.ndim() - 1; i >= 0; --i) {
    const Shard* shard = std::get_if<Shard>(&placements[static_cast<size_t>(i)]);
    const int64_t k = mesh_shape[static_cast<size_t>(i)];
    if (shard == nullptr || k == 1) continue;
    const int d = shard->dim;
    LocalTensor gathered = all_gather(sizes, mesh, i, 0);
    GroupFamily family = mesh.group_family(i);
    sizes = gathered.map([&](int rank, const Tensor& g) {
      std::vector<int64_t> all = g.to_vector<int64_t>();
      std::vector<int64_t> row(all.begin(), all.begin() + nd);
      std::vector<int64_t> split;
      int64_t total = 0;
      for (int64_t c = 0; c < k; ++c) {
        split.push_back(all[static_cast<size_t>(c * nd + d)]);
        total += split.back();
      }
      for (int64_t c = 0; c < k; ++c) {
        if (split[static_cast<size_t>(c)] != shard_size(total, k, c)) {
          std::vector<int64_t> expected;
          for (int64_t e = 0; e < k; ++e) expected.push_back(shard_size(total, k, e));
          auto where = family.locate(rank);
          throw_error<PlacementError>(
              "DTensor::from_local: the pieces of tensor dim {} over mesh dim {} ({}) do not "
              "follow torch.chunk sizes: group ranks {} hold {} rows, but {} rows split over {} "
              "ranks as {} (placements {}, mesh {}; held shapes {}). Pass pieces of those sizes, "
              "or give the global shape",
              d, i, mesh.dim_name(i),
              ranks_str(where ? family.group(where->group) : std::vector<int>{}), shape_str(split),
              total, k, shape_str(expected), spmd::to_string(placements), mesh.to_string(),
              held_shapes(local));
        }
      }
      row[static_cast<size_t>(d)] = total;
      return from_vector(row, {1, nd});
    });
  }
  // Every rank must have found the same shape: compare the mesh-wide max and min.
  LocalTensor high = sizes;
  LocalTensor low = sizes;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (mesh_shape[static_cast<size_t>(i)] == 1) continue;
    high = all_reduce(high, mesh, i, ReduceOp::Max);
    low = all_reduce(low, mesh, i, ReduceOp::Min);
  }
  const Tensor& first = high.shard_at(0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!equal(high.shard_at(r), low.shard_at(r)) || !equal(high.shard_at(r), first)) {
      throw_error<PlacementError>(
          "DTensor::from_local: the pieces do not form one global tensor: the global shape "
          "they imply differs between ranks (between {} and {} per dim; placements {}, mesh {}; "
          "held shapes {}). Dims that are not sharded must have the same size on every rank",
          shape_str(low.shard_at(r).to_vector<int64_t>()),
          shape_str(high.shard_at(r).to_vector<int64_t>()), spmd::to_string(placements),
          mesh.to_string(), held_shapes(local));
    }
  }
  return first.to_vector<int64_t>();
}

}  // namespace

DTensor DTensor::from_local(LocalTensor local, DeviceMesh mesh, Placements placements,
                            std::optional<Shape> global_shape,
                            std::optional<Placements> grad_placements, SourceLocation loc) {
  const UserCallSite site(loc);
  if (!local.defined()) {
    throw_error<PlacementError>("DTensor::from_local: the LocalTensor is undefined (mesh {})",
                                mesh.to_string());
  }
  if (global_shape) checked_numel(*global_shape, "DTensor::from_local");
  // The pieces' shape inference below runs untyped; the types are checked once the claim is
  // known to fit the pieces (a bad argument is reported as such whatever the types).
  const TypesPtr typed_as = local.spmd_types();
  if (typed_as != nullptr) local = local.with_types(nullptr);
  // Validates the placements against the pieces' dim count before anything else.
  DTensorSpec probe(mesh, placements, Shape(static_cast<size_t>(local.dim()), 0), local.dtype(),
                    "DTensor::from_local");
  if (outside_mesh(probe)) {
    // Note [Ranks outside the mesh]: no piece to take, no peer to ask for the global shape (the
    // even sharding of the local shape stands in when none is given).
    Shape shape = local.shard_at(0).shape();
    for (int i = 0; i < mesh.ndim(); ++i) {
      if (const auto* s = std::get_if<Shard>(&probe.placements()[static_cast<size_t>(i)]))
        shape[static_cast<size_t>(s->dim)] *= mesh.size(i);
      // The mesh's ranks infer the global shape over every dim (infer_global_shape).
      if (!global_shape && mesh.size(i) > 1) (void)communicator(mesh, i);
    }
    auto spec = std::make_shared<const DTensorSpec>(std::move(mesh), probe.placements(),
                                                    global_shape ? *global_shape : shape,
                                                    local.dtype(), "DTensor::from_local");
    LocalTensor empty_pieces = outside_mesh_local(*spec);
    return DTensor(std::move(empty_pieces), std::move(spec));
  }
  const std::vector<int>& ranks = probe.rank_info().ranks;
  if (local.ranks() != ranks) {
    throw_error<PlacementError>(
        "DTensor::from_local: the LocalTensor holds ranks {} but the held ranks of mesh {} are {}",
        ranks_str(local.ranks()), mesh.to_string(), ranks_str(ranks));
  }
  Shape shape =
      global_shape ? *global_shape : infer_global_shape(local, mesh, probe.placements(), ranks);
  if (global_shape && static_cast<int64_t>(shape.size()) != local.dim()) {
    throw_error<PlacementError>(
        "DTensor::from_local: global shape {} has {} dims but the pieces have {} (held shapes {})",
        shape_str(shape), shape.size(), local.dim(), held_shapes(local));
  }
  auto spec = std::make_shared<const DTensorSpec>(
      std::move(mesh), probe.placements(), std::move(shape), local.dtype(), "DTensor::from_local");
  const DTensorSpec::RankInfo& info = spec->rank_info();
  for (size_t r = 0; r < info.ranks.size(); ++r) {
    if (local.shard_at(r).shape() != info.local_shapes[r]) {
      throw_error<PlacementError>(
          "DTensor::from_local: rank {} holds a piece of shape {} but a global shape {} with "
          "placements {} on mesh {} gives it {} (held shapes {})",
          info.ranks[r], shape_str(local.shard_at(r).shape()), shape_str(spec->shape()),
          spmd::to_string(spec->placements()), spec->mesh().to_string(),
          shape_str(info.local_shapes[r]), held_shapes(local));
    }
  }
  if (typed_as != nullptr) {
    check_from_local_types(local.with_types(typed_as), spec->mesh(), spec->placements(),
                           grad_placements, user_site_or(loc));
  }
  DTensor out(local.detach(), std::move(spec));
  if (grad_enabled() && local.requires_grad() && is_floating(local.dtype())) {
    auto targets = std::make_shared<const Placements>(
        grad_placements ? normalized_grad_placements(out.spec(), *grad_placements, "from_local")
                        : out.placements());
    const Var in = local_var(typed_as != nullptr ? local.with_types(typed_as) : local);
    out = record("from_local", nullptr, {&in, 1}, {}, dtensor_var(out),
                 typed_as != nullptr && grad_placements ? from_local_typed_backward
                                                        : from_local_backward,
                 std::move(targets))
              .value<DTensor>();
  }
  // The debug checks see the claim (placements over pieces the user made): OpEvent with no inputs.
  if (has_op_observers() && out.participates()) {
    static const OpArgs kNoArgs;
    notify_op_observers(OpEvent{
        kFromLocalOp.name, &kFromLocalOp, kNoArgs, {}, out, user_site_or(loc), nested_call(loc)});
  }
  return out;
}

// ---- autograd ---------------------------------------------------------------------------------

DTensor& DTensor::requires_grad_(bool requires_grad) {
  check_defined("requires_grad_");
  if (requires_grad && !is_floating(dtype())) {
    throw_error<Unsupported>(
        "DTensor::requires_grad_: only floating DTensors can require gradients, this one is {} "
        "({} {} on {})",
        dtype(), spmd::to_string(placements()), shape_str(shape()), mesh().to_string());
  }
  if (autograd_ != nullptr && autograd_->grad_fn != nullptr) {
    throw_error<Error>(
        "DTensor::requires_grad_: this DTensor ({} {}) was made by recorded ops, so its gradient "
        "flows to their inputs; only leaves can be marked (call detach() for a new leaf)",
        spmd::to_string(placements()), shape_str(shape()));
  }
  if (autograd_ == nullptr) {
    if (!requires_grad) return *this;
    autograd_ = std::make_shared<DTensorAutogradMeta>();
  }
  autograd_->requires_grad = requires_grad;
  return *this;
}

bool DTensor::requires_grad() const {
  return autograd_ != nullptr && (autograd_->requires_grad || autograd_->grad_fn != nullptr);
}

DTensor DTensor::grad() const {
  auto* meta = dynamic_cast<DTensorAutogradMeta*>(autograd_.get());
  if (meta == nullptr) return DTensor();
  if (meta->pending_grad.defined()) {
    if (!requires_gradient_sync()) {
      throw_error<Error>(
          "DTensor::grad: this leaf ({} {}) has a gradient sum pending over {} inside no_sync; "
          "reading it there would reduce what no_sync defers (Note [No sync]): read it after a "
          "backward with sync, or read pending_grad()",
          spmd::to_string(placements()), shape_str(shape()),
          spmd::to_string(meta->pending_grad.placements()));
    }
    // Note [No sync]: the pending sum, reduced now and kept reduced.
    NoGradGuard no_grad;
    const DTensor reduced = meta->pending_grad.redistribute(grad_target(placements(), {}));
    meta->pending_grad = DTensor();
    meta->dtensor_grad = meta->dtensor_grad.defined() ? meta->dtensor_grad + reduced : reduced;
  }
  return meta->dtensor_grad;
}

DTensor DTensor::pending_grad() const {
  const auto* meta = dynamic_cast<const DTensorAutogradMeta*>(autograd_.get());
  return meta != nullptr ? meta->pending_grad : DTensor();
}

DTensor DTensor::detach() const {
  DTensor out = *this;
  out.autograd_ = nullptr;
  return out;
}

const VarKind& dtensor_kind() {
  return kDTensorKind;
}

Var dtensor_var(const DTensor& t) {
  return Var(&kDTensorKind, std::make_shared<const DTensor>(t.detach()), t.autograd());
}

void backward(const DTensor& loss, SourceLocation loc) {
  const UserCallSite site(loc);
  if (!loss.defined() || loss.numel() != 1) {
    throw_error<ShapeError>(
        "backward: the loss must be a DTensor of one element, got shape {} (pass an output "
        "gradient for other outputs)",
        loss.defined() ? shape_str(loss.shape()) : std::string("(undefined)"));
  }
  const DTensor one = distribute_tensor(ones(loss.shape(), loss.dtype()), loss.mesh(),
                                        Placements(loss.placements().size(), Replicate{}));
  run_backward(dtensor_var(loss), dtensor_var(one), loc);
}

void backward(const DTensor& output, const DTensor& grad, SourceLocation loc) {
  run_backward(dtensor_var(output), dtensor_var(grad), loc);
}

void zero_grad(const std::vector<DTensor*>& params) {
  for (DTensor* p : params) {
    if (p == nullptr) throw_error<Error>("zero_grad: a parameter pointer is null");
    if (auto* meta = dynamic_cast<DTensorAutogradMeta*>(p->autograd().get())) {
      meta->dtensor_grad = DTensor();
      meta->pending_grad = DTensor();
    }
  }
}

bool requires_gradient_sync() {
  return t_gradient_sync;
}

void set_requires_gradient_sync(bool sync) {
  t_gradient_sync = sync;
}

bool scatters_pending_sum(const Placements& from, const Placements& to) {
  const size_t n = std::min(from.size(), to.size());
  for (size_t i = 0; i < n; ++i) {
    if (is_partial(from[i]) && std::holds_alternative<Shard>(to[i])) return true;
  }
  return false;
}

DTensor gather_param(const DTensor& param, const Placements& placements, SourceLocation loc) {
  return gather_param(param, placements, true, loc);
}

DTensor gather_param(const DTensor& param, const Placements& placements, bool reshard_after_forward,
                     SourceLocation loc) {
  const UserCallSite site(loc);
  if (!grad_enabled() || !param.requires_grad() || !is_floating(param.dtype())) {
    return param.redistribute(placements, loc);
  }
  DTensor out;
  {
    NoGradGuard no_grad;
    out = param.redistribute(placements, loc);
  }
  if (out.spec() == param.spec()) return param;
  const Var in = dtensor_var(param);
  // The node keeps the gathered value only where FSDP would (Note [Regathered parameters]).
  const uint32_t saves = reshard_after_forward ? saves_inputs({0}) : kSavesAll;
  Var gathered = record("gather_param", nullptr, {&in, 1}, {}, dtensor_var(out),
                        gather_param_backward, nullptr, saves);
  if (reshard_after_forward && !recomputing()) {
    gathered.meta()->grad_fn->regather = [shard = param.detach(), placements, loc] {
      const NoGradGuard no_grad;
      return dtensor_var(shard.redistribute(placements, loc));
    };
  }
  return gathered.value<DTensor>();
}

namespace {

// Float8Options' rank-local mesh dims as float8_mm's bit mask (bit i: mesh dim i of x's mesh).
int64_t rank_local_mask(const DTensor& x, const Float8Options& options) {
  int64_t mask = 0;
  for (const MeshDim& dim : options.rank_local_dims) mask |= int64_t{1} << x.mesh().resolve(dim);
  return mask;
}

}  // namespace

DTensor float8_matmul(const DTensor& x, const DTensor& w, const Float8Options& options,
                      SourceLocation loc) {
  const UserCallSite site(loc);
  return float8_matmul(to_var(x), to_var(w), rank_local_mask(x, options)).value<DTensor>();
}

DTensor float8_matmul(const DTensor& x, const Float8Weight& w, const Float8Options& options,
                      SourceLocation loc) {
  const UserCallSite site(loc);
  if (!w.data.defined() || !w.amax.defined()) {
    throw_error<PlacementError>("float8_matmul: the Float8Weight's {} is undefined (x {})",
                                w.data.defined() ? "amax" : "data",
                                x.defined() ? shape_str(x.shape()) : "undefined");
  }
  return float8_matmul(to_var(x), to_var(w.data), to_var(w.amax), rank_local_mask(x, options))
      .value<DTensor>();
}

}  // namespace spmd
