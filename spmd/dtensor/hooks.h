// spmd/dtensor/hooks.h: observers of every DTensor op, for debugging tools.
//
// Every op goes through dispatch() (dtensor/dispatch.h) and every redistribution through
// DTensor::redistribute; both report to the registered observers after computing their output.
// An observer sees the op's name, its static arguments, its input DTensors (as passed, before
// any redistribution), its output DTensor, and can recompute the op on full tensors: this is
// what --spmd-debug=check (compare with the single-device result) and NaN checks build on,
// without dtensor/ knowing about them. With no observer registered the cost is one relaxed
// atomic load per op.
//
//   int id = add_op_observer([](const OpEvent& e) {
//     std::vector<Tensor> full;
//     for (const DTensor* in : e.inputs) full.push_back(in->full_tensor());
//     if (!allclose(e.output.full_tensor(), e.reference(full))) report(e.op);
//   });
//   ...
//   remove_op_observer(id);
//
// Observers run on the thread that ran the op, in registration order; they may call DTensor
// ops themselves (those are not observed again while an observer runs on that thread).
#pragma once

#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dispatch.h>

namespace spmd {

struct OpEvent {
  std::string_view op;  // "add", "matmul", ..., "redistribute"
  // The op's entry. For "redistribute" only `reference` (the identity) is set.
  const OpDef* def;
  const OpArgs& args;
  std::span<const DTensor* const> inputs;
  // DTensor::from_local notifies with no inputs (op "from_local"): the output's placements are
  // the user's claim about pieces spmdsim did not compute. So does the backward of
  // DTensor::to_local (op "to_local") when the local code's gradient arrives: the output is that
  // gradient with the grad_placements the user claimed, and `location` the to_local's line.
  const DTensor& output;
  // The user's call site of the op (Note [User call sites]).
  const SourceLocation& location;
  // The op runs inside another public call (nested_call in core/call_site.h): a redistribution
  // inside an op, an op inside nn::moe or a derivative. The user's line made the outer call's
  // result, not this one.
  bool nested = false;
  // The op on full tensors (in inputs order): the single-device result.
  Tensor reference(std::span<const Tensor> full_inputs) const {
    return spmd::reference(*def, full_inputs, args);
  }
};

using OpObserver = std::function<void(const OpEvent&)>;

// Registers `observer`; returns an id for remove_op_observer.
int add_op_observer(OpObserver observer);
// Removes the observer with this id (no-op for an unknown id).
void remove_op_observer(int id);
// True when any observer is registered.
bool has_op_observers();
// Calls every observer with `event` (dispatch and redistribute do this).
void notify_op_observers(const OpEvent& event);

// A DTensor a public call hands the user or takes from them that no op event names, at the user's
// line `loc`: full_tensor's input ("full_tensor"), an optimizer step's gradient ("grad") and new
// value ("step") of each parameter. Observers see it as an event of op `what` whose def is
// value_event_def(), with `value` as output and no inputs; the value checks of --spmd-debug
// (check, replicate) skip it, parity compares it (Note [Parity run] in debug/parity.h).
void notify_value(std::string_view what, const DTensor& value, const SourceLocation& loc);
// The OpDef of notify_value's events (no meta, compute or reference).
const OpDef& value_event_def();

}  // namespace spmd
