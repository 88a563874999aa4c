// spmd/dtensor/dispatch.cpp: sharding propagation, its cache, and the dispatch path of every op.
#include <spmd/dtensor/dispatch.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/tensor/ops.h>

namespace spmd {

std::size_t OpArgs::hash() const {
  std::size_t seed = ints.size() * 131 + reals.size();
  for (int64_t v : ints) hash_combine(seed, v);
  for (double v : reals) hash_combine(seed, v);
  return seed;
}

std::string OpArgs::to_string() const {
  std::string out;
  if (!ints.empty()) out += "ints=" + shape_str(ints);
  if (!reals.empty()) {
    out += out.empty() ? "reals=[" : " reals=[";
    for (size_t i = 0; i < reals.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", reals[i]);
    out += "]";
  }
  return out;
}

namespace {

constexpr size_t kMaxInputs = 4;
// Cost added per redistribute step when comparing strategies, so that of two equally cheap
// strategies the one moving less (local chunks and partitions cost 0 us) wins.
constexpr double kStepEpsilonUs = 1e-3;
// Strategies costed at most per cache miss; beyond it only the first ones are considered.
constexpr size_t kMaxStrategies = 4096;

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
  static ShardingCache* cache = new ShardingCache();  // never destroyed
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
          "{}: DTensor inputs live on different meshes ({}); redistribute them onto one mesh",
          op.name, describe_inputs(inputs));
    }
  }
  OpMeta meta;
  try {
    meta = op.meta(inputs, args);
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("{} (DTensor inputs: {})", e.what(), describe_inputs(inputs)));
  } catch (const Unsupported& e) {
    throw Unsupported(fmt::format("{} (DTensor inputs: {})", e.what(), describe_inputs(inputs)));
  }
  std::vector<OpStrategy> strategies = op.strategies(inputs, args, meta);
  SPMD_CHECK_MSG(!strategies.empty(), "{}: no sharding strategy for {}", op.name,
                 describe_inputs(inputs));
  if (strategies.size() > kMaxStrategies) strategies.resize(kMaxStrategies);
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
  for (const OpStrategy& strategy : strategies) {
    SPMD_CHECK_EQ(strategy.inputs.size(), inputs.size());
    if (keeps_integer_avg(strategy)) continue;
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

DTensor dispatch(const OpDef& op, std::span<const DTensor* const> inputs, const OpArgs& args) {
  const size_t n = inputs.size();
  if (n == 0 || n > kMaxInputs) {
    throw_error<Error>("{}: dispatch takes 1 to {} DTensor inputs, got {}", op.name, kMaxInputs, n);
  }
  const DTensorSpec* specs[kMaxInputs];
  for (size_t i = 0; i < n; ++i) {
    if (!inputs[i]->defined()) {
      throw_error<PlacementError>("{}: DTensor input {} is undefined", op.name, i);
    }
    specs[i] = &inputs[i]->spec();
  }
  std::shared_ptr<const OutputSharding> decision = lookup(op, SpecList(specs, n), args, inputs);

  LocalTensor moved[kMaxInputs];
  const LocalTensor* locals[kMaxInputs];
  for (size_t i = 0; i < n; ++i) {
    const RedistributePlan* plan = decision->plans[i].get();
    if (plan) {
      moved[i] = execute_redistribute(inputs[i]->to_local(), *specs[i], *plan);
      locals[i] = &moved[i];
    } else {
      locals[i] = &inputs[i]->to_local();
    }
  }
  DTensor out(op.local(LocalInputs(locals, n), args, *decision->output), decision->output);
  if (has_op_observers()) notify_op_observers(OpEvent{op.name, &op, args, inputs, out});
  return out;
}

DTensor dispatch(const OpDef& op, std::initializer_list<const DTensor*> inputs,
                 const OpArgs& args) {
  return dispatch(op, std::span<const DTensor* const>(inputs.begin(), inputs.size()), args);
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

// ---- strategy helpers --------------------------------------------------------------------------

std::vector<OpStrategy> expand_dim_options(SpecList inputs, const std::vector<DimOption>& options) {
  const size_t n = inputs.size();
  const int mesh_ndim = inputs[0]->mesh_ndim();
  auto all_replicate = [&](const DimOption& o) {
    return is_replicate(o.output) &&
           std::all_of(o.inputs.begin(), o.inputs.end(),
                       [](const Placement& p) { return is_replicate(p); });
  };
  std::vector<std::vector<const DimOption*>> per_dim(static_cast<size_t>(mesh_ndim));
  for (int i = 0; i < mesh_ndim; ++i) {
    auto& kept = per_dim[static_cast<size_t>(i)];
    for (const DimOption& o : options) {
      bool matches = all_replicate(o);
      for (size_t t = 0; t < n && !matches; ++t) {
        matches = o.inputs[t] == inputs[t]->placements()[static_cast<size_t>(i)];
      }
      if (matches && std::find(kept.begin(), kept.end(), &o) == kept.end()) kept.push_back(&o);
    }
    SPMD_CHECK_MSG(!kept.empty(), "expand_dim_options: no all-Replicate option");
  }
  std::vector<OpStrategy> out;
  std::vector<size_t> pick(static_cast<size_t>(mesh_ndim), 0);
  while (out.size() < kMaxStrategies) {
    OpStrategy s;
    s.inputs.assign(n, Placements(static_cast<size_t>(mesh_ndim)));
    s.output.resize(static_cast<size_t>(mesh_ndim));
    for (int i = 0; i < mesh_ndim; ++i) {
      const DimOption& o = *per_dim[static_cast<size_t>(i)][pick[static_cast<size_t>(i)]];
      for (size_t t = 0; t < n; ++t) s.inputs[t][static_cast<size_t>(i)] = o.inputs[t];
      s.output[static_cast<size_t>(i)] = o.output;
    }
    out.push_back(std::move(s));
    int i = mesh_ndim - 1;
    while (i >= 0 && ++pick[static_cast<size_t>(i)] == per_dim[static_cast<size_t>(i)].size()) {
      pick[static_cast<size_t>(i)] = 0;
      --i;
    }
    if (i < 0) break;
  }
  return out;
}

DType probe_dtype(const OpDef& op, SpecList inputs, const OpArgs& args) {
  std::vector<Tensor> probes;
  probes.reserve(inputs.size());
  for (const DTensorSpec* s : inputs) {
    Shape shape = s->shape();
    for (int64_t& v : shape) v = std::min<int64_t>(v, 1);
    probes.push_back(zeros(shape, s->dtype()));
  }
  return op.reference(probes, args).dtype();
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
