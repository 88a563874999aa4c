// spmd/world/spmd_types.cpp: the SPMD type rules of table ops, the switch, assert_type, reinterpret
// and the data check.
#include <spmd/world/spmd_types.h>

#include <algorithm>
#include <atomic>

#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/compare.h>
#include <spmd/world/local_ops.h>

namespace spmd {

std::string_view to_string(SpmdType type) {
  switch (type) {
    case SpmdType::R:
      return "R";
    case SpmdType::I:
      return "I";
    case SpmdType::V:
      return "V";
    case SpmdType::P:
      return "P";
  }
  return "?";
}

SpmdType backward_type(SpmdType type) {
  switch (type) {
    case SpmdType::R:
      return SpmdType::P;
    case SpmdType::P:
      return SpmdType::R;
    default:
      return type;
  }
}

const AxisType& SpmdTypes::of(std::string_view axis) const {
  for (const AxisType& t : axes) {
    if (t.axis == axis) return t;
  }
  return rest;
}

SpmdTypes SpmdTypes::with(AxisType t) const {
  SpmdTypes out = *this;
  if (t.axis.empty()) {
    out.rest = std::move(t);
    return out;
  }
  auto it =
      std::lower_bound(out.axes.begin(), out.axes.end(), t.axis,
                       [](const AxisType& a, const std::string& name) { return a.axis < name; });
  if (it != out.axes.end() && it->axis == t.axis) {
    *it = std::move(t);
  } else {
    out.axes.insert(it, std::move(t));
  }
  return out;
}

std::string describe(const AxisType& t) {
  return fmt::format("{} ({} at {})", to_string(t.type), t.via, site_text(t.origin));
}

std::string SpmdTypes::to_string() const {
  std::string out;
  for (const AxisType& t : axes) out += fmt::format("{}={}, ", t.axis, describe(t));
  return out + fmt::format("{}={}", axes.empty() ? "every axis" : "other axes", describe(rest));
}

// ---- the switch
// -----------------------------------------------------------------------------------

namespace {
std::atomic<int> g_data{0};
}  // namespace

bool types_active() {
  return !in_backward();
}

void enable_types(bool data) {
  if (data) g_data.fetch_add(1, std::memory_order_relaxed);
}

void disable_types(bool data) {
  if (data) g_data.fetch_sub(1, std::memory_order_relaxed);
}

bool types_data_check() {
  return g_data.load(std::memory_order_relaxed) > 0;
}

TypesPtr uniform_types(SpmdType type, std::string_view via, const SourceLocation& loc,
                       const World& world) {
  if (!types_active()) return nullptr;
  auto out = std::make_shared<SpmdTypes>();
  out->rest = AxisType{"", type, via, loc, nullptr, nullptr};
  out->world = world.state().id;
  out->axis_names = world.axis_names();
  return out;
}

void check_axis_name(const SpmdTypes& types, std::string_view axis, std::string_view op) {
  if (axis.empty()) {
    throw_error<TypeError>("{}: an axis name is empty; axes are the mesh dim names ({})", op,
                           types.axis_names ? quoted_list(types.axis_names->names()) : "none yet");
  }
  if (types.axis_names == nullptr || types.axis_names->contains(axis)) return;
  const std::vector<std::string> known = types.axis_names->names();
  // The closest known name, for a typo: the fewest single-character edits.
  std::string_view nearest;
  size_t best = SIZE_MAX;
  for (const std::string& k : known) {
    std::vector<size_t> row(k.size() + 1);
    for (size_t j = 0; j <= k.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= axis.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= k.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (axis[i - 1] != k[j - 1])});
        diagonal = up;
      }
    }
    if (row[k.size()] < best) {
      best = row[k.size()];
      nearest = k;
    }
  }
  throw_error<TypeError>(
      "{}: '{}' is no mesh axis of this LocalTensor's world (world #{} has meshes with dims {}){}",
      op, axis, types.world, known.empty() ? std::string("none yet") : quoted_list(known),
      best <= 2 ? fmt::format("; did you mean '{}'?", nearest) : std::string());
}

const TypesPtr& constant_types() {
  static const TypesPtr kConstant = [] {
    auto t = std::make_shared<SpmdTypes>();
    t->rest =
        AxisType{"", SpmdType::R, "a Tensor operand", SourceLocation::current(), nullptr, nullptr};
    return TypesPtr(std::move(t));
  }();
  return kConstant;
}

TypesPtr backward_types(const TypesPtr& t, std::string_view via) {
  if (t == nullptr) return nullptr;
  auto out = std::make_shared<SpmdTypes>(*t);
  const SourceLocation* site = current_call_site();
  auto swap = [&](AxisType& a) {
    a.type = backward_type(a.type);
    a.via = via;
    if (site != nullptr) a.origin = *site;
  };
  swap(out->rest);
  for (AxisType& a : out->axes) swap(a);
  return out;
}

// ---- table ops ----------------------------------------------------------------------------------

namespace {

struct Operand {
  size_t index;  // 1-based position among the op's inputs
  const AxisType* type;
  bool constant;  // a plain Tensor operand (constant_types())
  bool grad;      // the operand takes part in autograd (its gradient is computed)
};

// An I operand whose gradient is not computed claims nothing about a gradient: it meets the other
// types as R does (identical shards).
bool invariant_claim(const Operand& o) {
  return o.type->type == SpmdType::I && o.grad;
}

std::string operand_text(const Operand& o) {
  return fmt::format("input {} is {}", o.index, describe(*o.type));
}

std::string axis_text(std::string_view axis) {
  return axis.empty() ? std::string("every axis") : fmt::format("mesh axis '{}'", axis);
}

// Why a PartialUse::Numerator op refuses a pending sum past its first input.
std::string numerator_only(const OpDef& op, std::string_view reduce) {
  return fmt::format("{} is linear in its first input only; {}", op.name, reduce);
}

[[noreturn]] void type_error(const OpDef& op, std::string_view axis, const Operand& first,
                             const Operand* second, std::string_view why) {
  // The inputs in their order in the call.
  const bool swap = second != nullptr && second->index < first.index;
  const Operand& a = swap ? *second : first;
  const Operand* b = swap ? &first : second;
  throw_error<TypeError>("{}: along {} {}{}: {}", op.name, axis_text(axis), operand_text(a),
                         b != nullptr ? fmt::format(" and {}", operand_text(*b)) : std::string(),
                         why);
}

// The output type along one axis (Note [SPMD types]); the operand whose origin it keeps.
const AxisType* combine(const OpDef& op, std::string_view axis, const std::vector<Operand>& in) {
  const Operand* p = nullptr;
  const Operand* i = nullptr;
  const Operand* v = nullptr;
  const Operand* r = nullptr;
  const Operand* quiet_i = nullptr;  // an I operand without a gradient (meets others as R)
  for (const Operand& o : in) {
    if (o.constant) continue;  // R to a Partial (below), neutral to the other types
    const Operand** slot = o.type->type == SpmdType::P   ? &p
                           : invariant_claim(o)          ? &i
                           : o.type->type == SpmdType::I ? &quiet_i
                           : o.type->type == SpmdType::V ? &v
                                                         : &r;
    if (*slot == nullptr) *slot = &o;
  }
  if (p != nullptr) {
    const std::string reduce =
        fmt::format("reduce the partial first (all_reduce or reduce_scatter over '{}')", axis);
    switch (op.partial_use) {
      case PartialUse::None:
        type_error(op, axis, *p, nullptr,
                   fmt::format("{} is not linear, so on the parts of a pending sum it does not "
                               "compute the op of the sum; {}",
                               op.name, reduce));
      case PartialUse::Unary:
        return p->type;
      case PartialUse::All:
        for (const Operand& o : in) {
          if (o.type->type == SpmdType::P) continue;
          type_error(op, axis, *p, &o,
                     o.type->type == SpmdType::R || o.type->type == SpmdType::I
                         ? fmt::format("a value identical on every rank would be added once per "
                                       "rank of the axis when the partial is summed; convert it "
                                       "to P or {}",
                                       reduce)
                         : fmt::format("a Partial only meets Partials in {}; {}", op.name, reduce));
        }
        return p->type;
      case PartialUse::One:
      case PartialUse::Numerator:
        for (const Operand& o : in) {
          if (&o == p) continue;
          if (op.partial_use == PartialUse::Numerator && p->index != 1) {
            type_error(op, axis, *p, nullptr, numerator_only(op, reduce));
          }
          if (o.type->type == SpmdType::P) {
            type_error(op, axis, *p, &o,
                       fmt::format("the product of two pending sums is not the sum of the "
                                   "products; {}",
                                   reduce));
          }
          if (o.type->type != SpmdType::R && !(o.type->type == SpmdType::I && !o.grad)) {
            type_error(op, axis, *p, &o,
                       fmt::format("a Partial is scaled only by Replicate values in {}; {}",
                                   op.name, reduce));
          }
        }
        if (op.partial_use == PartialUse::Numerator && p->index != 1) {
          type_error(op, axis, *p, nullptr, numerator_only(op, reduce));
        }
        return p->type;
    }
  }
  if (i != nullptr) {
    const Operand* other = v != nullptr ? v : r;
    if (other != nullptr) {
      if (i->type->via == "to_local") {
        type_error(op, axis, *i, other,
                   fmt::format("to_local at {} claims this value's gradient arrives identical on "
                               "every rank of '{}' (grad_placements Replicate), but it meets {} "
                               "here, so each rank's gradient is its own term of a sum over '{}': "
                               "pass grad_placements with Partial on '{}' to that to_local",
                               site_text(i->type->origin), axis,
                               other->type->type == SpmdType::V
                                   ? "a value that differs per rank"
                                   : "a value whose gradient is pending a sum (R)",
                               axis, axis));
      }
      type_error(op, axis, *i, other,
                 "an Invariant value (its gradient is not reduced) meets one whose gradient is "
                 "(R) or that differs per rank (V); convert one first: convert(x, {axis: R}) is "
                 "Megatron's f operator");
    }
    return i->type;
  }
  if (v != nullptr) return v->type;
  if (r != nullptr) return r->type;
  return quiet_i->type;
}

}  // namespace

namespace {

bool has_partial(const SpmdTypes& t) {
  if (t.rest.type == SpmdType::P) return true;
  return std::any_of(t.axes.begin(), t.axes.end(),
                     [](const AxisType& a) { return a.type == SpmdType::P; });
}

}  // namespace

TypesPtr spmd_type_rule(const OpDef& op, std::span<const TypesPtr> inputs,
                        std::span<const uint8_t> grads, const SourceLocation& loc) {
  const SpmdTypes* constant = constant_types().get();
  // The common case: every typed input is one value's types (a unary op, or x op x) without a
  // pending sum, which every op keeps as they are.
  const TypesPtr* only = nullptr;
  bool one = true;
  for (const TypesPtr& t : inputs) {
    if (t == nullptr || t.get() == constant) continue;
    if (only == nullptr) {
      only = &t;
    } else if (t != *only) {
      one = false;
      break;
    }
  }
  if (only == nullptr) return nullptr;
  if (one && !has_partial(**only)) return *only;
  const UserCallSite site(loc);
  // Values of two Worlds (two simulations in one process) never meet.
  const SpmdTypes* from = nullptr;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const SpmdTypes* t = inputs[k].get();
    if (t == nullptr || t->world == 0) continue;
    if (from == nullptr) {
      from = t;
    } else if (t->world != from->world) {
      throw_error<TypeError>(
          "{}: its LocalTensor inputs come from different Worlds (world #{} and world #{}): "
          "values of one simulation cannot meet another's",
          op.name, from->world, t->world);
    }
  }
  std::vector<std::string_view> axes;
  for (const TypesPtr& t : inputs) {
    if (t == nullptr) continue;
    for (const AxisType& a : t->axes) {
      if (std::find(axes.begin(), axes.end(), a.axis) == axes.end()) axes.push_back(a.axis);
    }
  }
  std::sort(axes.begin(), axes.end());
  std::vector<Operand> in;
  auto along = [&](std::string_view axis) {
    in.clear();
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k] != nullptr) {
        in.push_back(Operand{k + 1, &inputs[k]->of(axis), inputs[k].get() == constant,
                             k < grads.size() && grads[k] != 0});
      }
    }
    AxisType t = *combine(op, axis, in);
    // A value that changed type here (R meeting V gives V) got it at this line; one that kept the
    // type of all its inputs keeps where that came from.
    for (const Operand& o : in) {
      if (o.constant || o.type->type == t.type) continue;
      t.via = op.name;
      t.origin = loc;
      break;
    }
    return t;
  };
  auto out = std::make_shared<SpmdTypes>();
  if (from != nullptr) {
    out->world = from->world;
    out->axis_names = from->axis_names;
  }
  for (std::string_view axis : axes) {
    AxisType t = along(axis);
    t.axis = std::string(axis);
    out->axes.push_back(std::move(t));
  }
  // The axes no collective or to_local named: the gradient of replicate()'s R there is P, and no
  // reduction can name them, so they are never an error; a clash there makes them V.
  try {
    out->rest = along("");
  } catch (const TypeError&) {
    out->rest = AxisType{"", SpmdType::V, op.name, loc, nullptr, nullptr};
  }
  out->rest.axis.clear();
  return out;
}

// ---- the data check -----------------------------------------------------------------------------

// Note [Types against the data]
// Under sim every rank's shard is at hand, so a type can be checked, not only inferred: along an R
// or I axis the shards of each group are identical (bitwise; a replicated buffer is identical by
// construction). The check runs where a type is claimed rather than computed (assert_type,
// reinterpret, convert, map, from_local's input): ops and collectives compute their output types
// from checked inputs, so checking them again would find nothing. Axes whose groups are not known
// (the `rest` of replicate(), R by construction) are not checked. Under threads and mpi each rank
// holds its own shard; the type rules run there the same, the data check does not (it would need
// every shard: --spmd-debug=replicate checks DTensor Replicate pieces with internal gathers).
void check_types_against_data(const LocalTensor& t, std::string_view what,
                              const SourceLocation& loc) {
  if (!types_data_check() || t.spmd_types() == nullptr || t.is_replicated()) return;
  const UserCallSite site(loc);
  for (const AxisType& a : t.spmd_types()->axes) {
    if ((a.type != SpmdType::R && a.type != SpmdType::I) || a.groups == nullptr) continue;
    for (const std::vector<int>& group : *a.groups) {
      const Tensor* first = nullptr;
      int first_rank = -1;
      for (int rank : group) {
        if (!t.holds(rank)) continue;
        const Tensor& shard = t.shard(rank);
        if (first == nullptr) {
          first = &shard;
          first_rank = rank;
          continue;
        }
        if (shard.shape() == first->shape() && equal(shard, *first)) continue;
        throw_error<TypeError>(
            "{}: along mesh axis '{}' the type is {}, but ranks {} and {} of group {} hold "
            "different shards ({}; largest difference {}): the shards are not identical along "
            "the axis",
            what, a.axis, describe(a), first_rank, rank, ranks_str(group),
            shard.shape() == first->shape()
                ? fmt::format("shape {}", shape_str(shard.shape()))
                : fmt::format("shapes {} and {}", shape_str(first->shape()),
                              shape_str(shard.shape())),
            shard.shape() == first->shape() ? fmt::format("{}", max_abs_diff(shard, *first))
                                            : std::string("-"));
      }
    }
  }
}

// ---- assert_type, reinterpret -------------------------------------------------------------------

const LocalTensor& assert_type(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                               SourceLocation loc) {
  const UserCallSite site(loc);
  if (!types_active()) return t;
  if (t.spmd_types() == nullptr) {
    std::string expected;
    for (const auto& [axis, want] : types) {
      expected += fmt::format("{}{}={}", expected.empty() ? "" : ", ", axis, to_string(want));
    }
    throw_error<TypeError>(
        "assert_type: the LocalTensor is untyped (made without a world, or inside a DTensor); "
        "expected {}",
        expected);
  }
  for (const auto& [axis, want] : types) check_axis_name(*t.spmd_types(), axis, "assert_type");
  std::string wrong;
  for (const auto& [axis, want] : types) {
    const AxisType& got = t.spmd_types()->of(axis);
    if (got.type == want) continue;
    wrong += fmt::format("{}along mesh axis '{}' expected {} but it is {}",
                         wrong.empty() ? "" : "; ", axis, to_string(want), describe(got));
  }
  if (!wrong.empty()) throw_error<TypeError>("assert_type: {}", wrong);
  check_types_against_data(t, "assert_type", loc);
  return t;
}

namespace {

bool may_reinterpret(SpmdType from, SpmdType to) {
  if (from == to) return true;
  switch (to) {
    case SpmdType::V:
      return from == SpmdType::R || from == SpmdType::I;
    case SpmdType::P:
      return from == SpmdType::V;
    case SpmdType::R:
      return from == SpmdType::I;
    case SpmdType::I:
      return from == SpmdType::R;
  }
  return false;
}

// The gradient of reinterpret: the output's gradient relabelled with the input's backward types.
void reinterpret_backward(BackwardContext& c) {
  c.set_grad(0, c.grad());
}

}  // namespace

LocalTensor reinterpret(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                        SourceLocation loc) {
  const UserCallSite site(loc);
  if (!t.defined()) throw_error<Error>("reinterpret: the LocalTensor is undefined");
  if (!types_active() || t.spmd_types() == nullptr) return t;
  SpmdTypes out = *t.spmd_types();
  for (const auto& [axis, want] : types) {
    check_axis_name(out, axis, "reinterpret");
    const AxisType& got = out.of(axis);
    if (!may_reinterpret(got.type, want)) {
      throw_error<TypeError>(
          "reinterpret: along mesh axis '{}' {} cannot be relabelled {}: {}", axis, describe(got),
          to_string(want),
          got.type == SpmdType::P ? "a pending sum becomes a value only by summing it (all_reduce "
                                    "or reduce_scatter)"
          : want == SpmdType::R || want == SpmdType::I
              ? "varying shards become identical only by communicating (all_gather, all_reduce, "
                "broadcast)"
              : "use convert() to change the data");
    }
    AxisType next = got;
    next.axis = axis;
    next.type = want;
    next.via = "reinterpret";
    next.origin = loc;
    out = out.with(std::move(next));
  }
  LocalTensor result = t.detach().with_types(std::make_shared<const SpmdTypes>(std::move(out)));
  check_types_against_data(result, "reinterpret", loc);
  if (grad_enabled() && t.requires_grad() && is_floating(t.dtype())) {
    const Var in = local_var(t);
    result = record("reinterpret", nullptr, {&in, 1}, {}, local_var(result), reinterpret_backward)
                 .value<LocalTensor>();
  }
  return result;
}

}  // namespace spmd
