// spmd/world/local_ops.cpp: local_call, which runs an op-table entry on LocalTensor shard by shard,
// and the LocalTensor functions that are not table ops.
#include <spmd/world/local_ops.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <optional>

#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/tensor/random.h>
#include <spmd/world/spmd_types.h>

namespace spmd {
namespace {

std::atomic<LocalOpObserver> g_observer{nullptr};

constexpr size_t kInlineOperands = 4;

void check_same_ranks(const LocalTensor& a, const LocalTensor& b, std::string_view op) {
  if (!a.defined() || !b.defined()) throw_error<Error>("{}: LocalTensor operand is undefined", op);
  if (a.ranks_ptr() != b.ranks_ptr() && a.ranks() != b.ranks()) {
    throw_error<Error>("{}: LocalTensor operands hold different ranks: {} vs {}", op,
                       ranks_str(a.ranks()), ranks_str(b.ranks()));
  }
}

// The operands of one call: the LocalTensors (for the rank checks and the observer) and, for a
// shard index, every operand's tensor there.
template <class Operands>
LocalTensor run_shards(const OpDef& op, const Operands& operands, const OpArgs& args,
                       const SourceLocation& loc) {
  const size_t n_in = operands.size();
  const LocalTensor* first = nullptr;
  bool replicated = true;
  int64_t work = 0;
  std::array<const LocalTensor*, kInlineOperands> inline_locals{};
  std::vector<const LocalTensor*> heap_locals;
  const LocalTensor** locals = inline_locals.data();
  if (n_in > kInlineOperands) {
    heap_locals.resize(n_in);
    locals = heap_locals.data();
  }
  size_t n_locals = 0;
  for (size_t k = 0; k < n_in; ++k) {
    const LocalTensor* t = operands.local(k);
    if (t == nullptr) continue;
    if (!t->defined())
      throw_error<Error>("{}: LocalTensor operand {} is undefined", op.name, k + 1);
    if (first == nullptr) {
      first = t;
    } else {
      check_same_ranks(*first, *t, op.name);
    }
    replicated = replicated && t->is_replicated();
    work += detail::total_numel(*t);
    locals[n_locals++] = t;
  }
  if (first == nullptr) throw_error<Error>("{}: no LocalTensor operand", op.name);

  // The op on shard i (a one-operand op reads the shard in place).
  auto shard_result = [&](size_t i) {
    if (n_in == 1) return call(op, std::span<const Tensor>(&operands.tensor(0, i), 1), args);
    std::array<Tensor, kInlineOperands> inline_in;
    std::vector<Tensor> heap_in;
    Tensor* in = inline_in.data();
    if (n_in > kInlineOperands) {
      heap_in.resize(n_in);
      in = heap_in.data();
    }
    for (size_t k = 0; k < n_in; ++k) in[k] = operands.tensor(k, i);
    return call(op, std::span<const Tensor>(in, n_in), args);
  };
  const size_t n = first->num_shards();
  bool recording = false;
  if (grad_enabled()) {
    for (size_t k = 0; k < n_locals && !recording; ++k) recording = locals[k]->requires_grad();
  }
  TypesPtr out_types;
  if (types_active()) {
    std::array<TypesPtr, kInlineOperands> inline_types{};
    std::array<uint8_t, kInlineOperands> inline_grads{};
    std::vector<TypesPtr> heap_types;
    std::vector<uint8_t> heap_grads;
    TypesPtr* types = inline_types.data();
    uint8_t* grads = inline_grads.data();
    if (n_in > kInlineOperands) {
      heap_types.resize(n_in);
      heap_grads.resize(n_in);
      types = heap_types.data();
      grads = heap_grads.data();
    }
    for (size_t k = 0; k < n_in; ++k) {
      const LocalTensor* t = operands.local(k);
      types[k] = t != nullptr ? t->spmd_types() : constant_types();
      grads[k] = recording && t != nullptr && t->requires_grad() ? 1 : 0;
    }
    out_types = spmd_type_rule(op, std::span<const TypesPtr>(types, n_in),
                               std::span<const uint8_t>(grads, n_in), user_site_or(loc));
  }
  LocalTensor result;
  {
    // Recorded as one node (Note [Autograd]): the shards' own ops record nothing.
    std::optional<NoGradGuard> no_grad;
    if (recording) no_grad.emplace();
    detail::JointClasses joint = detail::joint_classes(locals, n_locals);
    if (joint.classes) {
      // Note [Shard classes]: once per class of ranks.
      std::vector<Tensor> out;
      out.reserve(joint.representative.size());
      for (size_t i : joint.representative) out.push_back(shard_result(i));
      result = LocalTensor(*first, std::move(out), std::move(joint.classes));
    } else if (replicated) {
      result = LocalTensor(*first, std::vector<Tensor>(n, shard_result(0)));
    } else {
      std::vector<Tensor> out(n);
      detail::for_each_shard(n, work, [&](size_t i) { out[i] = shard_result(i); });
      result = LocalTensor(*first, std::move(out));
    }
  }
  if (out_types != nullptr) [[unlikely]]
    result = std::move(result).with_types(std::move(out_types));
  if (recording && is_floating(result.dtype())) {
    std::vector<Var> vars;
    vars.reserve(n_in);
    for (size_t k = 0; k < n_in; ++k) {
      const LocalTensor* t = operands.local(k);
      vars.push_back(local_var(
          t != nullptr ? *t : LocalTensor::replicate(first->ranks(), operands.tensor(k, 0))));
    }
    result = record(op.name, &op, vars, args, local_var(result)).value<LocalTensor>();
  }
  if (LocalOpObserver observer = g_observer.load(std::memory_order_relaxed)) [[unlikely]] {
    observer(op.name, std::span<const LocalTensor* const>(locals, n_locals), result,
             user_site_or(loc));
  }
  return result;
}

struct MixedOperands {
  std::initializer_list<LocalOperand> list;
  size_t size() const { return list.size(); }
  const LocalTensor* local(size_t k) const { return list.begin()[k].local(); }
  const Tensor& tensor(size_t k, size_t shard) const {
    const LocalOperand& o = list.begin()[k];
    return o.local() != nullptr ? o.local()->shard_at(shard) : *o.tensor();
  }
};

struct LocalOperands {
  std::span<const LocalTensor> list;
  size_t size() const { return list.size(); }
  const LocalTensor* local(size_t k) const { return &list[k]; }
  const Tensor& tensor(size_t k, size_t shard) const { return list[k].shard_at(shard); }
};

}  // namespace

LocalTensor local_call(const OpDef& op, std::initializer_list<LocalOperand> inputs,
                       const OpArgs& args, SourceLocation loc) {
  const UserCallSite site(loc);
  return run_shards(op, MixedOperands{inputs}, args, loc);
}

LocalTensor local_call(const OpDef& op, std::span<const LocalTensor> inputs, const OpArgs& args,
                       SourceLocation loc) {
  const UserCallSite site(loc);
  if (inputs.empty()) throw_error<Error>("{}: needs at least one LocalTensor", op.name);
  return run_shards(op, LocalOperands{inputs}, args, loc);
}

// ---- autograd
// -------------------------------------------------------------------------------------

namespace {

const LocalTensor& local_of(const Var& v) {
  return v.as<LocalTensor>();
}

// Whether every shard of `t` has one shape.
bool uniform_shape(const LocalTensor& t) {
  if (t.is_replicated()) return true;
  const std::vector<Tensor>& shards = t.class_shards();
  return std::all_of(shards.begin(), shards.end(),
                     [&](const Tensor& s) { return s.shape() == shards.front().shape(); });
}

bool same_local_shape(const Var& a, const Var& b) {
  const LocalTensor& x = local_of(a);
  const LocalTensor& y = local_of(b);
  if (x.num_shards() != y.num_shards()) return false;
  for (size_t i = 0; i < x.num_shards(); ++i) {
    if (x.shard_at(i).shape() != y.shard_at(i).shape()) return false;
  }
  return true;
}

// The shards of `t` at `positions` (of its ranks), as a LocalTensor over those ranks, untyped.
LocalTensor part_of(const LocalTensor& t, const std::vector<size_t>& positions) {
  std::vector<int> ranks;
  std::vector<Tensor> shards;
  ranks.reserve(positions.size());
  shards.reserve(positions.size());
  for (size_t i : positions) {
    ranks.push_back(t.ranks()[i]);
    shards.push_back(t.shard_at(i));
  }
  return LocalTensor(std::move(ranks), std::move(shards));
}

// Note [Uneven backward] (ops/autograd.h): the derivative once per class of ranks on which every
// value of the node has the same shapes.
bool local_per_shape_class(const Node& node, const Var& grad, BackwardFn fn,
                           std::vector<Var>& grads) {
  std::vector<const LocalTensor*> values;
  values.reserve(node.inputs.size() + 2);
  for (const Var& v : node.inputs) {
    if (v.defined()) values.push_back(&local_of(v));
  }
  values.push_back(&local_of(node.output));
  values.push_back(&local_of(grad));
  if (std::all_of(values.begin(), values.end(),
                  [](const LocalTensor* t) { return uniform_shape(*t); })) {
    return false;
  }
  // Ranks (by position) keyed by the shapes of every value there, in order of first appearance.
  const size_t n = values.front()->num_shards();
  std::vector<std::vector<size_t>> classes;
  std::map<std::vector<Shape>, size_t> index;
  std::vector<Shape> key(values.size());
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < values.size(); ++k) key[k] = values[k]->shard_at(i).shape();
    auto [it, fresh] = index.emplace(key, classes.size());
    if (fresh) classes.emplace_back();
    classes[it->second].push_back(i);
  }
  const std::vector<int>& ranks = values.front()->ranks();
  // Each class's gradients, per input; then every input's shards in rank order.
  std::vector<std::vector<Tensor>> shards(node.inputs.size(), std::vector<Tensor>(n));
  std::vector<bool> has_grad(node.inputs.size(), false);
  for (const std::vector<size_t>& positions : classes) {
    Node part;
    part.name = node.name;
    part.op = node.op;
    part.backward = node.backward;
    part.args = node.args;
    part.edges = node.edges;
    part.payload = node.payload;
    part.site = node.site;
    part.has_site = node.has_site;
    part.inputs.reserve(node.inputs.size());
    for (const Var& v : node.inputs) {
      part.inputs.push_back(v.defined() ? local_var(part_of(local_of(v), positions)) : Var());
    }
    part.output = local_var(part_of(local_of(node.output), positions));
    const Var part_grad = local_var(part_of(local_of(grad), positions));
    BackwardContext context(part, part_grad);
    fn(context);
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const Var& g = context.grad_of(k);
      if (!g.defined()) continue;
      has_grad[k] = true;
      const LocalTensor& lg = local_of(g);
      for (size_t j = 0; j < positions.size(); ++j) shards[k][positions[j]] = lg.shard_at(j);
    }
  }
  grads.assign(node.inputs.size(), Var());
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    if (!has_grad[k]) continue;
    const LocalTensor& input = local_of(node.inputs[k]);
    for (size_t i = 0; i < n; ++i) {
      // A class whose formula left this input's gradient unset contributes zeros.
      if (!shards[k][i].defined()) {
        const Tensor& x = input.shard_at(i);
        shards[k][i] = zeros(x.shape(), x.dtype(), x.device());
      }
    }
    grads[k] = local_var(LocalTensor(ranks, std::move(shards[k])));
  }
  return true;
}

// Note [Saved values]: the same ranks, classes and types over uncounted meta shards.
LocalTensor local_shape_stub(const LocalTensor& t) {
  std::vector<Tensor> shards;
  shards.reserve(t.class_shards().size());
  for (const Tensor& shard : t.class_shards()) {
    shards.push_back(empty(shard.shape(), shard.dtype(), meta_device()));
  }
  LocalTensor stub = t.has_classes() ? LocalTensor(t, std::move(shards), t.classes())
                                     : LocalTensor(t, std::move(shards));
  return t.spmd_types() ? std::move(stub).with_types(t.spmd_types()) : stub;
}

const VarKind kLocalKind{
    "LocalTensor",
    [](const OpDef& op, std::span<const Var> inputs, const OpArgs& args) {
      std::vector<LocalTensor> locals;
      locals.reserve(inputs.size());
      for (const Var& v : inputs) locals.push_back(local_of(v));
      return local_var(local_call(op, locals, args));
    },
    [](const Var& leaf, const Var& grad) {
      auto& meta = static_cast<LocalAutogradMeta&>(*leaf.meta());
      const LocalTensor g = local_of(grad).to(local_of(leaf).dtype()).detach();
      meta.local_grad = meta.local_grad.defined() ? meta.local_grad + g : g;
      if (const TypesPtr& types = local_of(leaf).spmd_types()) [[unlikely]]
        meta.local_grad = meta.local_grad.with_types(backward_types(types));
    },
    [](const Var& v) {
      uint64_t version = 0;
      for (const Tensor& shard : local_of(v).class_shards()) version += shard.storage()->version();
      return version;
    },
    [](const Var& v) -> const Shape& {
      const LocalTensor& t = local_of(v);
      const Shape& first = t.shard_at(0).shape();
      for (size_t i = 0; i < t.num_shards(); ++i) {
        const Tensor& shard = t.shard_at(i);
        if (shard.shape() != first) {
          throw_error<Unsupported>(
              "autograd: a backward that needs the shape of a LocalTensor whose shards differ in "
              "shape ({} and {} on ranks {} and {}); differentiate through DTensor ops instead",
              shape_str(first), shape_str(shard.shape()), t.ranks().front(), t.ranks()[i]);
        }
      }
      return first;
    },
    [](const Var& v) { return local_of(v).dtype(); },
    [](const Var& v) {
      const LocalTensor& t = local_of(v);
      if (uniform_shape(t)) {
        return fmt::format("{} {} on ranks {}", shape_str(t.shard_at(0).shape()), t.dtype(),
                           ranks_str(t.ranks()));
      }
      std::string shapes;
      for (size_t i = 0; i < t.num_shards() && i < 8; ++i) {
        shapes += fmt::format("{}rank {}: {}", i ? ", " : "", t.ranks()[i],
                              shape_str(t.shard_at(i).shape()));
      }
      return fmt::format("{} per rank ({}{})", t.dtype(), shapes,
                         t.num_shards() > 8 ? ", ..." : "");
    },
    [](const Var& input, const Var& grad) {
      const TypesPtr& types = local_of(input).spmd_types();
      if (types == nullptr) return grad;
      return Var(
          &kLocalKind,
          std::make_shared<const LocalTensor>(local_of(grad).with_types(backward_types(types))),
          grad.meta());
    },
    same_local_shape,
    local_per_shape_class,
    [](const Var& leaf) {
      static_cast<LocalAutogradMeta&>(*leaf.meta()).local_grad = LocalTensor();
    },
    [](const Var& v) { return local_var(local_shape_stub(local_of(v))); }};

}  // namespace

const VarKind& local_kind() {
  return kLocalKind;
}

Var local_var(const LocalTensor& t) {
  return Var(&kLocalKind, std::make_shared<const LocalTensor>(t.detach()), t.autograd());
}

LocalTensor float8_matmul(const LocalTensor& x, const LocalTensor& w, SourceLocation loc) {
  const UserCallSite site(loc);
  return float8_matmul(local_var(x), local_var(w)).value<LocalTensor>();
}

void backward(const LocalTensor& loss, SourceLocation loc) {
  const UserCallSite site(loc);
  // A send's token has no elements (Note [Point-to-point]): its backward receives the gradient.
  if (!loss.defined() ||
      (loss.numel() != PerRank<int64_t>(1) && loss.numel() != PerRank<int64_t>(0))) {
    throw_error<ShapeError>(
        "backward: the loss must be a LocalTensor of one element per rank, or a send's token "
        "(pass an output gradient for other outputs)");
  }
  run_backward(
      local_var(loss),
      local_var(loss.apply([](const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); })),
      loc);
}

void backward(const LocalTensor& output, const LocalTensor& grad, SourceLocation loc) {
  run_backward(local_var(output), local_var(grad), loc);
}

LocalTensor pad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                const PerRank<int64_t>& after, double value) {
  if (before.is_uniform() && after.is_uniform())
    return pad(t, d, *before.uniform(), *after.uniform(), value);
  return t.map([&](int r, const Tensor& x) { return pad(x, d, before.at(r), after.at(r), value); });
}

LocalTensor unpad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                  const PerRank<int64_t>& after) {
  if (before.is_uniform() && after.is_uniform()) {
    const int64_t b = *before.uniform();
    const int64_t a = *after.uniform();
    return t.apply([&](const Tensor& x) { return unpad(x, d, b, a); });
  }
  return t.map([&](int r, const Tensor& x) { return unpad(x, d, before.at(r), after.at(r)); });
}

PerRank<bool> equal(const LocalTensor& a, const LocalTensor& b) {
  check_same_ranks(a, b, "equal");
  std::vector<bool> out;
  for (size_t i = 0; i < a.num_shards(); ++i) out.push_back(equal(a.shard_at(i), b.shard_at(i)));
  return PerRank<bool>(a.ranks(), std::move(out));
}

PerRank<bool> allclose(const LocalTensor& a, const LocalTensor& b, double rtol, double atol) {
  check_same_ranks(a, b, "allclose");
  std::vector<bool> out;
  for (size_t i = 0; i < a.num_shards(); ++i) {
    out.push_back(allclose(a.shard_at(i), b.shard_at(i), rtol, atol));
  }
  return PerRank<bool>(a.ranks(), std::move(out));
}

LocalTensor zeros(const World& world, const Shape& shape, DType dtype, SourceLocation loc) {
  return LocalTensor::replicate(world, zeros(shape, dtype), loc);
}
LocalTensor ones(const World& world, const Shape& shape, DType dtype, SourceLocation loc) {
  return LocalTensor::replicate(world, ones(shape, dtype), loc);
}
LocalTensor full(const World& world, const Shape& shape, double value, DType dtype,
                 SourceLocation loc) {
  return LocalTensor::replicate(world, full(shape, value, dtype), loc);
}

namespace {

// The shape every held shard of `t` has (ShapeError naming `op` and two ranks when they differ).
const Shape& common_shape(const LocalTensor& t, std::string_view op) {
  if (!t.defined() || t.num_shards() == 0) {
    throw_error<ShapeError>("{}: the LocalTensor is undefined or holds no rank", op);
  }
  const Shape& first = t.shard_at(0).shape();
  for (size_t i = 1; i < t.num_shards(); ++i) {
    if (t.shard_at(i).shape() != first) {
      throw_error<ShapeError>("{}: the shards differ in shape ({} on rank {}, {} on rank {})", op,
                              shape_str(first), t.ranks().front(), shape_str(t.shard_at(i).shape()),
                              t.ranks()[i]);
    }
  }
  return first;
}

std::vector<LocalTensor> narrow_pieces(const LocalTensor& t, int64_t d,
                                       const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                       SourceLocation loc) {
  std::vector<LocalTensor> out;
  for (const auto& [start, length] : ranges) out.push_back(narrow(t, d, start, length, loc));
  return out;
}

int64_t common_size(const LocalTensor& t, int64_t d, std::string_view op) {
  const Shape& shape = common_shape(t, op);
  return shape[static_cast<size_t>(
      normalize_dim(d, static_cast<int64_t>(shape.size()), op, shape))];
}

}  // namespace

LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, bool causal,
                                         std::optional<double> scale, SourceLocation loc) {
  const UserCallSite site(loc);
  return local_call(
      op::scaled_dot_product_attention, {q, k, v},
      attention_args(common_size(q, -1, "scaled_dot_product_attention"), causal, scale), loc);
}

LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, const AttentionOptions& options,
                                         SourceLocation loc) {
  const UserCallSite site(loc);
  return local_call(
      op::scaled_dot_product_attention, {q, k, v},
      attention_args(common_size(q, -1, "scaled_dot_product_attention"), options, false), loc);
}

LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, const LocalTensor& attn_mask,
                                         const AttentionOptions& options, SourceLocation loc) {
  const UserCallSite site(loc);
  return local_call(
      op::scaled_dot_product_attention, {q, k, v, attn_mask},
      attention_args(common_size(q, -1, "scaled_dot_product_attention"), options, true), loc);
}

LocalTensor flatten(const LocalTensor& t, int64_t start, int64_t end, SourceLocation loc) {
  const UserCallSite site(loc);
  return local_call(op::reshape, {t}, {flattened_shape(common_shape(t, "flatten"), start, end), {}},
                    loc);
}

std::vector<LocalTensor> split(const LocalTensor& t, const std::vector<int64_t>& sizes, int64_t d,
                               SourceLocation loc) {
  const UserCallSite site(loc);
  return narrow_pieces(t, d, split_ranges(common_size(t, d, "split"), sizes, "split"), loc);
}

std::vector<LocalTensor> chunk(const LocalTensor& t, int64_t chunks, int64_t d,
                               SourceLocation loc) {
  const UserCallSite site(loc);
  return narrow_pieces(t, d, chunk_ranges(common_size(t, d, "chunk"), chunks), loc);
}

void set_local_op_observer(LocalOpObserver observer) {
  g_observer.store(observer, std::memory_order_relaxed);
}

LocalTensor randn_per_rank(const World& world, const Shape& shape, uint64_t seed, DType dtype,
                           SourceLocation loc) {
  return LocalTensor::from_fn(
      world, [&](int r) { return randn(shape, seed + static_cast<uint64_t>(r), dtype); }, loc);
}

}  // namespace spmd
