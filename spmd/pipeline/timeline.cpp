// spmd/pipeline/timeline.cpp: the checks of a Schedule, its simulation on the cost model, and the
// picture of the result (Note [Pipeline schedules] in pipeline/schedule.h).
#include <spmd/pipeline/timeline.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include <spmd/core/check.h>
#include <spmd/core/error.h>

namespace spmd::pipeline {

double Costs::of(ActionKind kind) const {
  switch (kind) {
    case ActionKind::Forward:
      return forward;
    case ActionKind::Backward:
      return backward;
    case ActionKind::BackwardInput:
      return backward_input;
    case ActionKind::BackwardWeight:
      return backward_weight;
  }
  return 0;
}

namespace {

constexpr int kKinds = 4;
constexpr int kNowhere = -1;

// Where each action of a schedule sits: its position in its rank's list, per kind and (stage,
// microbatch) pair, kNowhere when no rank runs it. Built by checking the schedule's structure.
class Index {
 public:
  Index(const Schedule& schedule, std::string_view what)
      : s_(schedule), what_(what), pos_(kKinds * static_cast<size_t>(pairs()), kNowhere) {
    check_lists();
    check_pairs();
    check_local_order();
  }

  int pairs() const { return s_.stages() * s_.microbatches; }
  int pair(int stage, int microbatch) const { return stage * s_.microbatches + microbatch; }
  int position(ActionKind kind, int stage, int microbatch) const {
    return pos_[slot(kind, pair(stage, microbatch))];
  }
  int position(const Action& a) const { return position(a.kind, a.stage, a.microbatch); }

  // The input gradient of (stage, microbatch): B or I, whichever the schedule runs.
  Action gradient(int stage, int microbatch) const {
    const ActionKind kind = position(ActionKind::Backward, stage, microbatch) != kNowhere
                                ? ActionKind::Backward
                                : ActionKind::BackwardInput;
    return {kind, stage, microbatch};
  }

  // What `a` needs besides its rank's earlier actions being done: nothing for F of stage 0.
  std::optional<Action> need(const Action& a) const {
    switch (a.kind) {
      case ActionKind::Forward:
        if (a.stage == 0) return std::nullopt;
        return forward_of(a.stage - 1, a.microbatch);
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
        if (a.stage == s_.stages() - 1) return forward_of(a.stage, a.microbatch);
        return gradient(a.stage + 1, a.microbatch);
      case ActionKind::BackwardWeight:
        return Action{ActionKind::BackwardInput, a.stage, a.microbatch};
    }
    return std::nullopt;
  }

  // "validate('1f1b'): " or, for a hand-built schedule without a name, "validate: ".
  std::string prefix() const {
    return s_.name.empty() ? fmt::format("{}: ", what_) : fmt::format("{}('{}'): ", what_, s_.name);
  }

 private:
  static Action forward_of(int stage, int microbatch) {
    return {ActionKind::Forward, stage, microbatch};
  }
  int slot(ActionKind kind, int pair) const { return static_cast<int>(kind) * pairs() + pair; }

  void check_lists() {
    if (static_cast<int>(s_.actions.size()) != s_.ranks) {
      throw_error<ConfigError>("{}the schedule has {} action lists for {} ranks", prefix(),
                               s_.actions.size(), s_.ranks);
    }
    for (int r = 0; r < s_.ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int k = 0; k < static_cast<int>(list.size()); ++k) {
        const Action& a = list[k];
        if (a.stage < 0 || a.stage >= s_.stages()) {
          throw_error<ConfigError>("{}rank {}'s action {}, {}: stage {} is outside 0..{}", prefix(),
                                   r, k, a, a.stage, s_.stages() - 1);
        }
        if (a.microbatch < 0 || a.microbatch >= s_.microbatches) {
          throw_error<ConfigError>("{}rank {}'s action {}, {}: microbatch {} is outside 0..{}",
                                   prefix(), r, k, a, a.microbatch, s_.microbatches - 1);
        }
        if (s_.rank_of_stage(a.stage) != r) {
          throw_error<ConfigError>("{}rank {}'s action {}, {}: stage {} is on rank {}", prefix(), r,
                                   k, a, a.stage, s_.rank_of_stage(a.stage));
        }
        int& at = pos_[slot(a.kind, pair(a.stage, a.microbatch))];
        if (at != kNowhere) {
          throw_error<ConfigError>("{}rank {} runs {} twice: its actions {} and {}", prefix(), r, a,
                                   at, k);
        }
        at = k;
      }
    }
  }

  void check_pairs() const {
    for (int stage = 0; stage < s_.stages(); ++stage) {
      const int r = s_.rank_of_stage(stage);
      for (int m = 0; m < s_.microbatches; ++m) {
        auto has = [&](ActionKind kind) { return position(kind, stage, m) != kNowhere; };
        auto named = [&](ActionKind kind) { return Action{kind, stage, m}; };
        if (!has(ActionKind::Forward)) {
          throw_error<ConfigError>("{}rank {} never runs {}", prefix(), r,
                                   named(ActionKind::Forward));
        }
        const bool b = has(ActionKind::Backward);
        const bool i = has(ActionKind::BackwardInput);
        const bool w = has(ActionKind::BackwardWeight);
        if (b && (i || w)) {
          throw_error<ConfigError>(
              "{}rank {} runs both {} and {}: a backward is either B, or I and W", prefix(), r,
              named(ActionKind::Backward),
              named(i ? ActionKind::BackwardInput : ActionKind::BackwardWeight));
        }
        if (!b && !i && !w) {
          throw_error<ConfigError>(
              "{}rank {} runs no backward of stage {}, mb {}: neither {} nor {} and {}", prefix(),
              r, stage, m, named(ActionKind::Backward), named(ActionKind::BackwardInput),
              named(ActionKind::BackwardWeight));
        }
        if (i != w) {
          throw_error<ConfigError>(
              "{}rank {} runs {} but never {}: a split backward needs both", prefix(), r,
              named(i ? ActionKind::BackwardInput : ActionKind::BackwardWeight),
              named(i ? ActionKind::BackwardWeight : ActionKind::BackwardInput));
        }
      }
    }
  }

  // Each rank runs what an action needs from its own rank before the action: F(s, m) before B or
  // I of (s, m), I before W, and the neighbouring stage's action when that stage is on the rank.
  void check_local_order() const {
    for (int r = 0; r < s_.ranks; ++r) {
      const auto& list = s_.actions[r];
      for (int k = 0; k < static_cast<int>(list.size()); ++k) {
        const Action& a = list[k];
        std::vector<Action> local;
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) {
          local.push_back(forward_of(a.stage, a.microbatch));
        }
        if (std::optional<Action> n = need(a); n && s_.rank_of_stage(n->stage) == r) {
          local.push_back(*n);
        }
        for (const Action& n : local) {
          const int at = position(n);
          if (at > k) {
            throw_error<ConfigError>(
                "{}rank {} runs {} (its action {}) before {} (its action {}), which it needs",
                prefix(), r, a, k, n, at);
          }
        }
      }
    }
  }

  const Schedule& s_;
  std::string_view what_;
  std::vector<int> pos_;
};

void check_costs(const Costs& costs, const std::string& prefix) {
  const std::pair<const char*, double> fields[] = {{"forward", costs.forward},
                                                   {"backward", costs.backward},
                                                   {"backward_input", costs.backward_input},
                                                   {"backward_weight", costs.backward_weight},
                                                   {"latency", costs.latency}};
  for (const auto& [field, value] : fields) {
    if (!std::isfinite(value) || value < 0) {
      throw_error<ConfigError>("{}costs.{} = {}; a cost is a finite time >= 0", prefix, field,
                               value);
    }
  }
}

// The deadlock report: what each rank waits for, and the cycle of ranks waiting on each other.
// Every rank is stuck in a deadlock (a finished rank has run all its stages' backwards, which
// needed every forward and every later backward, so nothing else can be waiting either), and each
// waits on one other rank, so following the waits from rank 0 reaches the cycle.
[[noreturn]] void throw_deadlock(const Schedule& s, const Index& index,
                                 const std::vector<int>& next) {
  std::vector<int> waits_on(s.ranks);
  std::string lines;
  for (int r = 0; r < s.ranks; ++r) {
    SPMD_CHECK_LT(next[r], static_cast<int>(s.actions[r].size()));
    const Action& a = s.actions[r][next[r]];
    const Action n = *index.need(a);
    waits_on[r] = s.rank_of_stage(n.stage);
    lines +=
        fmt::format("{}rank {} waits at {} (its action {}) for {} on rank {} (its action {})",
                    lines.empty() ? "" : "; ", r, a, next[r], n, waits_on[r], index.position(n));
  }
  std::vector<int> seen(s.ranks, kNowhere);
  std::vector<int> path;
  int r = 0;
  while (seen[r] == kNowhere) {
    seen[r] = static_cast<int>(path.size());
    path.push_back(r);
    r = waits_on[r];
  }
  std::string cycle;
  for (size_t k = seen[r]; k < path.size(); ++k) cycle += fmt::format("{} -> ", path[k]);
  throw_error<ConfigError>("{}the schedule deadlocks: {}; ranks {}{} wait on each other",
                           index.prefix(), lines, cycle, r);
}

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", 100 * fraction);
}

// The line without trailing spaces, with its newline.
std::string trimmed(std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  return line + '\n';
}

// Microbatch and chunk numbers in one column: 0-9, then a-z.
char digit(int n) {
  n %= 36;
  return static_cast<char>(n < 10 ? '0' + n : 'a' + (n - 10));
}

}  // namespace

namespace detail {

Timeline run(const Schedule& s, const Costs& costs, std::string_view what) {
  check_sizes(what, s.name, s.ranks, s.microbatches, s.virtual_stages);
  const Index index(s, what);
  check_costs(costs, index.prefix());

  // End times of forwards and input gradients (B or I), per pair; NaN until done.
  const double kPending = std::nan("");
  std::vector<double> forward_end(index.pairs(), kPending);
  std::vector<double> gradient_end(index.pairs(), kPending);
  std::vector<double> free_at(s.ranks, 0);
  std::vector<int> next(s.ranks, 0);
  Timeline t{s.name, s.ranks, s.microbatches, s.virtual_stages, costs, {}, 0, 0};
  t.per_rank.resize(s.ranks);

  auto end_of = [&](const Action& a) {
    const int p = index.pair(a.stage, a.microbatch);
    return a.kind == ActionKind::Forward ? forward_end[p] : gradient_end[p];
  };
  // Passes over the ranks, each running every action whose needs are done, until none can go on.
  // An action's needs on its own rank are earlier in its list (the Index checked), so only needs
  // from other ranks can hold a rank up.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = s.actions[r];
      while (next[r] < static_cast<int>(list.size())) {
        const Action& a = list[next[r]];
        double start = free_at[r];
        if (std::optional<Action> n = index.need(a)) {
          const double ready = end_of(*n);
          if (std::isnan(ready)) break;
          const bool remote = s.rank_of_stage(n->stage) != r;
          start = std::max(start, ready + (remote ? costs.latency : 0));
        }
        const double end = start + costs.of(a.kind);
        const int p = index.pair(a.stage, a.microbatch);
        if (a.kind == ActionKind::Forward) forward_end[p] = end;
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) {
          gradient_end[p] = end;
        }
        t.per_rank[r].actions.push_back({a, start, end});
        t.per_rank[r].busy += end - start;
        free_at[r] = end;
        t.makespan = std::max(t.makespan, end);
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    if (next[r] < static_cast<int>(s.actions[r].size())) throw_deadlock(s, index, next);
  }

  double busy = 0;
  for (RankTimeline& rank : t.per_rank) {
    busy += rank.busy;
    // Idle time first, then one division: exact where the times are (small integers).
    rank.idle_fraction = t.makespan > 0 ? (t.makespan - rank.busy) / t.makespan : 0;
    int in_flight = 0;
    int unfinished = 0;
    for (const TimedAction& timed : rank.actions) {
      switch (timed.action.kind) {
        case ActionKind::Forward:
          rank.peak_in_flight = std::max(rank.peak_in_flight, ++in_flight);
          rank.peak_unfinished = std::max(rank.peak_unfinished, ++unfinished);
          break;
        case ActionKind::Backward:
          --in_flight;
          --unfinished;
          break;
        case ActionKind::BackwardInput:
          --in_flight;
          break;
        case ActionKind::BackwardWeight:
          --unfinished;
          break;
      }
    }
  }
  const double capacity = s.ranks * t.makespan;
  t.bubble_fraction = capacity > 0 ? (capacity - busy) / capacity : 0;
  return t;
}

}  // namespace detail

Timeline simulate(const Schedule& schedule, Costs costs, SourceLocation loc) {
  UserCallSite site(loc);
  return detail::run(schedule, costs, "simulate");
}

std::string picture(const Timeline& t, double time_unit) {
  if (!std::isfinite(time_unit) || time_unit <= 0) {
    throw_error<ConfigError>("picture('{}'): time_unit = {}; it must be a finite time > 0", t.name,
                             time_unit);
  }
  const int columns = static_cast<int>(std::ceil(t.makespan / time_unit - 1e-9));
  bool used[kKinds] = {};
  for (const RankTimeline& rank : t.per_rank) {
    for (const TimedAction& timed : rank.actions) used[static_cast<int>(timed.action.kind)] = true;
  }

  std::string out = fmt::format("{}: {} ranks, {} microbatches", t.name, t.ranks, t.microbatches);
  if (t.virtual_stages > 1) out += fmt::format(", {} stages per rank", t.virtual_stages);
  std::string costs;
  for (int k = 0; k < kKinds; ++k) {
    const auto kind = static_cast<ActionKind>(k);
    if (used[k]) costs += fmt::format(" {}={}", kind_letter(kind), t.costs.of(kind));
  }
  if (t.costs.latency > 0) costs += fmt::format(" latency={}", t.costs.latency);
  out += fmt::format("; costs{}; makespan {}, bubble {}\n", costs, t.makespan,
                     percent(t.bubble_fraction));

  const std::string last_label = fmt::format("rank {}", t.ranks - 1);
  const int label = static_cast<int>(last_label.size());
  std::string ruler(columns, ' ');
  for (int c = 0; c < columns; c += 10) {
    const std::string mark = fmt::format("{}", c);
    for (int k = 0; k < static_cast<int>(mark.size()) && c + k < columns; ++k)
      ruler[c + k] = mark[k];
  }
  out += trimmed(fmt::format("{:{}}  {}", "", label, ruler));

  for (int r = 0; r < t.ranks; ++r) {
    std::string kinds(columns, '.');
    std::string microbatches(columns, ' ');
    std::string chunks(columns, ' ');
    for (const TimedAction& timed : t.per_rank[r].actions) {
      // The columns whose middle falls in [start, end).
      const int first = static_cast<int>(std::ceil(timed.start / time_unit - 0.5));
      const int last = std::min(static_cast<int>(std::ceil(timed.end / time_unit - 0.5)), columns);
      for (int c = std::max(first, 0); c < last; ++c) kinds[c] = kind_letter(timed.action.kind);
      if (first < last) {
        microbatches[first] = digit(timed.action.microbatch);
        chunks[first] = digit(timed.action.stage / t.ranks);
      }
    }
    out += fmt::format("{:<{}}  {}  idle {}\n", fmt::format("rank {}", r), label, kinds,
                       percent(t.per_rank[r].idle_fraction));
    out += trimmed(fmt::format("{:>{}}  {}", "mb", label, microbatches));
    if (t.virtual_stages > 1) out += trimmed(fmt::format("{:>{}}  {}", "chunk", label, chunks));
  }

  std::string legend;
  const char* names[kKinds] = {"forward", "backward", "input gradient", "weight gradient"};
  for (int k = 0; k < kKinds; ++k) {
    if (used[k]) {
      legend += fmt::format("{} {}, ", kind_letter(static_cast<ActionKind>(k)), names[k]);
    }
  }
  out += fmt::format("{}. idle; one column per {}\n", legend,
                     time_unit == 1 ? "time unit" : fmt::format("{} time units", time_unit));
  out += fmt::format("mb: each action's microbatch, at its first column{}\n",
                     t.microbatches > 10 ? " (a = 10, b = 11, ...)" : "");
  if (t.virtual_stages > 1) {
    out +=
        fmt::format("chunk: each action's chunk; chunk c of rank r is stage c x {} + r\n", t.ranks);
  }
  return out;
}

}  // namespace spmd::pipeline
