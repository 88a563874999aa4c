// spmd/ops/autograd.h: reverse-mode differentiation of programs on Tensors, LocalTensors and
// DTensors: the tape, backward(), and the Var handle backward formulas are written against.
//
// Note [Autograd]
// Recording. An op-table entry run while grad mode is on (tensor/autograd_meta.h) with an input
// that requires grad appends a Node to the tape: the entry, its args, its inputs and output (as
// values without autograd state, so the tape holds no cycles), the storage versions of those
// values, and one edge per input: the node that made it, or the leaf that collects its gradient.
// The tape is the graph of nodes itself, reachable from the tensors they made; there is no global
// list, so rank threads (the threads backend) record independently, and under sim a DTensor op is
// recorded once for every rank.
// Backward. backward(out, grad) walks the nodes reachable from `out` in reverse topological order
// (Kahn's algorithm, in an order fixed by the graph, so every backend sums gradients in the same
// order), calls each entry's backward with the gradient of its output, and accumulates the leaves'
// gradients into their `grad()`. Backward runs with grad mode off; a node's saved values are
// released after it ran, so a second backward through the same nodes is an Error. A saved value
// written in place since it was saved (Storage::version) is an Error naming the op.
// Note [Uneven backward]
// A LocalTensor's shards may differ in shape per rank (an expert-parallel MoE after an uneven
// all_to_all_single); backward formulas are written once for every kind and ask for the shape of
// a value. Under threads and mpi each process holds one rank, so every shape is one shape. Under
// sim the engine runs such a table op's derivative once per class of ranks whose values have the
// same shapes (VarKind::per_shape_class), each on LocalTensors over those ranks, and joins the
// gradients: the same formulas, the same numbers as each rank computes under threads and mpi.
// Kinds. A Var is a Tensor, a LocalTensor or a DTensor; each kind tells the engine how to run an
// op on its values, attach a node to an output and accumulate into a leaf (VarKind). Backward
// formulas call table ops on Vars, so one formula serves every kind: on DTensors it runs with
// sharding propagation and the gradients get their placements by construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/ops/op.h>
#include <spmd/tensor/autograd_meta.h>

namespace spmd {

class Var;
struct Node;
class BackwardContext;
using BackwardFn = void (*)(BackwardContext& context);

// How one kind of value takes part in autograd (Tensor here; LocalTensor in sim/, DTensor in
// dtensor/).
struct VarKind {
  std::string_view name;
  // Runs `op` on values of this kind (without autograd state).
  Var (*call)(const OpDef& op, std::span<const Var> inputs, const OpArgs& args);
  // Adds `grad` into the gradient of `leaf` (a value that requires grad; its autograd state is
  // leaf.meta(), of the kind's own AutogradMeta type).
  void (*accumulate)(const Var& leaf, const Var& grad);
  // Sum of the storage versions of the value's buffers (Storage::version).
  uint64_t (*version)(const Var& value);
  // The (global) shape and the dtype.
  const Shape& (*shape)(const Var& value);
  DType (*dtype)(const Var& value);
  // "[4, 3] f32" or "S(0),R [8, 4] f32": the value in messages.
  std::string (*describe)(const Var& value);
  // Optional: `grad` (the gradient computed for `input`) with what the kind keeps beside the data
  // set for the input (a LocalTensor's SPMD types: the backward types of the input's,
  // world/spmd_types.h). Null: the gradient as computed.
  Var (*typed_grad)(const Var& input, const Var& grad) = nullptr;
  // Optional: whether `a` and `b` have the same shape everywhere (a LocalTensor: on every rank).
  // Null: shape(a) == shape(b).
  bool (*same_shape)(const Var& a, const Var& b) = nullptr;
  // Optional (Note [Uneven backward]): runs `fn`, the derivative of table-op node `node` with
  // output gradient `grad`, once per class of the values' parts that share their shapes (a
  // LocalTensor's ranks grouped by the shapes of the node's values on them), and sets `grads` to
  // the input gradients joined back. Returns false, running nothing, when every value already
  // has one shape (the engine then runs `fn` once).
  bool (*per_shape_class)(const Node& node, const Var& grad, BackwardFn fn,
                          std::vector<Var>& grads) = nullptr;
  // Drops the gradient accumulated into `leaf` (set_grad, Note [Gradient hooks]).
  void (*clear_grad)(const Var& leaf) = nullptr;
  // Optional (Note [Saved values]): a shape-only value like `value` (shape, dtype, placements,
  // shard classes, SPMD types) whose storages are uncounted meta storages. Called only under
  // --spmd-tensors=meta.
  Var (*shape_stub)(const Var& value) = nullptr;
};

// A differentiable value: a Tensor, LocalTensor or DTensor (kept without its autograd state), its
// kind, and its autograd state beside it, so detaching or attaching state copies no value.
class Var {
 public:
  Var() = default;
  Var(const Tensor& t);  // NOLINT: implicit by design
  // A value of another kind: `object` points at it (without autograd state).
  Var(const VarKind* kind, std::shared_ptr<const void> object, std::shared_ptr<AutogradMeta> meta);

  bool defined() const { return kind_ != nullptr; }
  const VarKind& kind() const;
  const std::shared_ptr<AutogradMeta>& meta() const { return meta_; }
  // The same value without autograd state, or with `meta`.
  Var detach() const;
  Var with_meta(std::shared_ptr<AutogradMeta> meta) const;

  // The Tensor of a Tensor-kind value, without autograd state (Error for another kind).
  const Tensor& tensor() const;
  // The value of another kind, without autograd state (the caller knows the kind).
  template <class T>
  const T& as() const {
    return *static_cast<const T*>(object_.get());
  }
  // The value as the user sees it: a copy of the handle with the autograd state attached.
  template <class T>
  T value() const {
    T out = [&] {
      if constexpr (std::is_same_v<T, Tensor>) {
        return tensor();
      } else {
        return as<T>();
      }
    }();
    out.set_autograd(meta_);
    return out;
  }

 private:
  const VarKind* kind_ = nullptr;
  Tensor tensor_;
  std::shared_ptr<const void> object_;
  std::shared_ptr<AutogradMeta> meta_;
};

// The Tensor kind.
const VarKind& tensor_kind();

// ---- the tape -------------------------------------------------------------------------------

// Where an input's gradient goes: the node that made it, or the leaf that collects it.
struct Edge {
  std::shared_ptr<Node> node;
  Var leaf;  // with its autograd state: accumulate() adds into it
};

struct Node {
  std::string_view name;
  const OpDef* op = nullptr;  // null for nodes that are not table ops (redistribute, ...)
  BackwardFn backward = nullptr;
  OpArgs args;
  std::vector<Var> inputs;              // without autograd state
  Var output;                           // without autograd state
  std::vector<uint64_t> versions;       // of inputs, then output, when saved
  std::vector<Edge> edges;              // one per input
  std::shared_ptr<const void> payload;  // what a non-table node's backward needs
  // The user's line that recorded the node (Note [User call sites]): backward reports it.
  SourceLocation site;
  bool has_site = false;
  bool released = false;
  // Note [Regathered parameters]: set on a node whose output can be made again in backward (an
  // FSDP gather); a later node that saves that output keeps a shape stub and marks the input in
  // `regathered`, and backward asks edges[i].node->regather for it.
  std::function<Var()> regather;
  std::vector<bool> regathered;  // per input; empty when none is regathered
};

// What a backward function sees and sets.
// Note [Partial backward]
// A backward can stop short of the whole graph: `only` names the leaves whose gradients it
// computes (the others, and every node that leads to none of them, are skipped: a formula sees
// needs_grad false for such an input), and `retain_graph` keeps the nodes' saved values for a
// later backward through the same nodes. A zero-bubble pipeline schedule splits a stage's backward
// so: first the input gradient (only = the stage's input, retained), later the weight gradients
// (only = the parameters), which walks the graph again: the same numbers, at the cost of the input
// gradients computed twice.
struct BackwardOptions {
  std::vector<Var> only;  // leaves (with their autograd state); empty: every leaf
  bool retain_graph = false;
};

class BackwardContext {
 public:
  BackwardContext(const Node& node, const Var& grad);
  // With the set of nodes that lead to a wanted leaf and the wanted leaves' state (Note [Partial
  // backward]); nulls: everything is wanted.
  BackwardContext(const Node& node, const Var& grad,
                  const std::unordered_set<const Node*>* wanted_nodes,
                  const std::vector<const AutogradMeta*>* wanted_leaves);

  const OpArgs& args() const { return node_.args; }
  size_t num_inputs() const { return node_.inputs.size(); }
  const Var& input(size_t i) const { return node_.inputs[i]; }
  const Var& output() const { return node_.output; }
  // The gradient of the output.
  const Var& grad() const { return grad_; }
  // Whether input i's gradient is used (it leads to a leaf that requires grad).
  bool needs_grad(size_t i) const;
  void set_grad(size_t i, Var grad);
  const Var& grad_of(size_t i) const { return grads_[i]; }
  template <class T>
  const T& payload() const {
    return *static_cast<const T*>(node_.payload.get());
  }
  std::string_view name() const { return node_.name; }

 private:
  const Node& node_;
  const Var& grad_;
  std::vector<Var> grads_;
  const std::unordered_set<const Node*>* wanted_nodes_ = nullptr;
  const std::vector<const AutogradMeta*>* wanted_leaves_ = nullptr;
};

// Whether any input takes part in autograd (requires grad or was made by recorded ops).
bool any_requires_grad(std::span<const Var> inputs);

// Note [Regathered parameters]
// FSDP frees a unit's gathered parameters after its forward and gathers them again before its
// backward (PyTorch's fully_shard, reshard_after_forward=True), so what autograd saved of a
// gathered parameter (a matmul's weight) costs no memory between the two. Here a node whose
// output can be made again sets Node::regather (gather_param, dtensor/dtensor.h); a node recorded
// later that saves that output keeps a shape stub of it instead (no storage) and the producing
// node; backward runs regather (the all_gather again, at the gather's line) just before the
// saving node's derivative, which then finds the value as it was, and releases it with the
// node's other saved values. The values are the same bits, so only memory and the collectives
// change: one all_gather more per saved parameter, in backward, as FSDP issues. Not while a
// checkpointed function runs again (recomputing()): its gathers already run in backward, and the
// saved value lives only until the recomputed part's backward, as under FSDP2 with activation
// checkpointing.

// Whether this thread is running a checkpointed function again, in backward (Note [Recompute]
// in nn/recompute.h): what runs then is recomputation, not the model's work (a dry run's MFU
// leaves it out), and it regathers nothing (Note [Regathered parameters]).
bool recomputing();
// Marks this thread as recomputing while it lives (nn/recompute.cpp; nests).
class RecomputingScope {
 public:
  RecomputingScope();
  ~RecomputingScope();
  RecomputingScope(const RecomputingScope&) = delete;
  RecomputingScope& operator=(const RecomputingScope&) = delete;
};

// Note [Saved values]
// A node keeps its inputs and output for its backward. In a real run it keeps them all (the
// in-place check reads their versions). In a dry run (--spmd-tensors=meta) it keeps only what its
// backward reads, as PyTorch's autograd saves only what each derivative needs: OpDef::saves for
// a table op, `saves` of record() for other nodes; the others are replaced by shape stubs
// (VarKind::shape_stub: the same shapes, uncounted storages), so a tensor the forward no longer
// uses is freed in the dry run's memory count when a real run would free it. A wrong declaration
// cannot change a result (a dry run has no values), only the memory a dry run reports.

// Records a node for `output` = op(inputs) and returns the output with it (as its grad_fn). The
// caller checked grad mode and any_requires_grad. `backward` overrides the op's (for nodes that
// are not table ops, `op` is null and `payload` carries what the backward needs; `saves` says
// which values their backward reads, Note [Saved values]).
Var record(std::string_view name, const OpDef* op, std::span<const Var> inputs, const OpArgs& args,
           const Var& output, BackwardFn backward = nullptr,
           std::shared_ptr<const void> payload = nullptr, uint32_t saves = kSavesAll);

// Reverse mode from `output` with output gradient `grad` (Note [Autograd]). Error when `output`
// takes no part in autograd. `loc` is the user's backward() call; each node's derivative runs at
// the user line that recorded it (reports say "in the backward of 'matmul' recorded at x.cpp:7").
void run_backward(const Var& output, const Var& grad,
                  SourceLocation loc = SourceLocation::current());
// The same, stopping short of the whole graph as `options` say (Note [Partial backward]).
void run_backward(const Var& output, const Var& grad, const BackwardOptions& options,
                  SourceLocation loc = SourceLocation::current());

// True while run_backward runs a derivative on this thread: LocalTensor ops there neither infer nor
// check SPMD types (each gradient gets its input's backward types instead, VarKind::typed_grad).
bool in_backward();

// backward(loss) of a scalar Tensor: d loss / d loss = 1.
void backward(const Tensor& loss, SourceLocation loc = SourceLocation::current());
// With an explicit output gradient of the output's shape.
void backward(const Tensor& output, const Tensor& grad,
              SourceLocation loc = SourceLocation::current());

// ---- a leaf's gradient: hooks and set_grad
// -------------------------------------------------------

// Note [Gradient hooks]
// register_hook(leaf, fn) (torch.Tensor.register_hook on a leaf): every gradient backward computes
// for the leaf goes through fn before it accumulates into leaf.grad(), in registration order, and
// what fn returns accumulates instead (the same shape; a DTensor's gradient arrives with the
// placements autograd computed, before they become the leaf's). Hooks see each backward's
// contribution, so a hook can clip, scale, log or reduce a gradient as it arrives (an
// expert-parallel gradient's reduction, FSDP's reduce-scatter written by hand). set_grad(leaf, g)
// replaces the accumulated gradient by g (torch's `p.grad = g`; a DTensor's g is redistributed to
// the leaf's placements), for gradients computed outside autograd: a chunked loss, a gradient
// received from another rank, a test. Both take a leaf that requires grad; anything else is a
// ConfigError naming the call, and a gradient of another shape or kind a ShapeError.
using GradHook = std::function<Var(const Var&)>;
struct GradHookList {
  std::vector<GradHook> hooks;
};
void add_grad_hook(const Var& leaf, GradHook hook, SourceLocation loc);
void set_leaf_grad(const Var& leaf, const Var& grad, SourceLocation loc);
// The gradient `grad` for `leaf` after its hooks (the engine calls this before accumulating).
Var run_grad_hooks(const Var& leaf, Var grad);

inline Var to_var(const Tensor& t) {
  return Var(t);
}
// On a Tensor, LocalTensor or DTensor leaf (to_var of each kind: here, world/local_ops.h,
// dtensor/dtensor.h).
template <class T>
void register_hook(T& leaf, std::function<T(const T&)> hook,
                   SourceLocation loc = SourceLocation::current()) {
  add_grad_hook(
      to_var(leaf), [hook = std::move(hook)](const Var& g) { return to_var(hook(g.value<T>())); },
      loc);
}
template <class T>
void set_grad(T& leaf, const T& grad, SourceLocation loc = SourceLocation::current()) {
  set_leaf_grad(to_var(leaf), to_var(grad), loc);
}

// ---- ops on Vars for backward formulas ----------------------------------------------------------

// `op` on values of one kind. Recorded on the tape when grad mode is on and an input takes part
// in autograd (so an op's composite form, OpDef::composite, is differentiated op by op); never
// inside a backward formula, which runs with grad mode off.
Var apply(const OpDef& op, std::span<const Var> inputs, const OpArgs& args = {});
Var apply(const OpDef& op, std::initializer_list<Var> inputs, const OpArgs& args = {});
Var operator+(const Var& a, const Var& b);
Var operator-(const Var& a, const Var& b);
Var operator*(const Var& a, const Var& b);
Var operator/(const Var& a, const Var& b);
Var operator*(const Var& a, double c);
Var operator-(const Var& a);
// `g` summed down to `shape` (the inverse of broadcasting `shape` to g's shape).
Var sum_to(const Var& g, const Shape& shape);
inline const Shape& var_shape(const Var& v) {
  return v.kind().shape(v);
}
inline DType var_dtype(const Var& v) {
  return v.kind().dtype(v);
}

}  // namespace spmd
