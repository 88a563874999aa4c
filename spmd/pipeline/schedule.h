// spmd/pipeline/schedule.h: pipeline schedules as data: the forwards and backwards each pipeline
// rank runs, in the order it runs them, for GPipe, 1F1B, interleaved 1F1B and zero bubble (ZB-H1).
//
//   Schedule s = make_schedule("1f1b", /*ranks=*/4, /*microbatches=*/8);
//   validate(s);                    // each action once, on its rank, no deadlock: or ConfigError
//   Timeline t = simulate(s);       // pipeline/timeline.h: start and end of every action
//   std::cout << picture(t);        // ranks x time units, F/B/I/W, idle % and the bubble
//
// A schedule is only data: no tensors, no communication. The runtime that runs a model's stages
// by it reads each rank's list; a hand-built Schedule (a new order, a planted bug) goes through
// the same validate and simulate.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/core/format.h>

namespace spmd::pipeline {

// Note [Pipeline schedules]
// The model is cut into ranks * virtual_stages stages, run in a chain: stage s's output is stage
// s+1's input. Virtual stage s lives on pp rank s % ranks (Megatron's loop placement: rank r holds
// stages r, r + ranks, r + 2 ranks, ...; "chunk" c of rank r is stage c * ranks + r). The batch is
// split into microbatches; a schedule lists, per rank, the order in which it runs these actions:
//
//   F(s, m)  forward of stage s on microbatch m       needs F(s-1, m)
//   B(s, m)  backward: input and weight gradients      needs the input gradient of (s+1, m)
//   I(s, m)  input gradient only (zero bubble)         (B or I), or F(s, m) on the last stage
//   W(s, m)  weight gradient only (zero bubble)       needs I(s, m)
//
// Every (stage, microbatch) has one F and either one B or one I and one W, all on the rank that
// holds the stage. Communication is implied: after F(s, m) of a stage that is not the last, its
// activation goes to stage s+1's rank; after B(s, m) or I(s, m) of a stage that is not the first,
// its input gradient goes to stage s-1's rank. W sends nothing, which is what lets zero bubble
// defer it into the bubbles. A rank runs its list in order, each action as soon as the rank is
// free and what the action needs is done (plus a latency when that comes from another rank): the
// simulation of pipeline/timeline.h. Its makespan, bubble (idle time over ranks x makespan) and
// peak activations (pairs whose F has run and whose B or I has not) match these closed forms, for
// p ranks, m microbatches, v stages per rank and the default costs F = 1, B = 2, I = W = 1
// (tests/pipeline/schedule_test.cpp checks each over p <= 8, m <= 16, v <= 3):
//
//   gpipe        every forward, then every backward, in microbatch order. Makespan
//                (m + p - 1)(F + B) for any costs, so the bubble is (p - 1)/(m + p - 1); plus
//                2 (p - 1) latencies. Every rank holds all m microbatches at its peak.
//   1f1b         Megatron's and PyTorch's one-forward-one-backward: rank r warms up with
//                min(p - 1 - r, m) forwards, then runs F and B in turn (steady state), then the
//                remaining backwards (cool-down). GPipe's makespan and bubble without latency (its
//                steady state waits on round trips, so latency costs it more), but rank r holds at
//                most min(p - r, m) microbatches: the memory does not grow with m.
//   interleaved  Megatron's interleaved 1F1B (Narayanan et al. 2021) in the order of PyTorch's
//                ScheduleInterleaved1F1B: the microbatches run in rounds of g = m / max(1, m / p)
//                (p when m is a multiple of p); a rank runs g forwards on chunk 0, then g on
//                chunk 1, ... chunk v-1, then the next round, and its backwards the same way from
//                chunk v-1 down. Rank r warms up with min((v - 1) g + 2 (p - 1 - r), v m)
//                forwards and holds one more at its peak (with v = 1, 2 (p - 1 - r): more than
//                1F1B's p - 1 - r). m must be a multiple of max(1, m / p): PyTorch's rule, which
//                relaxes Megatron's (m a multiple of p). With F and B the costs of one chunk, the
//                makespan is (v m + p - 1)(F + B) for m >= p: the bubble time over the ideal time
//                v m (F + B) is (p - 1)/(v m), Megatron's figure, 1F1B's divided by v, for
//                (v - 1) g more warm-up activations (of 1/v of the rank's layers each) and v
//                times the transfers. With m < p the pipeline never fills: (v p + m - 1)(F + B).
//   zb           ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"), in the order of
//                PyTorch's ScheduleInterleavedZeroBubble with one stage per rank: 1F1B with each
//                backward split into I, sent on at once, and W, deferred on rank r by r: after
//                I(j) the rank runs W(j - r) (from j = r on), and its last r W's close the
//                schedule. The same warm-up, so the same activations until I as 1F1B; counting
//                W's activations too, every rank holds at most min(p, m): 1F1B's peak (rank 0's).
//                With m >= p the makespan is m (F + I + W) + (p - 1)(F + I - W): the bubble is
//                (p - 1)/(3 m + p - 1) with unit costs, a third of 1F1B's bubble time. With m < p
//                the input gradients set the pace: (m + p - 1)(F + I) + W.
//
// make_schedule builds these; validate checks any Schedule, hand-built ones included; simulate
// times it; picture draws the timeline (docs/pipeline.md shows each for p = 4, m = 8).

enum class ActionKind { Forward, Backward, BackwardInput, BackwardWeight };

// 'F', 'B', 'I', 'W'.
char kind_letter(ActionKind kind);

struct Action {
  ActionKind kind;
  int stage;       // virtual stage, 0 .. ranks * virtual_stages - 1
  int microbatch;  // 0 .. microbatches - 1
  bool operator==(const Action&) const = default;
};

// "F(stage 2, mb 3)".
std::string to_string(const Action& action);
std::ostream& operator<<(std::ostream& os, const Action& action);

struct Schedule {
  std::string name;
  int ranks = 0;
  int microbatches = 0;
  int virtual_stages = 1;  // per rank
  // Per pp rank, the actions in the order that rank runs them.
  std::vector<std::vector<Action>> actions;

  int stages() const { return ranks * virtual_stages; }
  // The pp rank holding (virtual) stage `stage`: stage % ranks. A ConfigError for a stage outside
  // 0 .. stages() - 1 or a schedule without ranks.
  int rank_of_stage(int stage) const;
};

// The schedule names make_schedule knows: "gpipe", "1f1b", "interleaved", "zb".
const std::vector<std::string>& schedule_names();

// The schedule `name` for `ranks` pp ranks and `microbatches` microbatches, with
// `virtual_stages` stages per rank (only "interleaved" takes more than 1). Note [Pipeline
// schedules] gives each one's order.
//
// A ConfigError names the bad value: ranks, microbatches or virtual_stages below 1, an unknown
// name (with the known ones), virtual_stages other than 1 for a schedule that runs one stage per
// rank, interleaved's microbatch count that does not divide into rounds (with the counts nearby
// that do), a schedule too large to lay out.
Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages = 1,
                       SourceLocation loc = SourceLocation::current());

// Checks that the schedule can run: its sizes; every action's stage and microbatch in range and on
// the rank holding its stage; every (stage, microbatch) with exactly one F and either one B or one
// I and one W; each rank's order putting what an action needs from its own rank first; and the
// simulation finishing. Otherwise a ConfigError naming the schedule, the rank and the action and
// what it waits for; a deadlock is named as one, with the ranks waiting on each other.
void validate(const Schedule& schedule, SourceLocation loc = SourceLocation::current());

namespace detail {
// make_schedule's and simulate's checks of the sizes: a ConfigError starting "what('name'): ".
void check_sizes(std::string_view what, std::string_view name, int ranks, int microbatches,
                 int virtual_stages);
}  // namespace detail

}  // namespace spmd::pipeline

SPMD_FORMAT_AS_TEXT(spmd::pipeline::Action, spmd::pipeline::to_string(value))
