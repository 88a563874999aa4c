// spmd/pipeline/timeline.h: a pipeline schedule run on a model of time: when each action starts
// and ends, each rank's idle time and activations, the bubble, and a terminal picture of it.
//
//   Timeline t = simulate(make_schedule("zb", 4, 8));
//   t.makespan;                     // 27 time units
//   t.bubble_fraction;              // idle time over ranks x makespan
//   t.per_rank[0].peak_in_flight;   // 4 microbatches' activations held at once on rank 0
//   std::cout << picture(t);
//
// The model is Note [Pipeline schedules] (pipeline/schedule.h): each rank runs its actions in its
// order; an action starts when its rank is free and what it needs is done, plus `latency` when
// that comes from another rank. Costs are per action kind, the same on every stage.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/pipeline/schedule.h>

namespace spmd::pipeline {

// Time per action kind, and per transfer between ranks (an activation after F, an input gradient
// after B or I). The defaults: a backward costs two forwards, split evenly into I and W.
struct Costs {
  double forward = 1;
  double backward = 2;
  double backward_input = 1;
  double backward_weight = 1;
  double latency = 0;

  double of(ActionKind kind) const;
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct RankTimeline {
  std::vector<TimedAction> actions;  // in the rank's order
  double busy = 0;                   // the sum of its actions' costs
  double idle_fraction = 0;          // 1 - busy / makespan
  // The most (stage, microbatch) pairs whose F has run and whose B or I has not: the
  // activations the rank holds for backward. In pairs: under interleaved a pair holds 1/v of the
  // rank's layers.
  int peak_in_flight = 0;
  // The same up to the pair's last backward action (B, or W for a split backward): W keeps some
  // of the activations (the inputs of each layer) until it runs.
  int peak_unfinished = 0;
};

struct Timeline {
  std::string name;
  int ranks = 0;
  int microbatches = 0;
  int virtual_stages = 1;
  Costs costs;
  std::vector<RankTimeline> per_rank;
  double makespan = 0;         // the last action's end; the first starts at 0
  double bubble_fraction = 0;  // idle time over ranks x makespan
};

// Runs the schedule on the cost model. A schedule that validate() refuses is refused here with the
// same ConfigError (validate is this, keeping only the verdict); so are negative or non-finite
// costs.
Timeline simulate(const Schedule& schedule, Costs costs = {},
                  SourceLocation loc = SourceLocation::current());

// The timeline as text: a header (schedule, sizes, costs, makespan, bubble), a ruler every 10
// columns, then per rank a row with one column per `time_unit` holding the letter of the action
// running at the column's middle (F, B, I, W; '.' idle) and the rank's idle %, a row "mb" with each
// action's microbatch under its first column (0-9, then a-z for 10-35; modulo 36 beyond) and, with
// virtual stages, a row "chunk" with its chunk likewise; a legend last. Deterministic: the tests
// and docs/pipeline.md show it literally. A time_unit that is not a finite time > 0 is a
// ConfigError.
std::string picture(const Timeline& timeline, double time_unit = 1);

namespace detail {
// simulate, its errors starting "what('name'): " (validate runs it as "validate").
Timeline run(const Schedule& schedule, const Costs& costs, std::string_view what);
}  // namespace detail

}  // namespace spmd::pipeline
