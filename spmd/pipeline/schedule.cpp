// spmd/pipeline/schedule.cpp: the four schedules' orders (Note [Pipeline schedules] in
// pipeline/schedule.h) and validate().
#include <spmd/pipeline/schedule.h>

#include <algorithm>
#include <cstdint>
#include <ostream>

#include <spmd/core/error.h>
#include <spmd/pipeline/timeline.h>

namespace spmd::pipeline {

char kind_letter(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return 'F';
    case ActionKind::Backward:
      return 'B';
    case ActionKind::BackwardInput:
      return 'I';
    case ActionKind::BackwardWeight:
      return 'W';
  }
  return '?';
}

std::string to_string(const Action& action) {
  return fmt::format("{}(stage {}, mb {})", kind_letter(action.kind), action.stage,
                     action.microbatch);
}

std::ostream& operator<<(std::ostream& os, const Action& action) {
  return os << to_string(action);
}

int Schedule::rank_of_stage(int stage) const {
  if (ranks < 1 || virtual_stages < 1 || stage < 0 ||
      stage >= std::int64_t{ranks} * virtual_stages) {
    throw_error<ConfigError>(
        "rank_of_stage({}): schedule '{}' has {} ranks x {} virtual stages, so stages 0..{}", stage,
        name, ranks, virtual_stages, std::int64_t{ranks} * virtual_stages - 1);
  }
  return stage % ranks;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zb"};
  return names;
}

namespace {

// More (stage, microbatch) pairs than this is not a pipeline anyone runs: refused before the
// lists are allocated.
constexpr std::int64_t kMaxPairs = std::int64_t{1} << 24;

Action forward(int stage, int microbatch) {
  return {ActionKind::Forward, stage, microbatch};
}

// One stage per rank (gpipe, 1f1b, zb): rank r runs stage r.
std::vector<Action> gpipe_rank(int rank, int microbatches) {
  std::vector<Action> out;
  for (int m = 0; m < microbatches; ++m) out.push_back(forward(rank, m));
  for (int m = 0; m < microbatches; ++m) out.push_back({ActionKind::Backward, rank, m});
  return out;
}

// 1F1B, and with `split` ZB-H1: warm-up forwards, then F(warmup + j) before each backward j, the
// remaining backwards last. Split: backward j is I(j), followed from j = rank on by W(j - rank);
// the last `rank` W's come after every I.
std::vector<Action> one_f_one_b_rank(int ranks, int rank, int microbatches, bool split) {
  const int warmup = std::min(ranks - 1 - rank, microbatches);
  const ActionKind backward = split ? ActionKind::BackwardInput : ActionKind::Backward;
  std::vector<Action> out;
  for (int m = 0; m < warmup; ++m) out.push_back(forward(rank, m));
  for (int j = 0; j < microbatches; ++j) {
    if (warmup + j < microbatches) out.push_back(forward(rank, warmup + j));
    out.push_back({backward, rank, j});
    if (split && j >= rank) out.push_back({ActionKind::BackwardWeight, rank, j - rank});
  }
  if (split) {
    for (int m = std::max(microbatches - rank, 0); m < microbatches; ++m) {
      out.push_back({ActionKind::BackwardWeight, rank, m});
    }
  }
  return out;
}

// Interleaved 1F1B with rounds of `group` microbatches: the k-th forward of the rank runs chunk
// (k / group) % v, the j-th backward chunk v - 1 - (j / group) % v, each chunk's microbatches in
// order; after the warm-up, each forward is followed by the next backward.
std::vector<Action> interleaved_rank(int ranks, int rank, int microbatches, int virtual_stages,
                                     int group) {
  const int total = virtual_stages * microbatches;
  const int warmup = std::min((virtual_stages - 1) * group + 2 * (ranks - 1 - rank), total);
  std::vector<int> next_forward(virtual_stages, 0);
  std::vector<int> next_backward(virtual_stages, 0);
  std::vector<Action> out;
  auto push_forward = [&](int k) {
    const int chunk = (k / group) % virtual_stages;
    out.push_back(forward(chunk * ranks + rank, next_forward[chunk]++));
  };
  auto push_backward = [&](int j) {
    const int chunk = virtual_stages - 1 - (j / group) % virtual_stages;
    out.push_back({ActionKind::Backward, chunk * ranks + rank, next_backward[chunk]++});
  };
  for (int k = 0; k < warmup; ++k) push_forward(k);
  for (int j = 0; j < total; ++j) {
    if (warmup + j < total) push_forward(warmup + j);
    push_backward(j);
  }
  return out;
}

// The microbatch counts near `microbatches` that interleaved accepts for `ranks`.
std::string interleaved_counts_near(int ranks, int microbatches) {
  auto ok = [&](int m) { return m % std::max(1, m / ranks) == 0; };
  int below = microbatches - 1;
  while (below > 0 && !ok(below)) --below;
  int above = microbatches + 1;
  while (!ok(above)) ++above;
  return below > 0 ? fmt::format("{} or {}", below, above) : fmt::format("{}", above);
}

}  // namespace

namespace detail {

void check_sizes(std::string_view what, std::string_view name, int ranks, int microbatches,
                 int virtual_stages) {
  if (ranks < 1) {
    throw_error<ConfigError>("{}('{}'): ranks = {}; a pipeline needs at least 1 rank", what, name,
                             ranks);
  }
  if (microbatches < 1) {
    throw_error<ConfigError>("{}('{}'): microbatches = {}; a pipeline needs at least 1", what, name,
                             microbatches);
  }
  if (virtual_stages < 1) {
    throw_error<ConfigError>("{}('{}'): virtual_stages = {}; each rank needs at least 1 stage",
                             what, name, virtual_stages);
  }
  const std::int64_t pairs = std::int64_t{ranks} * virtual_stages * microbatches;
  if (pairs > kMaxPairs) {
    throw_error<ConfigError>(
        "{}('{}'): {} ranks x {} virtual stages x {} microbatches = {} (stage, microbatch) pairs, "
        "more than the {} a schedule may have",
        what, name, ranks, virtual_stages, microbatches, pairs, kMaxPairs);
  }
}

}  // namespace detail

Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages,
                       SourceLocation loc) {
  UserCallSite site(loc);
  const std::string text(name);
  const auto& names = schedule_names();
  if (std::find(names.begin(), names.end(), text) == names.end()) {
    throw_error<ConfigError>("make_schedule: unknown schedule '{}'; the schedules are {}", text,
                             quoted_list(names));
  }
  detail::check_sizes("make_schedule", text, ranks, microbatches, virtual_stages);
  if (text != "interleaved" && virtual_stages != 1) {
    throw_error<ConfigError>(
        "make_schedule('{}'): virtual_stages = {}, but {} runs one stage per rank; 'interleaved' "
        "runs several",
        text, virtual_stages, text);
  }
  Schedule schedule{text, ranks, microbatches, virtual_stages, {}};
  const int rounds = std::max(1, microbatches / ranks);
  if (text == "interleaved" && microbatches % rounds != 0) {
    throw_error<ConfigError>(
        "make_schedule('interleaved'): microbatches = {} with {} ranks: interleaved 1F1B runs the "
        "microbatches in max(1, microbatches / ranks) = {} rounds of equal size, and {} is not a "
        "multiple of {} (PyTorch's ScheduleInterleaved1F1B rule); {} microbatches would do",
        microbatches, ranks, rounds, microbatches, rounds,
        interleaved_counts_near(ranks, microbatches));
  }
  for (int r = 0; r < ranks; ++r) {
    if (text == "gpipe") {
      schedule.actions.push_back(gpipe_rank(r, microbatches));
    } else if (text == "1f1b" || text == "zb") {
      schedule.actions.push_back(one_f_one_b_rank(ranks, r, microbatches, text == "zb"));
    } else {
      schedule.actions.push_back(
          interleaved_rank(ranks, r, microbatches, virtual_stages, microbatches / rounds));
    }
  }
  return schedule;
}

void validate(const Schedule& schedule, SourceLocation loc) {
  UserCallSite site(loc);
  detail::run(schedule, Costs{}, "validate");
}

}  // namespace spmd::pipeline
