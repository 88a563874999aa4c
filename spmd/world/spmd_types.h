// spmd/world/spmd_types.h: SPMD types of local code: one of R, I, V, P per mesh axis on every
// LocalTensor, inferred at every op, collective, to_local and from_local, and checked there.
//
// Note [SPMD types]
// Along one mesh axis a LocalTensor's shards are
//   R  Replicate  identical along the axis; its gradient is pending a sum (P)
//   I  Invariant  identical along the axis; its gradient is identical too (I)
//   V  Varying    different along the axis (a shard, a per-rank value); its gradient is V
//   P  Partial    pending a sum along the axis: the value meant is the sum of the shards; its
//                 gradient is R
// (spmd_types' local types; JAX's check_vma tracks V only). The backward type swaps R and P and
// keeps I and V: it decides each local collective's backward (all_gather V->R backward is
// reduce_scatter P->V, all_reduce P->R backward is all_reduce P->R, all_reduce V->I backward is the
// identity). docs/concepts.md, "SPMD types of local code", has the table of every rule and the test
// that checks it numerically.
// Types are always inferred and their rules always checked (a rule's TypeError is certain: the
// program computes a wrong value or a wrong gradient whatever the data); only derivatives run
// untyped (each gradient gets its input's backward types instead). The data check below is what
// --spmd-debug=types (or a TypesScope) turns on.
//   LocalTensor::from_fn(world, ...) is V on every axis, replicate/zeros/ones/full(world, ...) R;
//   a table op combines its inputs' types axis by axis (spmd_type_rule); the collectives
//   (collectives/typed.h), to_local and from_local (dtensor/dtensor.cpp) state theirs.
// An axis no collective or to_local named yet takes the type of `rest` (SpmdTypes); a clash there
// is not an error (the gradient of replicate()'s R is P on every axis, and no reduction can name
// the axes it never met), it makes the rest V.
// A LocalTensor keeps, per axis, where it got its type (the user's line and what gave it), so a
// TypeError names the axis, the types and the lines that made them. A LocalTensor made without a
// world (the rank-list forms, what DTensor holds inside) is untyped: nothing is inferred from it or
// checked on it. Axes are mesh dim names; a flattened dim ("dp_tp") is an axis of its own.
// Under sim, --spmd-debug=types also checks the types against the data where a type is claimed
// rather than computed (assert_type, reinterpret, convert, map, from_local): along an R or I axis
// the shards of each group must be identical (Note [Types against the data] in spmd_types.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/ops/op.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

enum class SpmdType : uint8_t { R, I, V, P };

// "R", "I", "V", "P".
std::string_view to_string(SpmdType type);
// The type of the gradient: R and P swap, I and V stay.
SpmdType backward_type(SpmdType type);

// The ranks of each group along one axis (DeviceMesh::groups of its dim).
using AxisGroups = std::vector<std::vector<int>>;

// One axis's type and where it came from.
struct AxisType {
  std::string axis;  // the mesh dim name; "" for every axis not named (SpmdTypes::rest)
  SpmdType type = SpmdType::V;
  std::string_view via;   // what gave it the type: "from_fn", "all_reduce", "to_local", ...
  SourceLocation origin;  // the user's line of that call
  // The groups along the axis, when known (a collective or to_local set the type) and the data
  // check is on: what the data check compares.
  std::shared_ptr<const AxisGroups> groups;
  // The DeviceMesh (collectives/) whose dim this axis is, when known: what convert() needs.
  std::shared_ptr<const void> mesh;
};

// The types of one LocalTensor: `axes` (sorted by name) and `rest` for every axis not named.
struct SpmdTypes {
  AxisType rest;
  std::vector<AxisType> axes;
  // The World the LocalTensor belongs to (World's id; 0 when not known: a plain Tensor operand) and
  // the mesh dim names built on it so far: the axes a type may name.
  uint64_t world = 0;
  std::shared_ptr<const AxisNames> axis_names;

  const AxisType& of(std::string_view axis) const;
  // A copy with `t` for its axis (rest when t.axis is empty).
  SpmdTypes with(AxisType t) const;
  // "tp=P (to_local at moe.cpp:40), rest=V (from_fn at moe.cpp:12)".
  std::string to_string() const;
};
using TypesPtr = std::shared_ptr<const SpmdTypes>;

// The type of `axis` with its origin, as messages print it: "P (to_local at moe.cpp:40)".
std::string describe(const AxisType& t);

// ---- the switch ---------------------------------------------------------------------------------

// Whether LocalTensor ops infer and check types on this thread now: always, except while a
// derivative runs (in_backward(), ops/autograd.h).
bool types_active();
// Turns the data check (Note [Types against the data]) on in the process while at least one enable
// with `data` is outstanding (set_debug counts the worlds with `types` that hold every rank).
void enable_types(bool data);
void disable_types(bool data);
// Whether the data check runs.
bool types_data_check();

// The data check on when `data`, for its lifetime: for tests and programs without launch().
class TypesScope {
 public:
  explicit TypesScope(bool data = true) : data_(data) { enable_types(data_); }
  ~TypesScope() { disable_types(data_); }
  TypesScope(const TypesScope&) = delete;
  TypesScope& operator=(const TypesScope&) = delete;

 private:
  bool data_;
};

// ---- inference and checks (the layers above call these) ---------------------------------------

// Types with `type` on every axis of `world`'s LocalTensors, from `via` at `loc`; null when types
// are not active.
TypesPtr uniform_types(SpmdType type, std::string_view via, const SourceLocation& loc,
                       const World& world);

// TypeError at the user's line when `axis` names no mesh dim of `types`' world (a typo reads as the
// type of every other axis), or is empty; `op` names the caller.
void check_axis_name(const SpmdTypes& types, std::string_view axis, std::string_view op);

// The output types of table op `op` on inputs of these types (null entries: untyped or plain
// Tensor operands, which constrain nothing); null when no input is typed. TypeError at the user's
// line when the inputs' types cannot meet in `op` along some axis (Note [SPMD types]). R and I
// differ only in their gradients: an I input whose gradient is not computed (grads[k] == 0: it
// takes no part in autograd, or grad mode is off) meets R and V as R does.
TypesPtr spmd_type_rule(const OpDef& op, std::span<const TypesPtr> inputs,
                        std::span<const uint8_t> grads, const SourceLocation& loc);

// The types of a plain Tensor operand of a LocalTensor op: a constant, the same on every rank and
// without a gradient. To a Partial it is R (P + c adds c once per rank: an error; P * c is P); it
// does not change the type of anything else.
const TypesPtr& constant_types();

// The data check (Note [Types against the data]): every R or I axis of `t` whose groups are known
// must hold identical shards in each group; TypeError naming `what`, the axis, the two ranks, the
// group and the largest difference. Does nothing unless types_data_check().
void check_types_against_data(const LocalTensor& t, std::string_view what,
                              const SourceLocation& loc);

// ---- the user's operations (API.md, "SPMD types") -----------------------------------------------

// TypeError at the caller's line when a named axis of `t` has another type (or `t` is untyped
// while types are on): the message names each axis, the type wanted, the type found and where it
// came from. Returns `t`. Under sim with the data check, the claimed R and I axes are checked
// against the data.
const LocalTensor& assert_type(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                               SourceLocation loc = SourceLocation::current());

// The same shards with these axes relabelled (no data change; spmd_types' reinterpret, JAX's
// pcast). Allowed: R or I to V (identical shards are a special case of varying ones), V to P (any
// shards can be read as terms of a sum), R to I and I to R (same data; the gradient's meaning
// changes: use convert for the f operator). Others are a TypeError (P to R needs an all_reduce).
// Under autograd the gradient is relabelled back (its backward types).
LocalTensor reinterpret(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                        SourceLocation loc = SourceLocation::current());

// convert(), which changes data and whose backward may communicate, is in collectives/typed.h.

// The types to put on the gradient of a LocalTensor of types `t` (R and P swapped).
// They came from `via` at the current user call site (the line whose backward runs), or where `t`'s
// did outside one.
TypesPtr backward_types(const TypesPtr& t, std::string_view via = "backward");

}  // namespace spmd
