// Programs run as processes under sim: each --spmd-debug check mode stops the probe's planted bug
// with its report and a non-zero exit code and lets the correct probe through; the main example's
// --spmd-trace file is valid Chrome trace JSON.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <spmd/debug/trace_file.h>
#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

CommandResult probe(const std::string& args) {
  return run_command(std::string(SPMD_DEBUG_PROBE) + " --spmd-world-size=8 " + args);
}

using testing::contains;

TEST(DebugModes, CorrectProgramPassesEveryCheck) {
  CommandResult r = probe("--spmd-debug=check,replicate,nan");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "probe: total 65 on 8 ranks")) << r.output;
}

TEST(DebugModes, CheckStopsTheUnevenShardBug) {
  EXPECT_EQ(probe("--probe-bug=uneven").exit_code, 0);  // silently wrong without the check
  CommandResult r = probe("--probe-bug=uneven --spmd-debug=check");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-7] DivergenceError: --spmd-debug=check: DTensor op "
                       "'add_row_index' at debug_probe.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "differs from the same op on the full tensors: max error 2 at index [4, 0]"))
      << r.output;
}

TEST(DebugModes, ReplicateStopsADivergedReplica) {
  EXPECT_EQ(probe("--probe-bug=replica").exit_code, 0);
  CommandResult r = probe("--probe-bug=replica --spmd-debug=replicate");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-7] DivergenceError: --spmd-debug=replicate: input 0 of DTensor "
                       "op 'mul' at debug_probe.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "is Replicate on mesh dim 0 ('dp') but its replicas differ: rank 1 holds 2 "
                       "and rank 5 holds 1 at index [0, 0] of the piece"))
      << r.output;
}

TEST(DebugModes, NanStopsTheFirstNanWithItsRank) {
  EXPECT_EQ(probe("--probe-bug=nan").exit_code, 0);
  CommandResult r = probe("--probe-bug=nan --spmd-debug=nan");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[ranks 0-7] NonFiniteError: --spmd-debug=nan: DTensor op 'log' at "
                       "debug_probe.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "produced NaN on rank 2 at index [0, 0] of its piece (global index [4, 0]); "
                       "its inputs were finite on rank 2; output S(0) [5, 2] f32"))
      << r.output;
}

// The acceptance check of the trace: the main example's trace parses as Chrome trace JSON with one
// track per rank and a start and duration on every complete event.
TEST(ExampleTrace, CollectivesTourWritesValidChromeTraceJson) {
  const std::string path = ::testing::TempDir() + "/collectives_tour_trace.json";
  std::remove(path.c_str());
  CommandResult r = run_command(std::string(SPMD_COLLECTIVES_TOUR) + " --spmd-trace=" + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_TRUE(doc.contains("traceEvents"));
  const nlohmann::json& events = doc["traceEvents"];
  ASSERT_TRUE(events.is_array());
  std::set<int> tracks;
  std::set<int> ranks_with_events;
  int complete = 0;
  for (const nlohmann::json& e : events) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "M") {
      EXPECT_EQ(e["name"], "thread_name");
      EXPECT_TRUE(tracks.insert(e["tid"].get<int>()).second) << "two tracks for " << e["tid"];
      continue;
    }
    ASSERT_EQ(ph, "X") << e.dump();  // every call of the tour finishes
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
    ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_TRUE(e["name"].is_string());
    EXPECT_TRUE(e["args"].contains("seq") && e["args"].contains("group")) << e.dump();
    ranks_with_events.insert(e["tid"].get<int>());
    ++complete;
  }
  EXPECT_EQ(tracks, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ranks_with_events, tracks);
  EXPECT_GT(complete, 8);
  EXPECT_EQ(read_trace_file(path).records.size(), static_cast<size_t>(complete));
}

}  // namespace
}  // namespace spmd
