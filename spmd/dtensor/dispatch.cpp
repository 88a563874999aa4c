// spmd/dtensor/dispatch.cpp: sharding propagation, its cache, and the dispatch path of every op.
#include <spmd/dtensor/dispatch.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/ops/selective.h>
#include <spmd/tensor/factory.h>

namespace spmd {

namespace {

constexpr size_t kInlineInputs = 4;
// Cost added per redistribute step when comparing strategies, so that of two equally cheap
// strategies the one moving less (local chunks and partitions cost 0 us) wins.
constexpr double kStepEpsilonUs = 1e-3;

// ---- the sharding cache (Note [Sharding cache]) -----------------------------------------------

struct KeyView {
  const OpDef* op;
  SpecList inputs;
  const OpArgs* args;
  std::size_t hash;
};

struct Key {
  const OpDef* op;
  std::vector<SpecPtr> inputs;
  OpArgs args;
  std::size_t hash;
};

bool same_specs(SpecList a, const std::vector<SpecPtr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(*a[i] == *b[i])) return false;
  }
  return true;
}

struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(const Key& k) const { return k.hash; }
  std::size_t operator()(const KeyView& k) const { return k.hash; }
};

struct KeyEq {
  using is_transparent = void;
  bool operator()(const KeyView& a, const Key& b) const {
    return a.hash == b.hash && a.op == b.op && *a.args == b.args && same_specs(a.inputs, b.inputs);
  }
  bool operator()(const Key& a, const KeyView& b) const { return (*this)(b, a); }
  bool operator()(const Key& a, const Key& b) const {
    if (a.hash != b.hash || a.op != b.op || !(a.args == b.args)) return false;
    if (a.inputs.size() != b.inputs.size()) return false;
    for (size_t i = 0; i < a.inputs.size(); ++i) {
      if (!(*a.inputs[i] == *b.inputs[i])) return false;
    }
    return true;
  }
};

struct ShardingCache {
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const OutputSharding>, KeyHash, KeyEq> map;
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> misses{0};
};

ShardingCache& sharding_cache() {
  static ShardingCache* cache = [] {
    // Each new world drops the entries (Note [Caches and worlds] in world/world.h).
    add_new_world_listener([] { drop_cache_entries(sharding_cache()); });
    return new ShardingCache();  // never destroyed
  }();
  return *cache;
}

std::size_t key_hash(const OpDef& op, SpecList inputs, const OpArgs& args) {
  std::size_t seed = std::hash<const void*>{}(&op);
  for (const DTensorSpec* s : inputs) hash_combine(seed, s->hash());
  hash_combine(seed, args.hash());
  return seed;
}

std::string describe_inputs(SpecList inputs) {
  std::string out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    out += fmt::format("{}input {}: {} {} {} on {}", i ? "; " : "", i,
                       to_string(inputs[i]->placements()), shape_str(inputs[i]->shape()),
                       inputs[i]->dtype(), inputs[i]->mesh().to_string());
  }
  return out;
}

// ---- choosing a strategy ---------------------------------------------------------------------

std::shared_ptr<const OutputSharding> decide(const OpDef& op, SpecList inputs, const OpArgs& args) {
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!(inputs[i]->mesh() == inputs[0]->mesh())) {
      throw_error<PlacementError>(
          "{}: DTensor inputs 0 and {} live on different meshes: {} ({}); a DTensor op takes "
          "inputs of one mesh (redistribute within a mesh; across meshes, go through the local "
          "tensors)",
          op.name, i, inputs[0]->mesh().difference(inputs[i]->mesh()), describe_inputs(inputs));
    }
  }
  OpMeta meta;
  std::vector<InputMeta> metas;
  std::vector<const ShardingSpec*> shardings;
  for (const DTensorSpec* spec : inputs) {
    metas.push_back(InputMeta{&spec->shape(), spec->dtype()});
    shardings.push_back(spec);
  }
  try {
    meta = op_meta(op, metas, args);
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("{} (DTensor inputs: {})", e.what(), describe_inputs(inputs)));
  } catch (const Unsupported& e) {
    throw Unsupported(fmt::format("{} (DTensor inputs: {})", e.what(), describe_inputs(inputs)));
  }
  std::vector<OpStrategy> strategies = op.strategies(shardings, args, meta);
  SPMD_CHECK_MSG(!strategies.empty(), "{}: no sharding strategy for {}", op.name,
                 describe_inputs(inputs));
  const DeviceMesh& mesh = inputs[0]->mesh();

  std::shared_ptr<OutputSharding> best;
  double best_score = std::numeric_limits<double>::infinity();
  // An integer Partial(avg) truncates when reduced, so no op keeps one as it is.
  auto keeps_integer_avg = [&](const OpStrategy& strategy) {
    for (size_t t = 0; t < inputs.size(); ++t) {
      if (is_floating(inputs[t]->dtype())) continue;
      for (const Placement& p : strategy.inputs[t]) {
        if (p == Placement{Partial{ReduceOp::Avg}}) return true;
      }
    }
    return false;
  };
  // Note [Following the first input]
  // An elementwise op that can keep its first input's placements does (PyTorch's pointwise rule),
  // even when another strategy is cheaper: otherwise `w - lr * dw` with a P(sum) update would make
  // a Replicate w Partial (a free local partition) and the parameter would leave the step with
  // placements it did not have.
  bool first_kept = false;
  if (op.follow_first_input) {
    for (const OpStrategy& strategy : strategies) {
      if (strategy.inputs[0] == inputs[0]->placements() && !keeps_integer_avg(strategy)) {
        first_kept = true;
        break;
      }
    }
  }
  for (const OpStrategy& strategy : strategies) {
    SPMD_CHECK_EQ(strategy.inputs.size(), inputs.size());
    if (keeps_integer_avg(strategy)) continue;
    if (first_kept && !(strategy.inputs[0] == inputs[0]->placements())) continue;
    auto candidate = std::make_shared<OutputSharding>();
    double score = 0.0;
    for (size_t t = 0; t < inputs.size(); ++t) {
      const DTensorSpec& from = *inputs[t];
      if (strategy.inputs[t] == from.placements()) {
        candidate->input_specs.push_back(nullptr);
        candidate->plans.push_back(nullptr);
        continue;
      }
      auto target = std::make_shared<const DTensorSpec>(from.with_placements(strategy.inputs[t]));
      auto plan = cached_redistribute_plan(from, *target, default_redistribute_planner());
      score += plan->cost_us + kStepEpsilonUs * static_cast<double>(plan->steps.size());
      candidate->cost_us += plan->cost_us;
      candidate->input_specs.push_back(std::move(target));
      candidate->plans.push_back(plan->steps.empty() ? nullptr : std::move(plan));
    }
    if (score < best_score) {
      best_score = score;
      candidate->output =
          std::make_shared<const DTensorSpec>(mesh, strategy.output, meta.shape, meta.dtype);
      best = std::move(candidate);
    }
  }
  return best;
}

}  // namespace

namespace {

// The cached decision. On a miss the key keeps the spec handles of `owners` (the input DTensors)
// when given, else copies of the specs: keeping the callers' handles makes later lookups with the
// same spec objects (every op output shares its cached spec) compare specs by pointer.
std::shared_ptr<const OutputSharding> lookup(const OpDef& op, SpecList inputs, const OpArgs& args,
                                             std::span<const DTensor* const> owners) {
  const KeyView view{&op, inputs, &args, key_hash(op, inputs, args)};
  ShardingCache& cache = sharding_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.map.find(view);
    if (it != cache.map.end()) {
      cache.hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  std::shared_ptr<const OutputSharding> decision = decide(op, inputs, args);
  Key key{&op, {}, args, view.hash};
  key.inputs.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    key.inputs.push_back(owners.empty() ? std::make_shared<const DTensorSpec>(*inputs[i])
                                        : owners[i]->spec_ptr());
  }
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.misses.fetch_add(1, std::memory_order_relaxed);
  return cache.map.emplace(std::move(key), std::move(decision)).first->second;
}

}  // namespace

std::shared_ptr<const OutputSharding> propagate_sharding(const OpDef& op, SpecList inputs,
                                                         const OpArgs& args) {
  return lookup(op, inputs, args, {});
}

namespace {

// Inline storage for the usual 1 to 4 inputs, the heap beyond.
template <class T>
class SmallArray {
 public:
  explicit SmallArray(size_t n) : size_(n) {
    if (n > kInlineInputs) heap_.resize(n);
  }
  T* data() { return size_ > kInlineInputs ? heap_.data() : inline_; }
  T& operator[](size_t i) { return data()[i]; }

 private:
  size_t size_;
  T inline_[kInlineInputs] = {};
  std::vector<T> heap_;
};

// The op on every held rank's pieces (`locals`, laid out as the decision says).
LocalTensor run_pieces(const OpDef& op, const LocalTensor* const* locals,
                       const ShardingSpec* const* specs, size_t n_in, const OpArgs& args,
                       const DTensorSpec& out) {
  // Shape-only pieces: the output's are the spec's (Note [Shape-only tensors]), once per class.
  for (size_t k = 0; k < n_in; ++k) {
    if (locals[k]->shard_at(0).is_meta()) return shape_only_local(out);
  }
  const DTensorSpec::RankInfo& info = out.rank_info();
  const LocalTensor& like = *locals[0];
  const size_t n = like.num_shards();
  // One computation serves every rank when the inputs are one buffer on every rank and the op
  // has no per-rank piece function (which may depend on the rank).
  bool replicated = info.uniform_shapes && op.piece == nullptr;
  int64_t work = 0;
  for (size_t k = 0; k < n_in; ++k) {
    replicated = replicated && locals[k]->is_replicated();
    work += detail::total_numel(*locals[k]);
  }
  auto piece = [&](size_t i) {
    const PieceContext where{info.ranks[i], info.coordinates[i], out, info.local_shapes[i],
                             ShardingInputs(specs, n_in)};
    if (n_in == 1) {
      return compute_piece(op, std::span<const Tensor>(&locals[0]->shard_at(i), 1), args, where);
    }
    SmallArray<Tensor> pieces(n_in);
    for (size_t k = 0; k < n_in; ++k) pieces[k] = locals[k]->shard_at(i);
    return compute_piece(op, std::span<const Tensor>(pieces.data(), n_in), args, where);
  };
  if (replicated) return LocalTensor(like, std::vector<Tensor>(n, piece(0)));
  std::vector<Tensor> results(n);
  detail::for_each_shard(n, work, [&](size_t i) { results[i] = piece(i); });
  return LocalTensor(like, std::move(results));
}

DTensor replicated_operand(const Tensor& t, const DTensor& like, std::string_view op) {
  if (!implicit_replication_enabled()) {
    throw_error<PlacementError>(
        "{}: mixing a DTensor ({} {} {} on {}) with a plain Tensor of shape {}; distribute_tensor "
        "the Tensor first, or treat it as Replicate within an ImplicitReplication scope",
        op, to_string(like.placements()), shape_str(like.shape()), like.dtype(),
        like.mesh().to_string(), t.defined() ? shape_str(t.shape()) : std::string("(undefined)"));
  }
  return distribute_tensor(t, like.mesh(), Placements(like.mesh().ndim(), Replicate{}));
}

}  // namespace

DTensor dispatch(const OpDef& op, std::span<const DTensor* const> inputs, const OpArgs& args,
                 SourceLocation loc) {
  const UserCallSite site(loc);
  const size_t n = inputs.size();
  if (n == 0) throw_error<Error>("{}: dispatch needs at least one DTensor input", op.name);
  SmallArray<const DTensorSpec*> specs(n);
  for (size_t i = 0; i < n; ++i) {
    if (!inputs[i]->defined()) {
      throw_error<PlacementError>("{}: DTensor input {} is undefined", op.name, i);
    }
    specs[i] = &inputs[i]->spec();
  }
  if (op.composite != nullptr && op.use_composite != nullptr) {
    SmallArray<const ShardingSpec*> shardings(n);
    for (size_t i = 0; i < n; ++i) shardings[i] = specs[i];
    if (op.use_composite(ShardingInputs(shardings.data(), n), args)) {
      // The op as other table ops: each is dispatched (and recorded) on its own.
      std::vector<Var> vars;
      vars.reserve(n);
      for (size_t i = 0; i < n; ++i) vars.push_back(dtensor_var(*inputs[i]));
      return op.composite(vars, ShardingInputs(shardings.data(), n), args).value<DTensor>();
    }
  }
  std::shared_ptr<const OutputSharding> decision =
      lookup(op, SpecList(specs.data(), n), args, inputs);
  // Note [Selective recompute] (ops/selective.h): a kept output, taken instead of computed (and
  // the inputs not redistributed), or saved after.
  // Note [Autograd]: the op is one node, recorded once for every rank this process holds.
  auto recorded = [&](const DTensor& out) {
    if (!grad_enabled() || !is_floating(out.dtype()) ||
        std::none_of(inputs.begin(), inputs.end(),
                     [](const DTensor* t) { return t->requires_grad(); })) {
      return out;
    }
    std::vector<Var> vars;
    vars.reserve(n);
    for (size_t i = 0; i < n; ++i) vars.push_back(dtensor_var(*inputs[i]));
    return record(op.name, &op, vars, args, dtensor_var(out)).value<DTensor>();
  };
  SelectiveScope* kept = selective_scope("DTensor", op.name);
  if (kept != nullptr && kept->mode() == SelectiveScope::Mode::Replay) [[unlikely]]
    return recorded(kept->take(op.name).value<DTensor>());
  std::optional<SelectiveScope::Inside> inside;  // a kept op's own calls are not caught
  if (kept != nullptr) [[unlikely]]
    inside.emplace(*kept);
  // Note [Ranks outside the mesh] (dtensor/dtensor.h): nothing to compute or communicate here.
  const bool outside = !inputs[0]->participates();
  if (outside) {
    for (size_t i = 0; i < n; ++i) {
      if (const RedistributePlan* plan = decision->plans[i].get()) create_plan_communicators(*plan);
    }
  }

  SmallArray<LocalTensor> moved(n);
  SmallArray<const LocalTensor*> locals(n);
  SmallArray<const ShardingSpec*> laid_out(n);
  for (size_t i = 0; i < n && !outside; ++i) {
    const RedistributePlan* plan = decision->plans[i].get();
    laid_out[i] = decision->input_specs[i] ? decision->input_specs[i].get() : specs[i];
    if (plan) {
      moved[i] = execute_redistribute(inputs[i]->local(), *specs[i], *plan);
      locals[i] = &moved[i];
    } else {
      locals[i] = &inputs[i]->local();
    }
  }
  DTensor out(outside ? outside_mesh_local(*decision->output)
                      : run_pieces(op, locals.data(), laid_out.data(), n, args, *decision->output),
              decision->output);
  if (kept != nullptr) [[unlikely]] {
    inside.reset();
    kept->save(op.name, dtensor_var(out));
  }
  out = recorded(out);
  if (has_op_observers() && !outside) {
    notify_op_observers(
        OpEvent{op.name, &op, args, inputs, out, user_site_or(loc), nested_call(loc)});
  }
  return out;
}

DTensor dispatch(const OpDef& op, std::initializer_list<DOperand> inputs, const OpArgs& args,
                 SourceLocation loc) {
  const UserCallSite site(loc);
  const DTensor* like = nullptr;
  for (const DOperand& o : inputs) {
    if (o.dtensor() != nullptr) {
      if (!o.dtensor()->defined()) {
        throw_error<PlacementError>("{}: DTensor operand is undefined", op.name);
      }
      like = like ? like : o.dtensor();
    }
  }
  if (like == nullptr) throw_error<PlacementError>("{}: no DTensor operand", op.name);
  const size_t n = inputs.size();
  SmallArray<DTensor> replicated(n);
  SmallArray<const DTensor*> operands(n);
  for (size_t i = 0; i < n; ++i) {
    const DOperand& o = inputs.begin()[i];
    if (o.dtensor() != nullptr) {
      operands[i] = o.dtensor();
    } else {
      replicated[i] = replicated_operand(*o.tensor(), *like, op.name);
      operands[i] = &replicated[i];
    }
  }
  return dispatch(op, std::span<const DTensor* const>(operands.data(), n), args, loc);
}

DTensor dispatch(const OpDef& op, std::span<const DTensor> inputs, const OpArgs& args,
                 SourceLocation loc) {
  std::vector<const DTensor*> operands;
  operands.reserve(inputs.size());
  for (const DTensor& t : inputs) operands.push_back(&t);
  return dispatch(op, std::span<const DTensor* const>(operands), args, loc);
}

CacheStats sharding_cache_stats() {
  ShardingCache& cache = sharding_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return CacheStats{cache.hits.load(), cache.misses.load(), static_cast<int64_t>(cache.map.size())};
}

void clear_sharding_cache() {
  ShardingCache& cache = sharding_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.map.clear();
  cache.hits = 0;
  cache.misses = 0;
}

// ---- implicit replication ----------------------------------------------------------------------

namespace {
thread_local int t_implicit_replication = 0;
}  // namespace

bool implicit_replication_enabled() {
  return t_implicit_replication > 0;
}
ImplicitReplication::ImplicitReplication() {
  ++t_implicit_replication;
}
ImplicitReplication::~ImplicitReplication() {
  --t_implicit_replication;
}

}  // namespace spmd
