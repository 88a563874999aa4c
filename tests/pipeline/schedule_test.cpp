// The pipeline schedules (pipeline/schedule.h, pipeline/timeline.h): every schedule over ranks
// 1..8, microbatches 1..16 and, for interleaved, 1..3 stages per rank validates, and its
// simulation matches the closed forms of Note [Pipeline schedules] (makespan, bubble, peak
// activations) and the simulation's own rule (each action starts as early as its rank and its
// needs allow); one literal order per schedule; the picture; bad input and broken hand-built
// schedules, each refused with a ConfigError naming the value, the rank and the action.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <spmd/core/error.h>
#include <spmd/pipeline/schedule.h>
#include <spmd/pipeline/timeline.h>
#include "tests/support/test_support.h"

namespace spmd::pipeline {
namespace {

using testing::expect_throws;

constexpr int kMaxRanks = 8;
constexpr int kMaxMicrobatches = 16;
constexpr int kMaxVirtual = 3;

struct Case {
  std::string name;
  int ranks;
  int microbatches;
  int virtual_stages;
};

std::string describe(const Case& c) {
  return fmt::format("{} with {} ranks, {} microbatches, {} stages per rank", c.name, c.ranks,
                     c.microbatches, c.virtual_stages);
}

// PyTorch's rule for interleaved 1F1B: rounds of equal size, max(1, m / p) of them.
bool interleaved_allows(int ranks, int microbatches) {
  return microbatches % std::max(1, microbatches / ranks) == 0;
}

// Every schedule and size the sweep covers, interleaved only where its rule allows.
std::vector<Case> every_case() {
  std::vector<Case> cases;
  for (const std::string& name : schedule_names()) {
    for (int p = 1; p <= kMaxRanks; ++p) {
      for (int m = 1; m <= kMaxMicrobatches; ++m) {
        const int max_virtual = name == "interleaved" ? kMaxVirtual : 1;
        if (name == "interleaved" && !interleaved_allows(p, m)) continue;
        for (int v = 1; v <= max_virtual; ++v) cases.push_back({name, p, m, v});
      }
    }
  }
  return cases;
}

Timeline run(const Case& c, Costs costs = {}) {
  return simulate(make_schedule(c.name, c.ranks, c.microbatches, c.virtual_stages), costs);
}

// "0F0 0F1 1B0": stage, kind letter, microbatch of each action, as PyTorch writes them.
std::string order(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) {
    out +=
        fmt::format("{}{}{}{}", out.empty() ? "" : " ", a.stage, kind_letter(a.kind), a.microbatch);
  }
  return out;
}

TEST(PipelineSchedules, EveryScheduleValidatesOverTheSweep) {
  int count = 0;
  for (const Case& c : every_case()) {
    SCOPED_TRACE(describe(c));
    const Schedule s = make_schedule(c.name, c.ranks, c.microbatches, c.virtual_stages);
    EXPECT_EQ(s.name, c.name);
    ASSERT_EQ(static_cast<int>(s.actions.size()), c.ranks);
    const int per_pair = c.name == "zb" ? 3 : 2;  // F and B, or F, I and W
    for (int r = 0; r < c.ranks; ++r) {
      EXPECT_EQ(static_cast<int>(s.actions[r].size()), per_pair * c.virtual_stages * c.microbatches)
          << "rank " << r;
    }
    validate(s);
    ++count;
  }
  // 8 x 16 for gpipe, 1f1b and zb; interleaved: the allowed (p, m), 3 times. The others are
  // refused.
  int interleaved = 0;
  for (int p = 1; p <= kMaxRanks; ++p) {
    for (int m = 1; m <= kMaxMicrobatches; ++m) {
      if (interleaved_allows(p, m)) {
        ++interleaved;
      } else {
        expect_throws<ConfigError>([&] { make_schedule("interleaved", p, m, 2); },
                                   {fmt::format("microbatches = {} with {} ranks", m, p)});
      }
    }
  }
  EXPECT_EQ(count, 3 * kMaxRanks * kMaxMicrobatches + kMaxVirtual * interleaved);
}

// The simulation's rule, checked from the outside: each action lasts its cost, a rank runs one
// action at a time in its order, and each action starts exactly when its rank is free and what it
// needs is done (plus the latency from another rank): no earlier, no later.
TEST(PipelineSimulate, EachActionStartsAsSoonAsItsRankAndItsNeedsAllow) {
  const Costs costs{
      .forward = 1, .backward = 3, .backward_input = 2, .backward_weight = 1, .latency = 0.5};
  for (const Case& c : every_case()) {
    SCOPED_TRACE(describe(c));
    const Timeline t = run(c, costs);
    std::map<std::tuple<ActionKind, int, int>, const TimedAction*> by_action;
    for (const RankTimeline& rank : t.per_rank) {
      for (const TimedAction& timed : rank.actions) {
        by_action[{timed.action.kind, timed.action.stage, timed.action.microbatch}] = &timed;
      }
    }
    auto find = [&](ActionKind kind, int stage, int microbatch) -> const TimedAction* {
      auto it = by_action.find({kind, stage, microbatch});
      return it == by_action.end() ? nullptr : it->second;
    };
    const int last_stage = c.ranks * c.virtual_stages - 1;
    double makespan = 0;
    for (int r = 0; r < c.ranks; ++r) {
      double free = 0;
      for (const TimedAction& timed : t.per_rank[r].actions) {
        const Action& a = timed.action;
        const TimedAction* need = nullptr;
        if (a.kind == ActionKind::Forward && a.stage > 0) {
          need = find(ActionKind::Forward, a.stage - 1, a.microbatch);
        } else if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) {
          need = a.stage == last_stage ? find(ActionKind::Forward, a.stage, a.microbatch)
                                       : find(a.kind, a.stage + 1, a.microbatch);
        } else if (a.kind == ActionKind::BackwardWeight) {
          need = find(ActionKind::BackwardInput, a.stage, a.microbatch);
        }
        double start = free;
        if (need != nullptr) {
          const bool remote = need->action.stage % c.ranks != r;
          start = std::max(start, need->end + (remote ? costs.latency : 0));
        }
        EXPECT_EQ(timed.start, start) << "rank " << r << ", " << a;
        EXPECT_EQ(timed.end, timed.start + costs.of(a.kind)) << "rank " << r << ", " << a;
        free = timed.end;
      }
      makespan = std::max(makespan, free);
    }
    EXPECT_EQ(t.makespan, makespan);
  }
}

// GPipe and 1F1B take (m + p - 1)(F + B): the last stage starts after p - 1 forwards and then
// never waits, and its last backward reaches rank 0 p - 1 backwards later. Every rank is
// busy m (F + B), so each rank's idle fraction and the bubble are (p - 1)/(m + p - 1).
TEST(PipelineSimulate, GPipeAnd1F1BTakeMPlusPMinusOneSteps) {
  for (const Costs costs :
       {Costs{}, Costs{.forward = 1, .backward = 1}, Costs{.forward = 2, .backward = 3},
        Costs{.forward = 3, .backward = 1}}) {
    for (const std::string name : {"gpipe", "1f1b"}) {
      for (int p = 1; p <= kMaxRanks; ++p) {
        for (int m = 1; m <= kMaxMicrobatches; ++m) {
          SCOPED_TRACE(fmt::format("{}, p = {}, m = {}, F = {}, B = {}", name, p, m, costs.forward,
                                   costs.backward));
          const Timeline t = simulate(make_schedule(name, p, m), costs);
          const double step = costs.forward + costs.backward;
          EXPECT_DOUBLE_EQ(t.makespan, (m + p - 1) * step);
          EXPECT_DOUBLE_EQ(t.bubble_fraction, double(p - 1) / (m + p - 1));
          for (int r = 0; r < p; ++r) {
            EXPECT_DOUBLE_EQ(t.per_rank[r].busy, m * step) << "rank " << r;
            EXPECT_DOUBLE_EQ(t.per_rank[r].idle_fraction, double(p - 1) / (m + p - 1))
                << "rank " << r;
          }
        }
      }
    }
  }
}

// GPipe holds every microbatch before its first backward; 1F1B holds its warm-up plus one.
TEST(PipelineSimulate, PeakActivationsOfGPipeAnd1F1B) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    for (int m = 1; m <= kMaxMicrobatches; ++m) {
      const Timeline gpipe = simulate(make_schedule("gpipe", p, m));
      const Timeline one_f_one_b = simulate(make_schedule("1f1b", p, m));
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE(fmt::format("p = {}, m = {}, rank {}", p, m, r));
        EXPECT_EQ(gpipe.per_rank[r].peak_in_flight, m);
        EXPECT_EQ(gpipe.per_rank[r].peak_unfinished, m);
        EXPECT_EQ(one_f_one_b.per_rank[r].peak_in_flight, std::min(p - r, m));
        EXPECT_EQ(one_f_one_b.per_rank[r].peak_unfinished, std::min(p - r, m));
      }
    }
  }
}

// Interleaved 1F1B with v chunks per rank: a pipeline of v p stages of 1/v of the work each. With
// m >= p it takes (v m + p - 1) steps of F + B (each chunk's), so the bubble time over the ideal
// time v m (F + B) is (p - 1)/(v m): Megatron's figure, v times 1F1B's. With m < p the pipeline
// never fills: (v p + m - 1) steps, GPipe over v p stages. Rank r holds its warm-up,
// (v - 1) g + 2 (p - 1 - r) forwards, plus one.
TEST(PipelineSimulate, InterleavedShrinksTheBubbleByTheVirtualFactor) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    for (int m = 1; m <= kMaxMicrobatches; ++m) {
      if (!interleaved_allows(p, m)) continue;
      const Timeline one_f_one_b = simulate(make_schedule("1f1b", p, m));
      for (int v = 1; v <= kMaxVirtual; ++v) {
        SCOPED_TRACE(fmt::format("p = {}, m = {}, v = {}", p, m, v));
        const Timeline t = simulate(make_schedule("interleaved", p, m, v));
        const double step = 3;  // F + B
        const double ideal = v * m * step;
        if (m >= p) {
          EXPECT_DOUBLE_EQ(t.makespan, (v * m + p - 1) * step);
          EXPECT_DOUBLE_EQ((t.makespan - ideal) / ideal, double(p - 1) / (v * m));
          if (v > 1 && p > 1) EXPECT_LT(t.bubble_fraction, one_f_one_b.bubble_fraction);
        } else {
          EXPECT_DOUBLE_EQ(t.makespan, (v * p + m - 1) * step);
        }
        const int group = m / std::max(1, m / p);
        for (int r = 0; r < p; ++r) {
          const int warmup = std::min((v - 1) * group + 2 * (p - 1 - r), v * m);
          EXPECT_EQ(t.per_rank[r].peak_in_flight, std::min(warmup + 1, v * m)) << "rank " << r;
        }
      }
    }
  }
}

// ZB-H1 with F = I = W = 1. With m >= p: every rank is busy 3m and the bubble is
// (p - 1)(F + I - W) = p - 1, a third of 1F1B's 3 (p - 1). With m < p the input gradients' chain
// sets the pace: m + p - 1 steps of F + I, then rank 0's last W. It holds 1F1B's activations
// until I, and until W at most min(p, m) on any rank: 1F1B's peak.
TEST(PipelineSimulate, ZeroBubbleH1BeatsOneFOneBAtTheSameMemory) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    for (int m = 1; m <= kMaxMicrobatches; ++m) {
      SCOPED_TRACE(fmt::format("p = {}, m = {}", p, m));
      const Timeline zb = simulate(make_schedule("zb", p, m));
      const Timeline one_f_one_b = simulate(make_schedule("1f1b", p, m));
      if (m >= p) {
        EXPECT_DOUBLE_EQ(zb.makespan, 3 * m + (p - 1));
        EXPECT_DOUBLE_EQ(zb.bubble_fraction, double(p - 1) / (3 * m + p - 1));
      } else {
        EXPECT_DOUBLE_EQ(zb.makespan, 2 * (m + p - 1) + 1);
      }
      if (p > 1) {
        EXPECT_LT(zb.bubble_fraction, one_f_one_b.bubble_fraction);
      } else {
        EXPECT_EQ(zb.bubble_fraction, 0);
      }
      int peak_zb = 0;
      int peak_1f1b = 0;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(zb.per_rank[r].peak_in_flight, one_f_one_b.per_rank[r].peak_in_flight)
            << "rank " << r;
        peak_zb = std::max(peak_zb, zb.per_rank[r].peak_unfinished);
        peak_1f1b = std::max(peak_1f1b, one_f_one_b.per_rank[r].peak_unfinished);
      }
      EXPECT_EQ(peak_zb, peak_1f1b);
      EXPECT_EQ(peak_zb, std::min(p, m));
    }
  }
}

// GPipe's transfers are never on a rank's idle path twice: 2 (p - 1) latencies, one each way.
// Latency never makes any schedule faster.
TEST(PipelineSimulate, LatencyOfTransfers) {
  for (const Case& c : every_case()) {
    SCOPED_TRACE(describe(c));
    const Timeline none = run(c);
    const Timeline some = run(c, Costs{.latency = 0.25});
    EXPECT_GE(some.makespan, none.makespan);
    if (c.name == "gpipe") {
      EXPECT_DOUBLE_EQ(some.makespan,
                       (c.microbatches + c.ranks - 1) * 3 + 2 * (c.ranks - 1) * 0.25);
    }
  }
}

// The orders, written out by hand from the rules of Note [Pipeline schedules].
TEST(PipelineSchedules, LiteralOrders) {
  const Schedule gpipe = make_schedule("gpipe", 4, 4);
  EXPECT_EQ(order(gpipe.actions[0]), "0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3");
  EXPECT_EQ(order(gpipe.actions[3]), "3F0 3F1 3F2 3F3 3B0 3B1 3B2 3B3");

  const Schedule one_f_one_b = make_schedule("1f1b", 4, 4);
  EXPECT_EQ(order(one_f_one_b.actions[0]), "0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3");
  EXPECT_EQ(order(one_f_one_b.actions[1]), "1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3");
  EXPECT_EQ(order(one_f_one_b.actions[2]), "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2B3");
  EXPECT_EQ(order(one_f_one_b.actions[3]), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3");

  const Schedule zb = make_schedule("zb", 4, 4);
  EXPECT_EQ(order(zb.actions[0]), "0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3");
  EXPECT_EQ(order(zb.actions[1]), "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1I2 1W1 1I3 1W2 1W3");
  EXPECT_EQ(order(zb.actions[2]), "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2I3 2W1 2W2 2W3");
  EXPECT_EQ(order(zb.actions[3]), "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3W1 3W2 3W3");

  // Two ranks, two chunks each (rank 0 holds stages 0 and 2), rounds of 2 microbatches: warm-up
  // (v - 1) 2 + 2 (p - 1 - r) = 4 forwards on rank 0 and 2 on rank 1.
  const Schedule interleaved = make_schedule("interleaved", 2, 4, 2);
  EXPECT_EQ(order(interleaved.actions[0]),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  EXPECT_EQ(order(interleaved.actions[1]),
            "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
}

TEST(PipelinePicture, TwoRanksOf1F1B) {
  EXPECT_EQ(picture(simulate(make_schedule("1f1b", 2, 3))),
            "1f1b: 2 ranks, 3 microbatches; costs F=1 B=2; makespan 12, bubble 25.0%\n"
            "        0         10\n"
            "rank 0  FF..BBFBB.BB  idle 25.0%\n"
            "    mb  01  0 21  2\n"
            "rank 1  .FBBFBBFBB..  idle 25.0%\n"
            "    mb   00 11 22\n"
            "F forward, B backward, . idle; one column per time unit\n"
            "mb: each action's microbatch, at its first column\n");
}

TEST(PipelinePicture, ChunksOfInterleavedAndATimeUnit) {
  const std::string text =
      picture(simulate(make_schedule("interleaved", 2, 2, 2), {.forward = 2, .backward = 4}), 2);
  EXPECT_EQ(text,
            "interleaved: 2 ranks, 2 microbatches, 2 stages per rank; costs F=2 B=4; makespan 30, "
            "bubble 20.0%\n"
            "        0         10\n"
            "rank 0  FFFF..BB.BBBBBB  idle 20.0%\n"
            "    mb  0101  0  1 0 1\n"
            " chunk  0011  1  1 0 0\n"
            "rank 1  .FFFBBFBBBBBB..  idle 20.0%\n"
            "    mb   0100 11 0 1\n"
            " chunk   0011 11 0 0\n"
            "F forward, B backward, . idle; one column per 2 time units\n"
            "mb: each action's microbatch, at its first column\n"
            "chunk: each action's chunk; chunk c of rank r is stage c x 2 + r\n");
  expect_throws<ConfigError>([&] { picture(run({"gpipe", 2, 2, 1}), 0); }, {"time_unit = 0"});
}

// docs/pipeline.md shows each schedule for p = 4, m = 8 (interleaved: v = 2) as picture() prints
// it.
TEST(PipelinePicture, TheDocsShowEachScheduleAsPrinted) {
  std::ifstream file(std::string(SPMD_DOCS_DIR) + "/pipeline.md");
  ASSERT_TRUE(file) << SPMD_DOCS_DIR << "/pipeline.md";
  const std::string docs((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  for (const std::string& name : schedule_names()) {
    const std::string text =
        picture(simulate(make_schedule(name, 4, 8, name == "interleaved" ? 2 : 1)));
    EXPECT_NE(docs.find("```\n" + text + "```\n"), std::string::npos)
        << "docs/pipeline.md lacks the picture of " << name << ":\n"
        << text;
  }
}

TEST(PipelineBadInput, MakeScheduleNamesTheValue) {
  expect_throws<ConfigError>([] { make_schedule("1f1b", 0, 4); },
                             {"make_schedule('1f1b')", "ranks = 0"});
  expect_throws<ConfigError>([] { make_schedule("gpipe", 4, 0); }, {"microbatches = 0"});
  expect_throws<ConfigError>([] { make_schedule("zb", 4, -3); }, {"microbatches = -3"});
  expect_throws<ConfigError>([] { make_schedule("interleaved", 4, 8, 0); }, {"virtual_stages = 0"});
  expect_throws<ConfigError>(
      [] { make_schedule("pipedream", 4, 8); },
      {"unknown schedule 'pipedream'", "'gpipe', '1f1b', 'interleaved', 'zb'"});
  expect_throws<ConfigError>([] { make_schedule("1f1b", 4, 8, 2); },
                             {"virtual_stages = 2", "1f1b runs one stage per rank"});
  expect_throws<ConfigError>([] { make_schedule("interleaved", 4, 9, 2); },
                             {"microbatches = 9 with 4 ranks", "= 2 rounds",
                              "ScheduleInterleaved1F1B", "8 or 10 microbatches would do"});
  expect_throws<ConfigError>([] { make_schedule("gpipe", 1 << 16, 1 << 16); },
                             {"65536 ranks x 1 virtual stages x 65536 microbatches"});
  expect_throws<ConfigError>([] { simulate(make_schedule("gpipe", 2, 2), {.forward = -1}); },
                             {"simulate('gpipe')", "costs.forward = -1"});
}

// A small valid schedule to break: 1F1B on 2 ranks, 2 microbatches.
//   rank 0: F(0,0) F(0,1) B(0,0) B(0,1)      rank 1: F(1,0) B(1,0) F(1,1) B(1,1)
Schedule small(std::string name) {
  Schedule s = make_schedule("1f1b", 2, 2);
  s.name = std::move(name);
  return s;
}

TEST(PipelineValidate, AMissingBackwardIsNamed) {
  Schedule s = small("no-backward");
  s.actions[1].pop_back();
  expect_throws<ConfigError>([&] { validate(s); },
                             {"validate('no-backward')", "rank 1 runs no backward of stage 1, mb 1",
                              "B(stage 1, mb 1)", "I(stage 1, mb 1) and W(stage 1, mb 1)"});
}

TEST(PipelineValidate, ASwappedOrderThatDeadlocksIsNamed) {
  Schedule s = small("swapped");
  // Rank 0 runs B(0,0) before F(0,1); rank 1 needs F(0,1) before it runs B(1,0).
  s.actions[0] = {{ActionKind::Forward, 0, 0},
                  {ActionKind::Backward, 0, 0},
                  {ActionKind::Forward, 0, 1},
                  {ActionKind::Backward, 0, 1}};
  s.actions[1] = {{ActionKind::Forward, 1, 0},
                  {ActionKind::Forward, 1, 1},
                  {ActionKind::Backward, 1, 0},
                  {ActionKind::Backward, 1, 1}};
  expect_throws<ConfigError>(
      [&] { validate(s); },
      {"validate('swapped'): the schedule deadlocks",
       "rank 0 waits at B(stage 0, mb 0) (its action 1) for B(stage 1, mb 0) on rank 1 (its "
       "action 2)",
       "rank 1 waits at F(stage 1, mb 1) (its action 1) for F(stage 0, mb 1) on rank 0 (its "
       "action 2)",
       "ranks 0 -> 1 -> 0 wait on each other"});
}

TEST(PipelineValidate, ADeadlockNamesTheCycleAmongTheWaitingRanks) {
  // Ranks 2 and 3 of a 4-rank 1F1B wait on each other; ranks 0 and 1 wait for rank 2's backward.
  Schedule s = make_schedule("1f1b", 4, 2);
  std::swap(s.actions[3][1], s.actions[3][2]);  // rank 3: F(3,0) F(3,1) B(3,0) B(3,1)
  std::swap(s.actions[2][1], s.actions[2][2]);  // rank 2: F(2,0) B(2,0) F(2,1) B(2,1)
  expect_throws<ConfigError>([&] { validate(s); }, {"validate('1f1b'): the schedule deadlocks",
                                                    "ranks 2 -> 3 -> 2 wait on each other"});
}

TEST(PipelineValidate, AnOrderAgainstTheRanksOwnNeedsIsNamed) {
  Schedule s = small("backward-first");
  std::swap(s.actions[1][0], s.actions[1][1]);  // rank 1: B(1,0) before F(1,0)
  expect_throws<ConfigError>([&] { validate(s); },
                             {"validate('backward-first')",
                              "rank 1 runs B(stage 1, mb 0) (its action 0) before F(stage 1, mb "
                              "0) (its action 1), which it needs"});

  Schedule zb = make_schedule("zb", 2, 2);
  zb.name = "weight-first";
  auto& rank1 = zb.actions[1];  // F(1,0) I(1,0) F(1,1) I(1,1) W(1,0) W(1,1)
  std::swap(rank1[1], rank1[4]);
  expect_throws<ConfigError>([&] { validate(zb); },
                             {"rank 1 runs W(stage 1, mb 0) (its action 1) before I(stage 1, mb "
                              "0) (its action 4), which it needs"});

  // One rank holding two stages must run stage 0's forward before stage 1's.
  Schedule one_rank = make_schedule("interleaved", 1, 1, 2);
  std::swap(one_rank.actions[0][0], one_rank.actions[0][1]);
  expect_throws<ConfigError>([&] { validate(one_rank); },
                             {"rank 0 runs F(stage 1, mb 0) (its action 0) before F(stage 0, mb "
                              "0) (its action 1), which it needs"});
}

TEST(PipelineValidate, MalformedActionsAreNamed) {
  Schedule lists = small("lists");
  lists.actions.pop_back();
  expect_throws<ConfigError>([&] { validate(lists); }, {"has 1 action lists for 2 ranks"});

  Schedule wrong_rank = small("wrong-rank");
  wrong_rank.actions[0].push_back({ActionKind::Forward, 1, 0});
  expect_throws<ConfigError>([&] { validate(wrong_rank); },
                             {"rank 0's action 4, F(stage 1, mb 0): stage 1 is on rank 1"});

  Schedule twice = small("twice");
  twice.actions[0].push_back({ActionKind::Forward, 0, 1});
  expect_throws<ConfigError>([&] { validate(twice); },
                             {"rank 0 runs F(stage 0, mb 1) twice: its actions 1 and 4"});

  Schedule out_of_range = small("range");
  out_of_range.actions[1][3].microbatch = 2;
  expect_throws<ConfigError>([&] { validate(out_of_range); },
                             {"rank 1's action 3, B(stage 1, mb 2): microbatch 2 is outside 0..1"});
  out_of_range.actions[1][3] = {ActionKind::Backward, -1, 0};
  expect_throws<ConfigError>([&] { validate(out_of_range); }, {"stage -1 is outside 0..1"});

  Schedule no_forward = small("no-forward");
  no_forward.actions[0].erase(no_forward.actions[0].begin() + 1);
  expect_throws<ConfigError>([&] { validate(no_forward); }, {"rank 0 never runs F(stage 0, mb 1)"});

  Schedule mixed = small("mixed");
  mixed.actions[1].push_back({ActionKind::BackwardWeight, 1, 1});
  expect_throws<ConfigError>([&] { validate(mixed); },
                             {"rank 1 runs both B(stage 1, mb 1) and W(stage 1, mb 1)"});

  Schedule split = make_schedule("zb", 2, 2);
  split.actions[0].pop_back();  // W(0,1)
  expect_throws<ConfigError>([&] { validate(split); },
                             {"validate('zb'): rank 0 runs I(stage 0, mb 1) but never W(stage 0, "
                              "mb 1)"});

  expect_throws<ConfigError>([] { small("stage").rank_of_stage(2); },
                             {"rank_of_stage(2): schedule 'stage' has 2 ranks x 1 virtual stages, "
                              "so stages 0..1"});
  expect_throws<ConfigError>([] { Schedule{}.rank_of_stage(0); }, {"has 0 ranks"});

  Schedule sizes = small("sizes");
  sizes.ranks = 0;
  expect_throws<ConfigError>([&] { validate(sizes); }, {"validate('sizes'): ranks = 0"});
}

}  // namespace
}  // namespace spmd::pipeline
