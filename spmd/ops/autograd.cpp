// spmd/ops/autograd.cpp: Var, the tape, the backward engine (Note [Autograd]), the Tensor kind,
// and the recorder the Tensor methods reach the tape through.
#include <spmd/ops/autograd.h>
#include <spmd/tensor/meta.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {

// ---- Var
// ------------------------------------------------------------------------------------------

Var::Var(const Tensor& t)
    : kind_(t.defined() ? &tensor_kind() : nullptr), tensor_(t.detach()), meta_(t.autograd()) {}

Var::Var(const VarKind* kind, std::shared_ptr<const void> object,
         std::shared_ptr<AutogradMeta> meta)
    : kind_(kind), object_(std::move(object)), meta_(std::move(meta)) {}

const VarKind& Var::kind() const {
  if (kind_ == nullptr) throw_error<Error>("autograd: an undefined value was used");
  return *kind_;
}

const Tensor& Var::tensor() const {
  if (kind_ != &tensor_kind()) {
    throw_error<Error>("autograd: a {} value was used as a Tensor", kind().name);
  }
  return tensor_;
}

Var Var::detach() const {
  return with_meta(nullptr);
}

Var Var::with_meta(std::shared_ptr<AutogradMeta> meta) const {
  Var out = *this;
  out.meta_ = std::move(meta);
  return out;
}

// ---- the Tensor kind
// ------------------------------------------------------------------------------

namespace {

std::vector<Tensor> tensors_of(std::span<const Var> vars) {
  std::vector<Tensor> out;
  out.reserve(vars.size());
  for (const Var& v : vars) out.push_back(v.tensor());
  return out;
}

const VarKind kTensorKind{
    "Tensor",
    [](const OpDef& op, std::span<const Var> inputs, const OpArgs& args) -> Var {
      return call(op, tensors_of(inputs), args);
    },
    [](const Var& leaf, const Var& grad) {
      AutogradMeta& meta = *leaf.meta();
      const Tensor g = grad.tensor().to(leaf.tensor().dtype());
      meta.grad = meta.grad.defined() ? meta.grad + g : g.detach();
    },
    [](const Var& v) -> uint64_t { return v.tensor().storage()->version(); },
    [](const Var& v) -> const Shape& { return v.tensor().shape(); },
    [](const Var& v) { return v.tensor().dtype(); },
    [](const Var& v) {
      return fmt::format("{} {}", shape_str(v.tensor().shape()), v.tensor().dtype());
    },
    nullptr,
    nullptr,
    nullptr,
    [](const Var& leaf) { leaf.meta()->grad = Tensor(); },
    [](const Var& v) { return Var(empty(v.tensor().shape(), v.tensor().dtype(), meta_device())); }};

}  // namespace

const VarKind& tensor_kind() {
  return kTensorKind;
}

// ---- recording
// ------------------------------------------------------------------------------------

bool any_requires_grad(std::span<const Var> inputs) {
  for (const Var& v : inputs) {
    if (!v.defined()) continue;
    const std::shared_ptr<AutogradMeta> meta = v.meta();
    if (meta != nullptr && (meta->requires_grad || meta->grad_fn != nullptr)) return true;
  }
  return false;
}

namespace {
// Note [Saved values]: `v` itself if its kind has no stub, else a shape stub of it.
Var shape_stub(const Var& v) {
  if (!v.defined() || v.kind().shape_stub == nullptr) return v;
  const MetaUncountedScope uncounted;
  return v.kind().shape_stub(v);
}
}  // namespace

Var record(std::string_view name, const OpDef* op, std::span<const Var> inputs, const OpArgs& args,
           const Var& output, BackwardFn backward, std::shared_ptr<const void> payload,
           uint32_t saves) {
  const uint32_t kept = op != nullptr ? op->saves : saves;
  const bool stubs = kept != kSavesAll && meta_tensors();
  auto node = std::make_shared<Node>();
  node->name = name;
  node->op = op;
  node->backward = backward;
  node->args = args;
  node->payload = std::move(payload);
  if (const SourceLocation* site = current_call_site()) {
    node->site = *site;
    node->has_site = true;
  }
  node->inputs.reserve(inputs.size());
  node->edges.reserve(inputs.size());
  node->versions.reserve(inputs.size() + 1);
  for (const Var& in : inputs) {
    Edge edge;
    if (in.defined()) {
      const std::shared_ptr<AutogradMeta> meta = in.meta();
      if (meta != nullptr && meta->grad_fn != nullptr) {
        edge.node = meta->grad_fn;
      } else if (meta != nullptr && meta->requires_grad) {
        edge.leaf = in;
      }
      node->versions.push_back(in.kind().version(in));
    } else {
      node->versions.push_back(0);
    }
    const size_t i = node->inputs.size();
    const bool saved = i >= 31 || (kept & (1u << i)) != 0;
    // Note [Regathered parameters]: a value the backward reads (the declaration, not whether this
    // run keeps it: real and dry runs issue the same gathers) that its node can make again is
    // kept as a recipe.
    if (saved && edge.node != nullptr && edge.node->regather) {
      node->regathered.resize(inputs.size());
      node->regathered[i] = true;
      node->inputs.push_back(shape_stub(in.detach()));
    } else {
      node->inputs.push_back(stubs && !saved ? shape_stub(in.detach()) : in.detach());
    }
    node->edges.push_back(std::move(edge));
  }
  node->output = stubs && (kept & kSaveOutput) == 0 ? shape_stub(output.detach()) : output.detach();
  node->versions.push_back(output.kind().version(output));
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  return output.with_meta(std::move(meta));
}

// ---- BackwardContext
// ------------------------------------------------------------------------------

BackwardContext::BackwardContext(const Node& node, const Var& grad)
    : node_(node), grad_(grad), grads_(node.inputs.size()) {}

BackwardContext::BackwardContext(const Node& node, const Var& grad,
                                 const std::unordered_set<const Node*>* wanted_nodes,
                                 const std::vector<const AutogradMeta*>* wanted_leaves)
    : node_(node),
      grad_(grad),
      grads_(node.inputs.size()),
      wanted_nodes_(wanted_nodes),
      wanted_leaves_(wanted_leaves) {}

bool BackwardContext::needs_grad(size_t i) const {
  const Edge& e = node_.edges[i];
  if (e.node != nullptr) return wanted_nodes_ == nullptr || wanted_nodes_->contains(e.node.get());
  if (!e.leaf.defined()) return false;
  return wanted_leaves_ == nullptr || std::find(wanted_leaves_->begin(), wanted_leaves_->end(),
                                                e.leaf.meta().get()) != wanted_leaves_->end();
}

void BackwardContext::set_grad(size_t i, Var grad) {
  grads_[i] = std::move(grad);
}

// ---- the engine
// -----------------------------------------------------------------------------------

namespace {

void check_versions(const Node& node) {
  for (size_t i = 0; i <= node.inputs.size(); ++i) {
    const Var& v = i < node.inputs.size() ? node.inputs[i] : node.output;
    if (!v.defined()) continue;
    if (v.kind().version(v) != node.versions[i]) {
      throw_error<Error>(
          "backward: {} {} of op '{}' ({}) was written in place (fill_ or copy_) after the op "
          "ran; its backward needs the value it saw",
          i < node.inputs.size() ? "input" : "the output",
          i < node.inputs.size() ? std::to_string(i) : std::string(), node.name,
          v.kind().describe(v));
    }
  }
}

// Note [Regathered parameters]: the saved values `node` kept as recipes, made again (the gather
// reported at its own line).
void regather_inputs(Node& node) {
  for (size_t i = 0; i < node.regathered.size(); ++i) {
    if (!node.regathered[i]) continue;
    const Node* from = node.edges[i].node.get();
    if (!from->regather) {
      throw_error<InternalError>(
          "backward of '{}': input {} was saved to be gathered again, but "
          "'{}' ran its backward first",
          node.name, i, from->name);
    }
    const CallSiteReset reset;
    std::optional<UserCallSite> site;
    if (from->has_site) site.emplace(from->site, "backward", from->name);
    node.inputs[i] = from->regather();
    node.versions[i] = node.inputs[i].kind().version(node.inputs[i]);
  }
  node.regathered.clear();
}

bool same_shape(const Var& a, const Var& b) {
  if (auto same = a.kind().same_shape) return same(a, b);
  return var_shape(a) == var_shape(b);
}

// `grad` cast to the dtype of `like` when they differ (a gradient has its value's dtype), except
// that a float8 value's gradient keeps the dtype it arrives in: FP8 training's weights gathered in
// float8 get their gradient in the compute dtype (torchao's float8 weights report their high
// precision dtype to autograd; Note [Float8 all-gather] in nn/parallel.h).
Var in_dtype_of(const Var& grad, const Var& like) {
  const DType want = var_dtype(like);
  if (var_dtype(grad) == want || is_float8(want)) return grad;
  return apply(op::to_dtype, {grad}, {{static_cast<int64_t>(want)}, {}});
}

}  // namespace

namespace {
thread_local int t_recomputing = 0;  // RecomputingScopes open on this thread
}  // namespace

bool recomputing() {
  return t_recomputing > 0;
}

RecomputingScope::RecomputingScope() {
  ++t_recomputing;
}

RecomputingScope::~RecomputingScope() {
  --t_recomputing;
}

namespace {
thread_local bool t_in_backward = false;

class InBackward {
 public:
  InBackward() : previous_(t_in_backward) { t_in_backward = true; }
  ~InBackward() { t_in_backward = previous_; }
  InBackward(const InBackward&) = delete;
  InBackward& operator=(const InBackward&) = delete;

 private:
  bool previous_;
};
}  // namespace

bool in_backward() {
  return t_in_backward;
}

void run_backward(const Var& output, const Var& grad, SourceLocation loc) {
  run_backward(output, grad, BackwardOptions{}, loc);
}

void run_backward(const Var& output, const Var& grad, const BackwardOptions& options,
                  SourceLocation loc) {
  const UserCallSite call(loc);
  const InBackward in_backward_scope;
  if (meta_tensors()) detail::note_backward_start();  // the dry run's activation term
  if (!output.defined()) throw_error<Error>("backward: the output is undefined");
  const std::shared_ptr<AutogradMeta> meta = output.meta();
  if (meta == nullptr || (!meta->requires_grad && meta->grad_fn == nullptr)) {
    throw_error<Error>(
        "backward: the output ({} {}) does not require grad: no recorded op links it to a value "
        "marked requires_grad_() (recorded ops run with grad mode on)",
        output.kind().name, output.kind().describe(output));
  }
  if (!grad.defined() || &grad.kind() != &output.kind() || !same_shape(grad, output)) {
    throw_error<ShapeError>(
        "backward: the output gradient ({}) must be a {} of the output's shape ({})",
        grad.defined() ? grad.kind().describe(grad) : "undefined", output.kind().name,
        output.kind().describe(output));
  }
  NoGradGuard no_grad;
  // Note [Partial backward]: the leaves wanted, by their autograd state (null: every leaf).
  std::vector<const AutogradMeta*> leaves;
  for (const Var& v : options.only) {
    if (v.defined() && v.meta() != nullptr) leaves.push_back(v.meta().get());
  }
  const std::vector<const AutogradMeta*>* wanted_leaves = options.only.empty() ? nullptr : &leaves;
  auto leaf_wanted = [&](const Edge& e) {
    return e.leaf.defined() &&
           (wanted_leaves == nullptr ||
            std::find(leaves.begin(), leaves.end(), e.leaf.meta().get()) != leaves.end());
  };
  if (meta->grad_fn == nullptr) {
    if (wanted_leaves == nullptr ||
        std::find(leaves.begin(), leaves.end(), meta.get()) != leaves.end()) {
      output.kind().accumulate(output, run_grad_hooks(output, grad));
    }
    return;
  }
  // The nodes reachable from the root, in an order where a node comes before those it leads to.
  Node* root = meta->grad_fn.get();
  std::vector<Node*> reachable;
  {
    std::unordered_set<Node*> seen{root};
    std::vector<Node*> stack{root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (n->released) {
        throw_error<Error>(
            "backward: op '{}' was already differentiated by an earlier backward(), which freed "
            "the values it saved; run the forward again for another backward (or keep them with "
            "BackwardOptions::retain_graph)",
            n->name);
      }
      reachable.push_back(n);
      for (const Edge& e : n->edges) {
        if (e.node != nullptr && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
    }
  }
  // The nodes that lead to a wanted leaf (all of them when every leaf is wanted): a node is
  // wanted when an edge of it reaches a wanted leaf or a wanted node. Iterated to a fixed point
  // over the reachable nodes (graphs here are small).
  std::unordered_set<const Node*> wanted;
  if (wanted_leaves == nullptr) {
    wanted.insert(reachable.begin(), reachable.end());
  } else {
    for (bool grew = true; grew;) {
      grew = false;
      for (const Node* n : reachable) {
        if (wanted.contains(n)) continue;
        for (const Edge& e : n->edges) {
          if (leaf_wanted(e) || (e.node != nullptr && wanted.contains(e.node.get()))) {
            wanted.insert(n);
            grew = true;
            break;
          }
        }
      }
    }
    if (!wanted.contains(root)) return;  // no wanted leaf takes part
  }
  // Consumers of each wanted node among the wanted nodes.
  std::unordered_map<Node*, int> pending;
  for (Node* n : reachable) {
    if (!wanted.contains(n)) continue;
    pending.emplace(n, 0);
  }
  for (Node* n : reachable) {
    if (!wanted.contains(n)) continue;
    for (const Edge& e : n->edges) {
      if (e.node != nullptr && wanted.contains(e.node.get())) ++pending[e.node.get()];
    }
  }
  std::unordered_map<Node*, Var> grads;
  grads.emplace(root, in_dtype_of(grad, output));
  std::vector<Node*> ready{root};
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    Var g;
    if (auto it = grads.find(n); it != grads.end()) {
      g = std::move(it->second);
      grads.erase(it);
    }
    BackwardContext ctx(*n, g, wanted_leaves == nullptr ? nullptr : &wanted, wanted_leaves);
    if (g.defined()) {
      // Reports from the derivative name the line of the op that recorded it.
      const CallSiteReset reset;
      std::optional<UserCallSite> site;
      if (n->has_site) site.emplace(n->site, "backward", n->name);
      regather_inputs(*n);
      check_versions(*n);
      BackwardFn fn =
          n->backward != nullptr ? n->backward : (n->op != nullptr ? n->op->backward : nullptr);
      if (fn == nullptr) {
        throw_error<Unsupported>("backward: op '{}' has no derivative (its inputs need one)",
                                 n->name);
      }
      // Note [Uneven backward]: a table op over values whose parts differ in shape.
      const VarKind& kind = n->output.kind();
      std::vector<Var> part_grads;
      if (n->op != nullptr && kind.per_shape_class != nullptr &&
          kind.per_shape_class(*n, g, fn, part_grads)) {
        for (size_t i = 0; i < part_grads.size(); ++i) ctx.set_grad(i, std::move(part_grads[i]));
      } else {
        fn(ctx);
      }
    }
    for (size_t i = 0; i < n->edges.size(); ++i) {
      const Edge& e = n->edges[i];
      if (!ctx.needs_grad(i)) continue;
      Var gi = ctx.grad_of(i);
      if (gi.defined()) {
        if (!same_shape(gi, n->inputs[i])) {
          throw_error<InternalError>(
              "backward of op '{}': the gradient of input {} is {}, the input {}", n->name, i,
              gi.kind().describe(gi), n->inputs[i].kind().describe(n->inputs[i]));
        }
        gi = in_dtype_of(gi, n->inputs[i]);
        if (auto typed = n->inputs[i].kind().typed_grad) gi = typed(n->inputs[i], gi);
      }
      if (e.node != nullptr) {
        if (gi.defined()) {
          auto [it, first] = grads.emplace(e.node.get(), gi);
          if (!first) it->second = it->second + gi;
        }
        if (--pending[e.node.get()] == 0) ready.push_back(e.node.get());
      } else if (e.leaf.defined() && gi.defined()) {
        e.leaf.kind().accumulate(e.leaf, run_grad_hooks(e.leaf, gi));
      }
    }
    if (options.retain_graph) continue;
    n->regathered.clear();
    n->regather = nullptr;  // it holds the shard it gathers from
    n->inputs.clear();
    n->output = Var();
    n->payload = nullptr;
    n->released = true;
  }
}

// ---- hooks and set_grad (Note [Gradient hooks])
// ---------------------------------------------------

namespace {

// The leaf's autograd state: ConfigError unless `leaf` is a leaf that requires grad.
AutogradMeta& leaf_meta(const Var& leaf, std::string_view what) {
  const std::shared_ptr<AutogradMeta>& meta = leaf.defined() ? leaf.meta() : nullptr;
  if (meta == nullptr || !meta->requires_grad || meta->grad_fn != nullptr) {
    throw_error<ConfigError>(
        "{}: {} is not a leaf that requires grad (call requires_grad_() on a parameter; a value "
        "computed from one gets its gradient through the ops that made it)",
        what, leaf.defined() ? leaf.kind().describe(leaf) : std::string("an undefined value"));
  }
  return *meta;
}

void check_grad_like(const Var& leaf, const Var& grad, std::string_view what) {
  if (!grad.defined() || &grad.kind() != &leaf.kind() || !same_shape(grad, leaf)) {
    throw_error<ShapeError>("{}: the gradient ({}) must be a {} of the leaf's shape ({})", what,
                            grad.defined() ? grad.kind().describe(grad) : "undefined",
                            leaf.kind().name, leaf.kind().describe(leaf));
  }
}

}  // namespace

void add_grad_hook(const Var& leaf, GradHook hook, SourceLocation loc) {
  const UserCallSite site(loc);
  AutogradMeta& meta = leaf_meta(leaf, "register_hook");
  if (!hook) throw_error<ConfigError>("register_hook: the hook is empty");
  if (meta.hooks == nullptr) meta.hooks = std::make_shared<GradHookList>();
  meta.hooks->hooks.push_back(std::move(hook));
}

void set_leaf_grad(const Var& leaf, const Var& grad, SourceLocation loc) {
  const UserCallSite site(loc);
  (void)leaf_meta(leaf, "set_grad");
  check_grad_like(leaf, grad, "set_grad");
  const VarKind& kind = leaf.kind();
  if (kind.clear_grad == nullptr) {
    throw_error<InternalError>("set_grad: the {} kind cannot clear a gradient", kind.name);
  }
  NoGradGuard no_grad;
  kind.clear_grad(leaf);
  kind.accumulate(leaf, grad.with_meta(nullptr));
}

Var run_grad_hooks(const Var& leaf, Var grad) {
  const std::shared_ptr<AutogradMeta>& meta = leaf.meta();
  if (meta == nullptr || meta->hooks == nullptr) return grad;
  for (const GradHook& hook : meta->hooks->hooks) {
    Var out = hook(grad);
    check_grad_like(leaf, out, "register_hook: the hook's result");
    grad = std::move(out);
  }
  return grad;
}

void backward(const Tensor& loss, SourceLocation loc) {
  const UserCallSite call(loc);
  if (!loss.defined() || loss.numel() != 1) {
    throw_error<ShapeError>(
        "backward: the loss must be a tensor of one element, got shape {} (pass an output "
        "gradient for other outputs)",
        loss.defined() ? shape_str(loss.shape()) : std::string("(undefined)"));
  }
  run_backward(loss, ones(loss.shape(), loss.dtype(), loss.device()), loc);
}

void backward(const Tensor& output, const Tensor& grad, SourceLocation loc) {
  run_backward(output, grad, loc);
}

// ---- ops on Vars
// ------------------------------------------------------------------------------------

Var apply(const OpDef& op, std::span<const Var> inputs, const OpArgs& args) {
  if (!grad_enabled() || !any_requires_grad(inputs)) return inputs[0].kind().call(op, inputs, args);
  Var out;
  {
    NoGradGuard no_grad;
    out = inputs[0].kind().call(op, inputs, args);
  }
  if (!is_floating(var_dtype(out))) return out;
  return record(op.name, &op, inputs, args, out);
}

Var apply(const OpDef& op, std::initializer_list<Var> inputs, const OpArgs& args) {
  return apply(op, std::span<const Var>(inputs.begin(), inputs.size()), args);
}

Var operator+(const Var& a, const Var& b) {
  return apply(op::add, {a, b});
}
Var operator-(const Var& a, const Var& b) {
  return apply(op::sub, {a, b});
}
Var operator*(const Var& a, const Var& b) {
  return apply(op::mul, {a, b});
}
Var operator/(const Var& a, const Var& b) {
  return apply(op::div, {a, b});
}
Var operator*(const Var& a, double c) {
  return apply(op::mul_scalar, {a}, {{}, {c}});
}
Var operator-(const Var& a) {
  return apply(op::neg, {a});
}

Var sum_to(const Var& g, const Shape& shape) {
  const Shape& from = var_shape(g);
  if (from == shape) return g;
  const size_t lead = from.size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < from.size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  Var summed = dims.empty() ? g : apply(op::sum, {g}, reduction_args(dims, true));
  return apply(op::reshape, {summed}, {shape, {}});
}

// ---- the Tensor methods' recorder
// -----------------------------------------------------------------

namespace {

const OpDef& method_op(TensorMethod method) {
  switch (method) {
    case TensorMethod::Narrow:
      return op::narrow;
    case TensorMethod::Select:
      return op::select;
    case TensorMethod::Transpose:
      return op::transpose;
    case TensorMethod::Permute:
      return op::permute;
    case TensorMethod::Reshape:
      return op::reshape;
    case TensorMethod::Unsqueeze:
      return op::unsqueeze;
    case TensorMethod::Squeeze:
      return op::squeeze;
    case TensorMethod::Expand:
      return op::expand;
    case TensorMethod::Contiguous:
    case TensorMethod::Clone:
      return op::clone;
    case TensorMethod::Cast:
      return op::to_dtype;
  }
  return op::clone;
}

Tensor record_method(TensorMethod method, const Tensor& input, std::span<const int64_t> ints,
                     const Tensor& result) {
  if (!is_floating(result.dtype())) return result;
  const OpDef& def = method_op(method);
  const Var in(input);
  return record(def.name, &def, {&in, 1}, OpArgs{{ints.begin(), ints.end()}, {}}, Var(result))
      .value<Tensor>();
}

[[maybe_unused]] const bool kMethodRecorderInstalled = [] {
  detail::set_method_recorder(record_method);
  return true;
}();

}  // namespace

}  // namespace spmd
