// spmd/dtensor/redistribute.cpp: the greedy and min-cost planners, the plan cache and the executor
// of Note [Redistribute steps].
#include <spmd/dtensor/redistribute.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <ostream>
#include <queue>
#include <unordered_map>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/functional.h>
#include <spmd/core/check.h>
#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

namespace spmd {

std::string_view planner_name(RedistributePlanner planner) {
  return planner == RedistributePlanner::Greedy ? "greedy" : "min_cost";
}

namespace {

std::atomic<int> g_default_planner{-1};

void check_planner(RedistributePlanner planner, std::string_view op) {
  if (planner != RedistributePlanner::Greedy && planner != RedistributePlanner::MinCost) {
    throw_error<Unsupported>("{}: RedistributePlanner({}) is not a planner (greedy, min_cost)", op,
                             static_cast<int>(planner));
  }
}

RedistributePlanner planner_from_env() {
  if (auto value = env_value("SPMD_REDISTRIBUTE_PLANNER")) {
    if (*value == "min_cost" || *value == "min-cost") return RedistributePlanner::MinCost;
    if (*value != "greedy") {
      throw_error<ConfigError>(
          "SPMD_REDISTRIBUTE_PLANNER: expected 'greedy' or 'min_cost', got '{}'", *value);
    }
  }
  return RedistributePlanner::Greedy;
}

}  // namespace

RedistributePlanner default_redistribute_planner() {
  int value = g_default_planner.load(std::memory_order_relaxed);
  if (value < 0) {
    value = static_cast<int>(planner_from_env());
    g_default_planner.store(value, std::memory_order_relaxed);
  }
  return static_cast<RedistributePlanner>(value);
}

void set_default_redistribute_planner(RedistributePlanner planner) {
  check_planner(planner, "set_default_redistribute_planner");
  g_default_planner.store(static_cast<int>(planner), std::memory_order_relaxed);
}

std::string_view step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::AllGather:
      return "all_gather";
    case StepKind::AllReduce:
      return "all_reduce";
    case StepKind::ReduceScatter:
      return "reduce_scatter";
    case StepKind::AllToAll:
      return "all_to_all";
    case StepKind::LocalChunk:
      return "local chunk";
    case StepKind::LocalPartition:
      return "local partition";
    case StepKind::LocalZeroFill:
      return "local zero-fill";
  }
  return "?";
}

namespace {

// ---- steps: kinds, validity and cost (Note [Redistribute steps]) -----------------------------

struct Move {
  int mesh_dim;
  Placement from;
  Placement to;
};

// The kind of a direct step, or nullopt when from -> to needs two steps (S -> P other than sum,
// P(a) -> P(b)).
std::optional<StepKind> direct_kind(const Placement& from, const Placement& to) {
  if (from == to) return std::nullopt;
  if (is_shard(from)) {
    if (is_replicate(to)) return StepKind::AllGather;
    if (is_shard(to)) return StepKind::AllToAll;
    if (std::get<Partial>(to).op == ReduceOp::Sum) return StepKind::LocalZeroFill;
    return std::nullopt;
  }
  if (is_replicate(from)) return is_shard(to) ? StepKind::LocalChunk : StepKind::LocalPartition;
  if (is_replicate(to)) return StepKind::AllReduce;
  if (is_shard(to)) return StepKind::ReduceScatter;
  return std::nullopt;
}

// Partials reduce innermost first; two Partials may reduce in either order when their ops
// commute: any op with itself, and sum with avg, for floating dtypes; an integer avg truncates,
// so it commutes with nothing, not even another avg.
bool partial_ops_commute(ReduceOp a, ReduceOp b, DType dtype) {
  if (!is_floating(dtype)) return a == b && a != ReduceOp::Avg;
  auto linear = [](ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; };
  return a == b || (linear(a) && linear(b));
}

// Whether the R -> P(op) partition of Note [Redistribute steps] keeps the value when a mesh dim
// after it holds Partial(inner) pieces: dividing by k (floating sum) breaks an inner product,
// ones for the other ranks of a product break an inner sum; zeros (integer sum) and keeping the
// value (avg, min, max) are fine under any inner reduction.
bool partition_commutes(ReduceOp op, ReduceOp inner, DType dtype) {
  if (op == ReduceOp::Sum) return !is_floating(dtype) || inner != ReduceOp::Product;
  if (op == ReduceOp::Product) return inner != ReduceOp::Sum;
  return true;
}

// Whether the direct step on mesh dim i from state[i] to `to` is valid in `state`.
bool step_valid(const Placements& state, const std::vector<int64_t>& mesh_shape, DType dtype, int i,
                const Placement& to) {
  const Placement& from = state[static_cast<size_t>(i)];
  if (!direct_kind(from, to)) return false;
  if (mesh_shape[static_cast<size_t>(i)] == 1) return true;
  const Shard* a = std::get_if<Shard>(&from);
  const Shard* b = std::get_if<Shard>(&to);
  const Partial* reduced = std::get_if<Partial>(&from);
  // Only a partition (R -> P) can break an inner Partial; a zero-fill (S -> P) cannot.
  const Partial* partitioned = is_replicate(from) ? std::get_if<Partial>(&to) : nullptr;
  for (size_t j = static_cast<size_t>(i) + 1; j < state.size(); ++j) {
    if (mesh_shape[j] == 1) continue;
    if (const Shard* s = std::get_if<Shard>(&state[j])) {
      if ((a && a->dim == s->dim) || (b && b->dim == s->dim)) return false;
    }
    if (const Partial* q = std::get_if<Partial>(&state[j])) {
      if (reduced && !partial_ops_commute(reduced->op, q->op, dtype)) return false;
      if (partitioned && !partition_commutes(partitioned->op, q->op, dtype)) return false;
    }
  }
  return true;
}

// The largest local shape of a DTensor in `state` (each sharded dim at its chunk capacity).
Shape padded_shape(const Placements& state, const std::vector<int64_t>& mesh_shape,
                   const Shape& shape) {
  Shape local = shape;
  for (size_t i = 0; i < state.size(); ++i) {
    if (const Shard* s = std::get_if<Shard>(&state[i])) {
      int64_t& n = local[static_cast<size_t>(s->dim)];
      n = shard_capacity(n, mesh_shape[i]);
    }
  }
  return local;
}

struct CostContext {
  const DTensorSpec& spec;
  const Topology& topology;
  std::vector<LinkParams> links;  // per mesh dim

  explicit CostContext(const DTensorSpec& s) : spec(s), topology(s.mesh().world().topology()) {
    for (int i = 0; i < s.mesh_ndim(); ++i) {
      links.push_back(topology.link_for(s.mesh().group_family(i)));
    }
  }

  // Fills kind, bytes and cost of the step on mesh dim i from state[i] to `to`.
  RedistributeStep step(const Placements& state, int i, const Placement& to) const {
    RedistributeStep st;
    st.mesh_dim = i;
    st.from = state[static_cast<size_t>(i)];
    st.to = to;
    st.kind = *direct_kind(st.from, to);
    const int64_t k = spec.mesh_shape()[static_cast<size_t>(i)];
    // Padding rounds each sharded dim up, so a spec at the edge of int64 can overflow here.
    int64_t local_bytes = static_cast<int64_t>(itemsize(spec.dtype()));
    bool overflow = false;
    for (int64_t n : padded_shape(state, spec.mesh_shape(), spec.shape())) {
      overflow = overflow || __builtin_mul_overflow(local_bytes, n, &local_bytes);
    }
    int64_t gathered_bytes = 0;
    overflow = overflow || __builtin_mul_overflow(local_bytes, k, &gathered_bytes);
    if (overflow) {
      throw_error<ShapeError>(
          "plan_redistribute: the bytes a step moves overflow int64 ({} {} with placements {} on "
          "mesh {})",
          shape_str(spec.shape()), spec.dtype(), spmd::to_string(state), spec.mesh().to_string());
    }
    CollectiveKind collective = CollectiveKind::AllGather;
    switch (st.kind) {
      case StepKind::AllGather:
        st.bytes = gathered_bytes;
        collective = CollectiveKind::AllGather;
        break;
      case StepKind::AllReduce:
        st.bytes = local_bytes;
        collective = CollectiveKind::AllReduce;
        break;
      case StepKind::ReduceScatter:
        st.bytes = local_bytes;
        collective = CollectiveKind::ReduceScatter;
        break;
      case StepKind::AllToAll:
        st.bytes = local_bytes;
        collective = CollectiveKind::AllToAll;
        break;
      case StepKind::LocalChunk:
      case StepKind::LocalPartition:
      case StepKind::LocalZeroFill:
        return st;
    }
    st.cost_us =
        collective_cost_us(collective, st.bytes, k, links[static_cast<size_t>(i)], topology);
    return st;
  }
};

// ---- the greedy planner (Note [Greedy and min-cost planners]) --------------------------------

// Appends from -> to on mesh dim i, as two moves through R when no direct step exists.
void push_move(std::vector<Move>& moves, Placements& state, int i, const Placement& to) {
  Placement& cur = state[static_cast<size_t>(i)];
  if (cur == to) return;
  if (!direct_kind(cur, to)) {
    moves.push_back(Move{i, cur, Replicate{}});
    cur = Replicate{};
  }
  moves.push_back(Move{i, cur, to});
  cur = to;
}

std::vector<Move> greedy_moves(Placements state, const Placements& target,
                               const std::vector<int64_t>& mesh_shape, bool reduce_partials_first,
                               bool zero_fill) {
  std::vector<Move> moves;
  const int n = static_cast<int>(state.size());
  if (reduce_partials_first) {
    for (int i = n - 1; i >= 0; --i) {
      if (is_partial(state[static_cast<size_t>(i)])) push_move(moves, state, i, Replicate{});
    }
  }
  const bool sharded =
      std::any_of(state.begin(), state.end(), [](const Placement& p) { return is_shard(p); });
  if (sharded) {
    for (int i = n - 1; i >= 0; --i) {
      Placement want = target[static_cast<size_t>(i)];
      // Partitions (R -> P) wait for the outer -> inner pass, so that each one happens while
      // the mesh dims after it hold no Partial pieces yet; a sharded dim goes to R now, or
      // (zero_fill) straight to a Partial(sum) by a zero-fill.
      const Placement& cur = state[static_cast<size_t>(i)];
      if (is_partial(want) && !(want == cur) &&
          !(zero_fill && direct_kind(cur, want) == StepKind::LocalZeroFill)) {
        want = Replicate{};
      }
      if (const Shard* s = std::get_if<Shard>(&want)) {
        for (int j = 0; j < i; ++j) {
          if (mesh_shape[static_cast<size_t>(j)] == 1) continue;  // splits nothing
          if (is_shard(state[static_cast<size_t>(j)], s->dim) !=
              is_shard(target[static_cast<size_t>(j)], s->dim)) {
            want = Replicate{};
            break;
          }
        }
      }
      push_move(moves, state, i, want);
    }
  }
  for (int i = 0; i < n; ++i) push_move(moves, state, i, target[static_cast<size_t>(i)]);
  return moves;
}

bool moves_valid(Placements state, const std::vector<Move>& moves,
                 const std::vector<int64_t>& mesh_shape, DType dtype) {
  for (const Move& m : moves) {
    if (!step_valid(state, mesh_shape, dtype, m.mesh_dim, m.to)) return false;
    state[static_cast<size_t>(m.mesh_dim)] = m.to;
  }
  return true;
}

// The first valid of: the greedy order with zero-fills, without them (an early zero-fill's
// Partial(sum) breaks a later partition to product on an outer mesh dim), and both again with
// every source Partial reduced first.
std::vector<Move> greedy_plan(const DTensorSpec& from, const Placements& target) {
  for (const bool reduce_partials_first : {false, true}) {
    for (const bool zero_fill : {true, false}) {
      std::vector<Move> moves = greedy_moves(from.placements(), target, from.mesh_shape(),
                                             reduce_partials_first, zero_fill);
      if (moves_valid(from.placements(), moves, from.mesh_shape(), from.dtype())) return moves;
    }
  }
  SPMD_CHECK_MSG(false, "greedy redistribute plan {} -> {} has an invalid step",
                 to_string(from.placements()), to_string(target));
  return {};
}

// ---- the min-cost planner --------------------------------------------------------------------

// Cost added per step so that equally cheap routes prefer fewer steps.
constexpr double kStepEpsilonUs = 1e-3;
constexpr uint64_t kMaxStates = 200000;

std::optional<std::vector<Move>> min_cost_plan(const DTensorSpec& from, const Placements& target,
                                               const CostContext& cost) {
  // The placements a mesh dim may take on the way.
  std::vector<Placement> options = {Replicate{}};
  for (int d = 0; d < from.ndim(); ++d) options.push_back(Shard{d});
  auto add_option = [&](const Placement& p) {
    if (std::find(options.begin(), options.end(), p) == options.end()) options.push_back(p);
  };
  for (const Placement& p : from.placements()) add_option(p);
  for (const Placement& p : target) add_option(p);
  const int n = from.mesh_ndim();
  const uint64_t base = options.size();
  uint64_t num_states = 1;
  for (int i = 0; i < n; ++i) {
    num_states *= base;
    if (num_states > kMaxStates) return std::nullopt;
  }
  auto index_of = [&](const Placement& p) {
    return static_cast<uint64_t>(std::find(options.begin(), options.end(), p) - options.begin());
  };
  auto encode = [&](const Placements& state) {
    uint64_t id = 0;
    for (int i = n - 1; i >= 0; --i) id = id * base + index_of(state[static_cast<size_t>(i)]);
    return id;
  };
  auto decode = [&](uint64_t id) {
    Placements state(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      state[static_cast<size_t>(i)] = options[id % base];
      id /= base;
    }
    return state;
  };
  const uint64_t start = encode(from.placements());
  const uint64_t goal = encode(target);
  std::vector<double> dist(num_states, std::numeric_limits<double>::infinity());
  std::vector<uint64_t> prev(num_states, UINT64_MAX);
  using Entry = std::pair<double, uint64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  dist[start] = 0.0;
  queue.push({0.0, start});
  while (!queue.empty()) {
    auto [d, id] = queue.top();
    queue.pop();
    if (d > dist[id]) continue;
    if (id == goal) break;
    const Placements state = decode(id);
    for (int i = 0; i < n; ++i) {
      for (const Placement& to : options) {
        if (!step_valid(state, from.mesh_shape(), from.dtype(), i, to)) continue;
        double w = kStepEpsilonUs;
        if (from.mesh_shape()[static_cast<size_t>(i)] > 1) w += cost.step(state, i, to).cost_us;
        Placements next = state;
        next[static_cast<size_t>(i)] = to;
        const uint64_t nid = encode(next);
        if (d + w < dist[nid]) {
          dist[nid] = d + w;
          prev[nid] = id;
          queue.push({d + w, nid});
        }
      }
    }
  }
  if (!std::isfinite(dist[goal])) return std::nullopt;
  std::vector<Move> moves;
  for (uint64_t id = goal; id != start; id = prev[id]) {
    const Placements a = decode(prev[id]);
    const Placements b = decode(id);
    for (int i = 0; i < n; ++i) {
      if (!(a[static_cast<size_t>(i)] == b[static_cast<size_t>(i)])) {
        moves.push_back(Move{i, a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]});
      }
    }
  }
  std::reverse(moves.begin(), moves.end());
  return moves;
}

// ---- plans -----------------------------------------------------------------------------------

RedistributePlan make_plan(const DTensorSpec& from, const DTensorSpec& to,
                           RedistributePlanner planner) {
  CostContext cost(from);
  auto to_steps = [&](const std::vector<Move>& moves) {
    std::vector<RedistributeStep> steps;
    Placements state = from.placements();
    for (const Move& m : moves) {
      if (from.mesh_shape()[static_cast<size_t>(m.mesh_dim)] > 1) {
        steps.push_back(cost.step(state, m.mesh_dim, m.to));
      }
      state[static_cast<size_t>(m.mesh_dim)] = m.to;
    }
    return steps;
  };
  auto total = [](const std::vector<RedistributeStep>& steps) {
    double sum = 0.0;
    for (const RedistributeStep& s : steps) sum += s.cost_us;
    return sum;
  };
  RedistributePlan plan;
  plan.planner = planner;
  plan.from = from.placements();
  plan.to = to.placements();
  plan.source = std::make_shared<const DTensorSpec>(from);
  plan.steps = to_steps(greedy_plan(from, to.placements()));
  plan.cost_us = total(plan.steps);
  if (planner == RedistributePlanner::MinCost) {
    if (auto moves = min_cost_plan(from, to.placements(), cost)) {
      std::vector<RedistributeStep> steps = to_steps(*moves);
      const double c = total(steps);
      // Keep the greedy plan unless strictly cheaper: plans stay predictable.
      if (c < plan.cost_us - 1e-9 * std::max(1.0, plan.cost_us)) {
        plan.steps = std::move(steps);
        plan.cost_us = c;
      }
    }
  }
  return plan;
}

void check_compatible(const DTensorSpec& from, const DTensorSpec& to) {
  if (!(from.mesh() == to.mesh())) {
    throw_error<PlacementError>(
        "redistribute: cannot redistribute {} to {}: the meshes differ: {} (cross-mesh "
        "redistribution is not supported)",
        from, to, from.mesh().difference(to.mesh()));
  }
  if (from.shape() != to.shape() || from.dtype() != to.dtype()) {
    throw_error<PlacementError>(
        "redistribute: cannot redistribute {} to {}: mesh, shape and dtype must be the same "
        "(cross-mesh redistribution is not supported)",
        from, to);
  }
}

// ---- the plan cache --------------------------------------------------------------------------

struct PlanKeyView {
  const DTensorSpec* from;
  const DTensorSpec* to;
  RedistributePlanner planner;
  const Topology* topology;
  std::size_t hash;
};

struct PlanKey {
  SpecPtr from;
  SpecPtr to;
  RedistributePlanner planner;
  Topology topology;
  std::size_t hash;
};

struct PlanKeyHash {
  using is_transparent = void;
  std::size_t operator()(const PlanKey& k) const { return k.hash; }
  std::size_t operator()(const PlanKeyView& k) const { return k.hash; }
};

struct PlanKeyEq {
  using is_transparent = void;
  static bool same(const DTensorSpec& a, const DTensorSpec& b) { return a == b; }
  bool operator()(const PlanKey& a, const PlanKey& b) const {
    return a.hash == b.hash && a.planner == b.planner && same(*a.from, *b.from) &&
           same(*a.to, *b.to) && a.topology == b.topology;
  }
  bool operator()(const PlanKeyView& a, const PlanKey& b) const {
    return a.hash == b.hash && a.planner == b.planner && same(*a.from, *b.from) &&
           same(*a.to, *b.to) && *a.topology == b.topology;
  }
  bool operator()(const PlanKey& a, const PlanKeyView& b) const { return (*this)(b, a); }
};

struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::shared_ptr<const RedistributePlan>, PlanKeyHash, PlanKeyEq> map;
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> misses{0};
};

PlanCache& plan_cache() {
  static PlanCache* cache = [] {
    // Each new world drops the entries (Note [Caches and worlds] in world/world.h).
    add_new_world_listener([] { drop_cache_entries(plan_cache()); });
    return new PlanCache();  // never destroyed: used from static destructors
  }();
  return *cache;
}

}  // namespace

std::shared_ptr<const RedistributePlan> cached_redistribute_plan(const DTensorSpec& from,
                                                                 const DTensorSpec& to,
                                                                 RedistributePlanner planner) {
  check_planner(planner, "plan_redistribute");
  const Topology& topology = from.mesh().world().topology();
  std::size_t hash = from.hash();
  hash_combine(hash, to.hash());
  hash_combine(hash, static_cast<int>(planner));
  const PlanKeyView view{&from, &to, planner, &topology, hash};
  PlanCache& cache = plan_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.map.find(view);
    if (it != cache.map.end()) {
      cache.hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  check_compatible(from, to);
  auto plan = std::make_shared<const RedistributePlan>(make_plan(from, to, planner));
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.misses.fetch_add(1, std::memory_order_relaxed);
  PlanKey key{std::make_shared<const DTensorSpec>(from), std::make_shared<const DTensorSpec>(to),
              planner, topology, hash};
  return cache.map.emplace(std::move(key), std::move(plan)).first->second;
}

RedistributePlan plan_redistribute(const DTensorSpec& from, const DTensorSpec& to,
                                   RedistributePlanner planner) {
  return *cached_redistribute_plan(from, to, planner);
}

RedistributePlan plan_redistribute(const DTensorSpec& from, const DTensorSpec& to) {
  return plan_redistribute(from, to, default_redistribute_planner());
}

double redistribute_cost(const DTensorSpec& from, const DTensorSpec& to) {
  return cached_redistribute_plan(from, to, default_redistribute_planner())->cost_us;
}

CacheStats redistribute_cache_stats() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return CacheStats{cache.hits.load(), cache.misses.load(), static_cast<int64_t>(cache.map.size())};
}

void clear_redistribute_cache() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.map.clear();
  cache.hits = 0;
  cache.misses = 0;
}

std::string RedistributePlan::to_string() const {
  std::string out;
  if (source) {
    out = fmt::format("RedistributePlan {} -> {} {} {} on {}: {}, {} step{}, {:.1f} us",
                      spmd::to_string(from), spmd::to_string(to), shape_str(source->shape()),
                      source->dtype(), source->mesh().to_string(), planner_name(planner),
                      steps.size(), steps.size() == 1 ? "" : "s", cost_us);
  } else {
    out = fmt::format("RedistributePlan {} -> {}: {}, {} steps, {:.1f} us", spmd::to_string(from),
                      spmd::to_string(to), planner_name(planner), steps.size(), cost_us);
  }
  for (const RedistributeStep& s : steps) {
    std::string dim = "mesh dim " + std::to_string(s.mesh_dim);
    if (source && source->mesh().has_dim_names()) {
      dim += fmt::format(" ({})", source->mesh().dim_name(s.mesh_dim));
    }
    out += fmt::format("\n  {}: {:>6} -> {:<6} {:<16} {:>10} B {:>9.1f} us", dim,
                       spmd::to_string(s.from), spmd::to_string(s.to), step_kind_name(s.kind),
                       s.bytes, s.cost_us);
  }
  return out;
}

std::ostream& operator<<(std::ostream& os, const RedistributePlan& plan) {
  return os << plan.to_string();
}

// ---- execution -------------------------------------------------------------------------------

Tensor partition_local(const Tensor& block, const DTensorSpec& spec,
                       const std::vector<int64_t>& coordinate) {
  Tensor out = block;
  for (int i = 0; i < spec.mesh_ndim(); ++i) {
    const Partial* p = std::get_if<Partial>(&spec.placements()[static_cast<size_t>(i)]);
    const int64_t k = spec.mesh_shape()[static_cast<size_t>(i)];
    if (p == nullptr || k == 1) continue;
    const bool first = coordinate[static_cast<size_t>(i)] == 0;
    if (p->op == ReduceOp::Sum) {
      if (is_floating(out.dtype())) {
        out = out / static_cast<double>(k);
      } else if (!first) {
        out = zeros(out.shape(), out.dtype(), out.device());
      }
    } else if (p->op == ReduceOp::Product && !first) {
      out = ones(out.shape(), out.dtype(), out.device());
    }
  }
  return out;
}

namespace {

// Size of tensor dim d on the rank at `coordinate` once the mesh dims before `mesh_dim` have
// sharded it as `state` says.
int64_t logical_size(const Placements& state, const DTensorSpec& spec,
                     const std::vector<int64_t>& coordinate, int d, int mesh_dim) {
  int64_t n = spec.shape()[static_cast<size_t>(d)];
  for (int j = 0; j < mesh_dim; ++j) {
    if (is_shard(state[static_cast<size_t>(j)], d)) {
      n = shard_size(n, spec.mesh_shape()[static_cast<size_t>(j)],
                     coordinate[static_cast<size_t>(j)]);
    }
  }
  return n;
}

// One value per held rank, in info.ranks order, which is the order of the LocalTensor's shards
// (execute_redistribute checks it).
using RankValues = std::vector<int64_t>;

template <class F>
RankValues per_rank(const DTensorSpec::RankInfo& info, F&& fn) {
  RankValues values;
  values.reserve(info.ranks.size());
  for (size_t r = 0; r < info.ranks.size(); ++r) values.push_back(fn(r));
  return values;
}

bool is_uniform(const RankValues& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
}

// fn(shard, r) for the shard of every held rank r; once when `amount` is uniform (so that a
// replicated LocalTensor stays one buffer).
LocalTensor per_shard(const LocalTensor& x, const RankValues& amount,
                      const std::function<Tensor(const Tensor&, int64_t)>& fn) {
  if (is_uniform(amount)) {
    if (amount.front() == 0) return x;
    return x.apply([&](const Tensor& t) { return fn(t, amount.front()); });
  }
  std::vector<Tensor> out;
  out.reserve(x.num_shards());
  for (size_t r = 0; r < x.num_shards(); ++r) out.push_back(fn(x.shard_at(r), amount[r]));
  return LocalTensor(x, std::move(out));
}

LocalTensor pad_after(const LocalTensor& x, int d, const RankValues& amount) {
  return per_shard(x, amount, [d](const Tensor& t, int64_t n) { return pad(t, d, 0, n); });
}

LocalTensor unpad_after(const LocalTensor& x, int d, const RankValues& amount) {
  return per_shard(x, amount, [d](const Tensor& t, int64_t n) { return unpad(t, d, 0, n); });
}

LocalTensor run_step(const LocalTensor& x, const DTensorSpec& spec,
                     const DTensorSpec::RankInfo& info, const Placements& state,
                     const RedistributeStep& step) {
  const int i = step.mesh_dim;
  const DeviceMesh& mesh = spec.mesh();
  const int64_t k = spec.mesh_shape()[static_cast<size_t>(i)];
  auto coord = [&](size_t r) { return info.coordinates[r][static_cast<size_t>(i)]; };
  auto logical = [&](int d) {
    // Unsharded by the mesh dims before i: the global size on every rank, without walking them.
    bool sharded_before = false;
    for (int j = 0; j < i; ++j) sharded_before = sharded_before || is_shard(state[j], d);
    if (!sharded_before) return RankValues(info.ranks.size(), spec.shape()[static_cast<size_t>(d)]);
    return per_rank(info,
                    [&](size_t r) { return logical_size(state, spec, info.coordinates[r], d, i); });
  };
  // Every rank's dim splits evenly into k chunks: no padding anywhere.
  auto even = [&](const RankValues& len) { return is_uniform(len) && len.front() % k == 0; };
  // Padding a piece up to the chunk capacity, and the whole dim up to k chunks.
  auto to_capacity = [&](const RankValues& len) {
    if (even(len)) return RankValues(len.size(), 0);
    return per_rank(info, [&](size_t r) {
      return shard_capacity(len[r], k) - shard_size(len[r], k, coord(r));
    });
  };
  auto to_k_chunks = [&](const RankValues& len) {
    if (even(len)) return RankValues(len.size(), 0);
    return per_rank(info, [&](size_t r) { return k * shard_capacity(len[r], k) - len[r]; });
  };
  switch (step.kind) {
    case StepKind::AllGather: {
      const int d = std::get<Shard>(step.from).dim;
      const RankValues len = logical(d);
      LocalTensor y = all_gather(pad_after(x, d, to_capacity(len)), mesh, i, d);
      return unpad_after(y, d, to_k_chunks(len));
    }
    case StepKind::LocalChunk: {
      const int d = std::get<Shard>(step.to).dim;
      const RankValues len = logical(d);
      if (x.has_classes() && even(len)) {
        // Note [Shard classes]: shape-only chunks of one size are equal wherever they start.
        const int64_t size = len.front() / k;
        return x.apply([&](const Tensor& t) { return t.narrow(d, 0, size); });
      }
      std::vector<Tensor> out;
      out.reserve(x.num_shards());
      for (size_t r = 0; r < x.num_shards(); ++r) {
        out.push_back(x.shard_at(r).narrow(d, shard_offset(len[r], k, coord(r)),
                                           shard_size(len[r], k, coord(r))));
      }
      return LocalTensor(x, std::move(out));
    }
    case StepKind::AllToAll: {
      const int a = std::get<Shard>(step.from).dim;
      const int b = std::get<Shard>(step.to).dim;
      const RankValues len_a = logical(a);
      const RankValues len_b = logical(b);
      LocalTensor y = pad_after(pad_after(x, a, to_capacity(len_a)), b, to_k_chunks(len_b));
      y = all_to_all(y, mesh, i, /*split_dim=*/b, /*concat_dim=*/a);
      return unpad_after(unpad_after(y, a, to_k_chunks(len_a)), b, to_capacity(len_b));
    }
    case StepKind::AllReduce:
      return all_reduce(x, mesh, i, std::get<Partial>(step.from).op);
    case StepKind::ReduceScatter: {
      const int d = std::get<Shard>(step.to).dim;
      const RankValues len = logical(d);
      LocalTensor y = reduce_scatter(pad_after(x, d, to_k_chunks(len)), mesh, i,
                                     std::get<Partial>(step.from).op, d);
      return unpad_after(y, d, to_capacity(len));
    }
    case StepKind::LocalZeroFill: {
      const int d = std::get<Shard>(step.from).dim;
      const RankValues len = logical(d);
      const double identity = is_floating(x.dtype()) ? -0.0 : 0.0;
      std::vector<Tensor> out;
      out.reserve(x.num_shards());
      for (size_t r = 0; r < x.num_shards(); ++r) {
        const int64_t offset = shard_offset(len[r], k, coord(r));
        const int64_t after = len[r] - offset - shard_size(len[r], k, coord(r));
        out.push_back(pad(x.shard_at(r), d, offset, after, identity));
      }
      return LocalTensor(x, std::move(out));
    }
    case StepKind::LocalPartition: {
      const ReduceOp op = std::get<Partial>(step.to).op;
      if (op == ReduceOp::Avg || op == ReduceOp::Min || op == ReduceOp::Max) return x;
      if (op == ReduceOp::Sum && is_floating(x.dtype())) return x / static_cast<double>(k);
      const bool sum = op == ReduceOp::Sum;
      std::vector<Tensor> out;
      out.reserve(x.num_shards());
      for (size_t r = 0; r < x.num_shards(); ++r) {
        const Tensor& t = x.shard_at(r);
        if (coord(r) == 0) {
          out.push_back(t);
        } else {
          out.push_back(sum ? zeros(t.shape(), t.dtype(), t.device())
                            : ones(t.shape(), t.dtype(), t.device()));
        }
      }
      return LocalTensor(x, std::move(out));
    }
  }
  SPMD_CHECK_MSG(false, "unknown step kind");
  return x;
}

}  // namespace

void create_plan_communicators(const RedistributePlan& plan) {
  for (const RedistributeStep& step : plan.steps) {
    const bool collective = step.kind == StepKind::AllGather || step.kind == StepKind::AllReduce ||
                            step.kind == StepKind::ReduceScatter || step.kind == StepKind::AllToAll;
    if (collective) (void)communicator(plan.source->mesh(), step.mesh_dim);
  }
}

LocalTensor execute_redistribute(const LocalTensor& local, const DTensorSpec& from,
                                 const RedistributePlan& plan) {
  if (plan.steps.empty()) return local;
  const DTensorSpec::RankInfo& info = from.rank_info();
  if (local.ranks_ptr() == nullptr || local.ranks() != info.ranks) {
    throw_error<PlacementError>(
        "redistribute: the local tensor holds ranks {} but the mesh {} has held ranks {}",
        ranks_str(local.defined() ? local.ranks() : std::vector<int>{}), from.mesh().to_string(),
        ranks_str(info.ranks));
  }
  Placements state = from.placements();
  LocalTensor x = local;
  for (const RedistributeStep& step : plan.steps) {
    x = run_step(x, from, info, state, step);
    state[static_cast<size_t>(step.mesh_dim)] = step.to;
  }
  return x;
}

}  // namespace spmd
