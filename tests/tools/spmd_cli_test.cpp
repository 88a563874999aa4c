// The `spmd` tool as a process: each subcommand's --json output parsed and checked against values
// computed here in closed form (mesh groups and coordinates, the layout notes' reference values,
// shard offsets and the cost model's formula), --help, and bad input (exit code 2 and a message
// naming the bad value).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <spmd/config.h>
#include <spmd/debug/trace_file.h>
#include <spmd/dtensor/ops.h>
#include <spmd/nn/checkpoint.h>
#include "tests/support/run_command.h"

namespace spmd {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::run_command;

CommandResult spmd_cli(const std::string& args) {
  return run_command(std::string(SPMD_CLI) + " " + args);
}

// Runs `args --json`, which must succeed, and parses its output.
json spmd_json(const std::string& args) {
  const CommandResult r = spmd_cli(args + " --json");
  EXPECT_EQ(r.exit_code, 0) << "spmd " << args << ":\n" << r.output;
  json doc = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << "spmd " << args << " printed no JSON:\n" << r.output;
  return doc;
}

using testing::contains;

// A file name of this test's own (CTest runs tests in parallel), in the temporary folder.
std::string temp_path(const std::string& suffix) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/spmd_cli_" + test->test_suite_name() + "_" + test->name() + "_" +
         suffix;
}

// Runs `args`, which must fail with exit code 2 and a message holding every fragment.
void expect_input_error(const std::string& args, const std::vector<std::string>& fragments) {
  const CommandResult r = spmd_cli(args);
  EXPECT_EQ(r.exit_code, 2) << "spmd " << args << ":\n" << r.output;
  for (const std::string& f : fragments) {
    EXPECT_TRUE(contains(r.output, f)) << "spmd " << args << ": message lacks '" << f << "':\n"
                                       << r.output;
  }
}

using Groups = std::vector<std::vector<int>>;

// The groups along `dim` of a row-major mesh of `shape` whose position p holds rank_at[p]: one
// group per coordinate of the other dims (row-major), ranks in order along `dim`.
Groups row_major_groups(const std::vector<int>& shape, int dim, const std::vector<int>& rank_at) {
  std::vector<int> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  int total = 1;
  for (int s : shape) total *= s;
  Groups groups;
  for (int p = 0; p < total; ++p) {
    if ((p / strides[dim]) % shape[dim] != 0) continue;  // start of a group: coordinate 0 on dim
    std::vector<int> g;
    for (int i = 0; i < shape[dim]; ++i) g.push_back(rank_at[p + i * strides[dim]]);
    groups.push_back(g);
  }
  return groups;
}

// ---- spmd mesh -----------------------------------------------------------------------------

TEST(SpmdMesh, PermutedRanksGiveTheGroupsAndCoordinatesOfEachPosition) {
  const json doc = spmd_json("mesh --shape 2,2,2 --names dp,cp,tp --ranks 7,6,5,4,3,2,1,0");
  EXPECT_EQ(doc["shape"], json({2, 2, 2}));
  EXPECT_EQ(doc["names"], json({"dp", "cp", "tp"}));
  EXPECT_EQ(doc["layout"], "(2,2,2):(4,2,1)");
  const std::vector<int> rank_at = {7, 6, 5, 4, 3, 2, 1, 0};
  const char* names[] = {"dp", "cp", "tp"};
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(doc["groups"][names[d]].get<Groups>(), row_major_groups({2, 2, 2}, d, rank_at))
        << names[d];
  }
  for (int r = 0; r < 8; ++r) {
    const int p = 7 - r;  // the position holding rank r
    EXPECT_EQ(doc["coordinates"][std::to_string(r)], json({p / 4, (p / 2) % 2, p % 2})) << r;
  }
}

TEST(SpmdMesh, TheTextFormDrawsTheGridAndListsGroups) {
  const CommandResult r = spmd_cli("mesh --shape 2,4 --names dp,tp");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "DeviceMesh((dp=2, tp=4), stride=(4, 1))")) << r.output;
  EXPECT_TRUE(contains(r.output, "layout: (2,4):(4,1)")) << r.output;
  EXPECT_TRUE(contains(r.output, "dp  [0, 4] [1, 5] [2, 6] [3, 7]")) << r.output;
  EXPECT_TRUE(contains(r.output, "tp  [0, 1, 2, 3] [4, 5, 6, 7]")) << r.output;
}

TEST(SpmdMesh, SliceKeepsEverySiblingsGroups) {
  const json doc = spmd_json("mesh --shape 2,2,2 --names dp,cp,tp --slice dp,tp");
  EXPECT_EQ(doc["shape"], json({2, 2}));
  EXPECT_EQ(doc["names"], json({"dp", "tp"}));
  EXPECT_EQ(doc["layout"], "(2,2):(4,1)");
  EXPECT_EQ(doc["num_siblings"], 2);
  EXPECT_EQ(doc["groups"]["dp"].get<Groups>(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(doc["groups"]["tp"].get<Groups>(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(doc["coordinates"][std::to_string(r)], json({r / 4, r % 2})) << r;
  }
}

TEST(SpmdMesh, OperationsApplyInCommandLineOrder) {
  // Slice then flatten: the 1-D dp_cp mesh, strided by 2 over the 8 ranks.
  const json flat = spmd_json("mesh --shape 2,2,2 --names dp,cp,tp --slice dp,cp --flatten dp_cp");
  EXPECT_EQ(flat["names"], json({"dp_cp"}));
  EXPECT_EQ(flat["operations"], json({"--slice dp,cp", "--flatten dp_cp"}));
  EXPECT_EQ(flat["groups"]["dp_cp"].get<Groups>(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));

  // Unflatten then slice, and the reverse order, which fails: x does not exist before unflatten.
  const json split = spmd_json("mesh --shape 8 --names world --unflatten world:2,4:x,y --slice y");
  EXPECT_EQ(split["names"], json({"y"}));
  EXPECT_EQ(split["groups"]["y"].get<Groups>(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  expect_input_error("mesh --shape 8 --names world --slice x --unflatten world:2,4:x,y", {"x"});

  // Repeated operations: unflatten twice.
  const json twice =
      spmd_json("mesh --shape 8 --names w --unflatten w:2,4:a,b --unflatten b:2,2:c,d");
  EXPECT_EQ(twice["names"], json({"a", "c", "d"}));
  EXPECT_EQ(twice["layout"], "(2,2,2):(4,2,1)");
}

// --flatten= (or --flatten before another option) joins the names, as DeviceMesh::flatten("");
// at the end of the command line, before --json and between other operations alike.
TEST(SpmdMesh, FlattenWithoutANameJoinsTheNames) {
  const std::string mesh = "mesh --shape 2,2,2 --names dp,cp,tp --slice dp,cp ";
  for (const char* flatten : {"--flatten=", "--flatten"}) {
    const json doc = spmd_json(mesh + flatten);
    EXPECT_EQ(doc["names"], json({"dp_cp"})) << flatten;
    EXPECT_EQ(doc["operations"], json({"--slice dp,cp", "--flatten="})) << flatten;
    EXPECT_EQ(doc["groups"]["dp_cp"].get<Groups>(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  }
  const CommandResult text = spmd_cli(mesh + "--flatten=");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(contains(text.output, "dp_cp  [0, 2, 4, 6] [1, 3, 5, 7]")) << text.output;

  // Named and unnamed flattens mixed, each applied in order.
  const json mixed = spmd_json(
      "mesh --shape 8 --names w --unflatten w:2,4:a,b --flatten= --unflatten a_b:4,2:c,d "
      "--flatten x");
  EXPECT_EQ(mixed["names"], json({"x"}));
  EXPECT_EQ(mixed["operations"], json({"--unflatten w:2,4:a,b",
                                       "--flatten=", "--unflatten a_b:4,2:c,d", "--flatten x"}));
}

TEST(SpmdMesh, BadInputNamesTheValue) {
  expect_input_error("mesh --shape 2,x,2", {"--shape", "'x'"});
  expect_input_error("mesh --shape 2,0", {"--shape", "0"});
  expect_input_error("mesh --shape 2,2 --names dp", {"--names", "dp"});
  expect_input_error("mesh --shape 2,2 --names dp,tp --slice zz", {"zz"});
  expect_input_error("mesh --shape 2,2 --names dp,tp --ranks 0,0,1,2", {"0"});
  expect_input_error("mesh --shape 2,2 --names dp,tp --ranks 0,1", {"--ranks"});
  expect_input_error("mesh --shape 2,2 --names dp,tp --unflatten tp:3,3:a,b", {"tp"});
  expect_input_error("mesh --shape 2,2 --names dp,tp --unflatten tp", {"DIM:SIZES:NAMES"});
  expect_input_error("mesh --shape 100000,100000", {"--shape"});
  expect_input_error("mesh", {"--shape"});
}

// ---- spmd layout ---------------------------------------------------------------------------

std::string layout_result(const std::string& args) {
  const CommandResult r = spmd_cli("layout " + args);
  EXPECT_EQ(r.exit_code, 0) << "spmd layout " << args << ":\n" << r.output;
  return r.output;
}

TEST(SpmdLayout, ReferenceValuesOfTheNotes) {
  // mesh/layout.h's worked examples (PyTorch's lexicographic convention).
  EXPECT_EQ(layout_result("coalesce '(3,2):(2,1)'"), "6:1\n");
  EXPECT_EQ(layout_result("coalesce '(3,2):(4,1)'"), "(3,2):(4,1)\n");
  EXPECT_EQ(layout_result("coalesce '(2,1,3):(3,7,1)'"), "6:1\n");
  EXPECT_EQ(layout_result("coalesce '(1,1):(1,1)'"), "1:1\n");
  EXPECT_EQ(layout_result("complement 4:1 8"), "2:4\n");
  EXPECT_EQ(layout_result("complement 2:2 4"), "2:1\n");
  EXPECT_EQ(layout_result("complement '(2,2):(4,1)' 8"), "2:2\n");
  EXPECT_EQ(layout_result("complement 3:2 12"), "(2,2):(6,1)\n");
  EXPECT_EQ(layout_result("compose '(6,2):(2,1)' 3:2"), "3:2\n");
  EXPECT_EQ(layout_result("compose 4:2 '(2,2):(2,1)'"), "(2,2):(4,2)\n");
  EXPECT_EQ(layout_result("compose 8:1 '(2,2,2):(4,2,1)'"), "(2,2,2):(4,2,1)\n");
}

TEST(SpmdLayout, JsonGivesSizesAndEveryOffset) {
  // R(c) = A(B(c)) with A = 4:2 (c -> 2c) and B = (2,2):(2,1) (c -> c for c < 4).
  const json doc = spmd_json("layout compose 4:2 '(2,2):(2,1)'");
  EXPECT_EQ(doc["op"], "compose");
  EXPECT_EQ(doc["inputs"], json({"4:2", "(2,2):(2,1)"}));
  EXPECT_EQ(doc["result"], "(2,2):(4,2)");
  EXPECT_EQ(doc["size"], 4);
  EXPECT_EQ(doc["cosize"], 7);
  EXPECT_EQ(doc["offsets"], json({0, 2, 4, 6}));

  // complement(3:2, 12) = (2,2):(6,1): offsets 0, 1, 6, 7 tile [0, 12) with 3:2's 0, 2, 4.
  const json c = spmd_json("layout complement 3:2 12");
  EXPECT_EQ(c["offsets"], json({0, 1, 6, 7}));
  EXPECT_EQ(c["inputs"], json({"3:2", "12"}));
}

TEST(SpmdLayout, BadInputNamesTheValue) {
  expect_input_error("layout coalesce '(2,4:(4,1)'", {"(2,4:(4,1)"});
  expect_input_error("layout compose '(4,4):(5,1)' 6:1", {"(4,4):(5,1)"});
  expect_input_error("layout complement 4:1 0", {"0"});
  expect_input_error("layout complement 4:1 many", {"many"});
  expect_input_error("layout transpose 4:1", {"transpose"});
  expect_input_error("layout", {});
}

// ---- spmd redistribute ---------------------------------------------------------------------

// The cost model's all_gather over n ranks of one host moving S gathered bytes (collectives/
// cost_model.h, the default topology: 87.7 GB/s with GB = 2^30, 0.6 us per hop, 6.6 us base).
double all_gather_us(double bytes, int n, double bandwidth_gbps = 87.7, double hop_us = 0.6) {
  return 6.6 + (n - 1) * hop_us + bytes * (n - 1) / n / (bandwidth_gbps * 1073741824.0) * 1e6;
}

TEST(SpmdRedistribute, TheDocumentedExampleVerifiesWithItsPlanAndShards) {
  const json doc =
      spmd_json("redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)'");
  EXPECT_EQ(doc["verified"], true) << doc.dump(2);
  // Greedy: tp takes its columns locally first, then dp gathers the rows of those columns: each
  // rank's piece padded to [4, 3] f32 (7 rows as 4 | 3, 9 columns as 3 | 3 | 3 | 0), 2 x 48
  // bytes gathered.
  const json& plan = doc["plan"];
  ASSERT_EQ(plan.size(), 2u) << plan.dump(2);
  EXPECT_EQ(plan[0]["mesh_dim"], 1);
  EXPECT_EQ(plan[0]["mesh_dim_name"], "tp");
  EXPECT_EQ(plan[0]["from"], "R");
  EXPECT_EQ(plan[0]["to"], "S(1)");
  EXPECT_EQ(plan[0]["collective"], "local chunk");
  EXPECT_EQ(plan[0]["bytes"], 0);
  EXPECT_EQ(plan[0]["est_us"], 0.0);
  EXPECT_EQ(plan[1]["mesh_dim"], 0);
  EXPECT_EQ(plan[1]["mesh_dim_name"], "dp");
  EXPECT_EQ(plan[1]["from"], "S(0)");
  EXPECT_EQ(plan[1]["to"], "R");
  EXPECT_EQ(plan[1]["collective"], "all_gather");
  EXPECT_EQ(plan[1]["bytes"], 2 * 4 * 3 * 4);
  EXPECT_NEAR(plan[1]["est_us"].get<double>(), all_gather_us(96, 2), 1e-6);
  EXPECT_NEAR(doc["est_us"].get<double>(), all_gather_us(96, 2), 1e-6);
  // What ran: the one all_gather, over dp.
  ASSERT_EQ(doc["executed"].size(), 1u) << doc["executed"].dump(2);
  EXPECT_EQ(doc["executed"][0]["collective"], "all_gather");
  EXPECT_EQ(doc["executed"][0]["mesh_dim_name"], "dp");
  // torch.chunk pieces: 7 rows over dp as 4 | 3; 9 columns over tp as 3 | 3 | 3 | 0.
  for (int r = 0; r < 8; ++r) {
    const int dp = r / 4;
    const int tp = r % 4;
    const json& src = doc["shards"]["source"][std::to_string(r)];
    EXPECT_EQ(src["offset"], json({4 * dp, 0})) << r;
    EXPECT_EQ(src["shape"], json({dp == 0 ? 4 : 3, 9})) << r;
    const json& dst = doc["shards"]["target"][std::to_string(r)];
    EXPECT_EQ(dst["offset"], json({0, std::min(3 * tp, 9)})) << r;
    EXPECT_EQ(dst["shape"], json({7, tp < 3 ? 3 : 0})) << r;
    EXPECT_EQ(dst["coordinate"], json({dp, tp})) << r;
  }
}

TEST(SpmdRedistribute, TextOutputShowsThePlanTheShardingAndTheVerdict) {
  const CommandResult r =
      spmd_cli("redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "all_gather")) << r.output;
  EXPECT_TRUE(contains(r.output, "before (S(0),R)")) << r.output;
  EXPECT_TRUE(contains(r.output, "after (R,S(1))")) << r.output;
  EXPECT_TRUE(contains(r.output, "verified:")) << r.output;
}

TEST(SpmdRedistribute, PartialsUnevenShapesDtypesAndPlanners) {
  for (const char* args : {
           "--mesh 2,2 --shape 5,3 --from 'P(sum),S(0)' --to 'S(1),R'",
           "--mesh 3 --shape 7 --from 'P(sum)' --to 'S(0)' --dtype i32",
           "--mesh 2,2,2 --names a,b,c --shape 5,6 --from 'S(0),S(0),S(1)' --to 'R,S(1),S(0)'",
           "--mesh 2,4 --shape 8,8 --from 'S(0),R' --to 'R,S(0)' --planner min-cost --dtype bf16",
           "--mesh 4 --shape 0,3 --from 'S(0)' --to 'R' --dtype f64",
           "--mesh 2,2 --shape 4,4 --from 'R,R' --to 'P(max),S(1)'",
       }) {
    const json doc = spmd_json(std::string("redistribute ") + args);
    EXPECT_EQ(doc["verified"], true) << args << "\n" << doc.dump(2);
  }
}

TEST(SpmdRedistribute, MinCostFindsACheaperRouteThanGreedy) {
  // Misaligned nesting: greedy sends tp to R first, then gathers the whole tensor over dp; the
  // min-cost planner moves pieces with all_to_alls instead. Both must still verify.
  const std::string args =
      "redistribute --mesh 2,4 --shape 1024,1024 --from 'S(0),S(0)' --to 'R,S(0)'";
  const json greedy = spmd_json(args);
  const json min_cost = spmd_json(args + " --planner min-cost");
  EXPECT_EQ(greedy["planner"], "greedy");
  EXPECT_EQ(min_cost["planner"], "min_cost");
  EXPECT_EQ(greedy["verified"], true);
  EXPECT_EQ(min_cost["verified"], true);
  int greedy_gathers = 0;
  for (const json& step : greedy["plan"]) greedy_gathers += step["collective"] == "all_gather";
  EXPECT_EQ(greedy_gathers, 2) << greedy["plan"].dump(2);
  EXPECT_LT(min_cost["est_us"].get<double>(), greedy["est_us"].get<double>());
  double sum = 0.0;
  for (const json& step : min_cost["plan"]) sum += step["est_us"].get<double>();
  EXPECT_NEAR(sum, min_cost["est_us"].get<double>(), 1e-9);
}

TEST(SpmdRedistribute, TopologyFileChangesTheEstimate) {
  // Two devices per host: the dp groups [r, r+4] span hosts and use the inter-host link.
  const std::string path = temp_path("topology.json");
  std::ofstream(path) << R"({"devices_per_host": 2, "inter_host": {"bandwidth_gbps": 10,
                              "latency_us": 5}})";
  const json doc = spmd_json(
      "redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)' "
      "--topology " +
      path);
  EXPECT_EQ(doc["verified"], true);
  EXPECT_NEAR(doc["plan"][1]["est_us"].get<double>(), all_gather_us(96, 2, 10, 5), 1e-6);
  std::remove(path.c_str());
}

TEST(SpmdRedistribute, BadInputNamesTheValue) {
  const std::string base = "redistribute --mesh 2,4 --names dp,tp --shape 7,9 ";
  expect_input_error(base + "--from 'S(0,R' --to 'R,R'", {"S(0,R"});
  expect_input_error(base + "--from 'S(0),R,R' --to 'R,R'", {"S(0),R,R"});
  expect_input_error(base + "--from 'S(2),R' --to 'R,R'", {"S(2)"});
  expect_input_error(base + "--from 'Q,R' --to 'R,R'", {"Q"});
  expect_input_error(base + "--from 'S(0),R' --to 'R,R' --dtype f8", {"f8"});
  expect_input_error(base + "--from 'S(0),R' --to 'R,R' --planner fast", {"fast"});
  expect_input_error(base + "--from 'S(0),R' --to 'R,R' --topology /nonexistent/topo.json",
                     {"/nonexistent/topo.json"});
  expect_input_error("redistribute --mesh 2,4 --names dp --shape 7,9 --from R,R --to R,R", {"dp"});
  expect_input_error("redistribute --mesh 2,4 --shape 7,-9 --from R,R --to R,R", {"-9"});
  expect_input_error("redistribute --mesh 2,4 --shape 7,9 --from R,R", {"--to"});
}

// ---- spmd trace ----------------------------------------------------------------------------

// collectives_tour's trace under sim: 8 ranks, mesh (dp=2, tp=4).
std::string tour_trace() {
  const std::string path = temp_path("tour.json");
  const CommandResult r = run_command(std::string(SPMD_COLLECTIVES_TOUR) + " --spmd-trace=" + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return path;
}

TEST(SpmdTrace, SummaryCountsCallsPerGroupAndBytesPerRank) {
  const std::string path = tour_trace();
  const json doc = spmd_json("trace summary " + path);
  EXPECT_EQ(doc["ranks"], json({0, 1, 2, 3, 4, 5, 6, 7}));
  auto row = [&](const std::string& op, const std::string& dim) {
    for (const json& r : doc["rows"]) {
      if (r["op"] == op && r["dim"] == dim) return r;
    }
    ADD_FAILURE() << "no row " << op << " " << dim << " in " << doc.dump(2);
    return json();
  };
  // One call per group (tp: 2 groups of 4; dp: 4 groups of 2), every rank's input bytes:
  // x is [2, 2] f32 (16 bytes), the reduce_scatter input [4, 3] f32, the all_to_all input [4, 2].
  EXPECT_EQ(row("all_reduce", "tp")["calls"], 2);
  EXPECT_EQ(row("all_reduce", "tp")["bytes"], 8 * 16);
  EXPECT_EQ(row("all_gather", "dp")["calls"], 4);
  EXPECT_EQ(row("all_gather", "dp")["bytes"], 8 * 16);
  EXPECT_EQ(row("reduce_scatter", "tp")["calls"], 2);
  EXPECT_EQ(row("reduce_scatter", "tp")["bytes"], 8 * 48);
  EXPECT_EQ(row("all_to_all", "tp")["calls"], 2);
  EXPECT_EQ(row("all_to_all", "tp")["bytes"], 8 * 32);
  EXPECT_EQ(row("permute", "tp")["calls"], 2);
  EXPECT_EQ(row("reduce", "dp")["calls"], 4);
  int64_t calls = 0;
  int64_t bytes = 0;
  for (const json& r : doc["rows"]) {
    calls += r["calls"].get<int64_t>();
    bytes += r["bytes"].get<int64_t>();
    EXPECT_GT(r["estimate_us"].get<double>(), 0.0) << r;
  }
  EXPECT_EQ(doc["total"]["calls"], calls);
  EXPECT_EQ(doc["total"]["bytes"], bytes);

  const CommandResult text = spmd_cli("trace summary " + path);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(contains(text.output, "reduce_scatter")) << text.output;
  EXPECT_TRUE(contains(text.output, "total")) << text.output;
  std::remove(path.c_str());
}

TEST(SpmdTrace, BadFilesNameThePath) {
  expect_input_error("trace summary /nonexistent/trace.json", {"/nonexistent/trace.json"});
  const std::string path = temp_path("not_a_trace.json");
  std::ofstream(path) << "{\"hello\": 1}";
  expect_input_error("trace summary " + path, {path, "traceEvents"});
  std::ofstream(path) << "not json at all";
  expect_input_error("trace summary " + path, {path});
  std::remove(path.c_str());
  expect_input_error("trace summary", {"files"});
}

TEST(SpmdTrace, SummaryTextIsTheDebugModulesTable) {
  const std::string path = tour_trace();
  const CommandResult r = spmd_cli("trace summary " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, summary_table(read_trace_file(path).records))) << r.output;
  std::remove(path.c_str());
}

TEST(SpmdTrace, DiffFindsTheFirstDifferingRecordOfEachRank) {
  const std::string a = tour_trace();
  const json same = spmd_json("trace diff " + a + " " + a);
  EXPECT_EQ(same["identical"], true);
  ASSERT_EQ(same["ranks"].size(), 8u);
  for (const json& rank : same["ranks"]) EXPECT_EQ(rank["kind"], "same") << rank;

  // b: a with rank 3's second collective renamed.
  json doc;
  std::ifstream(a) >> doc;
  int seen = 0;
  for (json& e : doc["traceEvents"]) {
    if (e["ph"] != "M" && e["tid"] == 3 && ++seen == 2) e["name"] = "broadcast";
  }
  const std::string b = temp_path("b.json");
  std::ofstream(b) << doc.dump();
  const CommandResult r = spmd_cli("trace diff " + a + " " + b + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const json diff = json::parse(r.output);
  EXPECT_EQ(diff["identical"], false);
  for (const json& rank : diff["ranks"]) {
    if (rank["rank"] != 3) {
      EXPECT_EQ(rank["kind"], "same") << rank;
      continue;
    }
    EXPECT_EQ(rank["kind"], "differs") << rank;
    EXPECT_EQ(rank["index_a"], 1) << rank;
    EXPECT_EQ(rank["compared"], 1) << rank;
    EXPECT_EQ(rank["fields"], json({"op"})) << rank;
  }
  const CommandResult text = spmd_cli("trace diff " + a + " " + b);
  EXPECT_EQ(text.exit_code, 1) << text.output;
  EXPECT_TRUE(contains(text.output, "rank 3")) << text.output;
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// ---- spmd parity (Note [Value dumps] in spmd/debug/value_dump.h) --------------------------------

// A dump folder written by hand in the documented format: `records` per rank file.
std::string value_dump(const std::string& name,
                       const std::vector<std::vector<std::string>>& ranks) {
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::ofstream out(dir + "/values.rank" + std::to_string(r) + ".jsonl");
    for (const std::string& line : ranks[r]) out << line << "\n";
  }
  return dir;
}

// One piece of a [2, 2] f32 value made at train.cpp:`line`.
std::string piece(int line, int rank, const std::string& offset, const std::string& size,
                  const std::string& values, const std::string& placements = "S(0)") {
  return fmt::format(
      R"({{"seq": {}, "file": "/src/train.cpp", "line": {}, "op": "add", "occurrence": 0, )"
      R"("shape": [2, 2], "dtype": "f32", "placements": "{}", "rank": {}, "offset": {}, )"
      R"("size": {}, "stride": 1, "reduce": "sum", "values": {}}})",
      line, line, placements, rank, offset, size, values);
}

TEST(SpmdParity, AssemblesPiecesAndNamesTheFirstDepartingSite) {
  // The run: two ranks, rows split at line 10; Partial pieces that sum at line 11; line 12 off.
  const std::string run =
      value_dump("run", {{piece(10, 0, "[0, 0]", "[1, 2]", "[1, 2]"),
                          piece(11, 0, "[0, 0]", "[2, 2]", "[0.5, 1, 1, 2]", "P(sum)"),
                          piece(12, 0, "[0, 0]", "[1, 2]", "[1, 2]")},
                         {piece(10, 1, "[1, 0]", "[1, 2]", "[3, 4]"),
                          piece(11, 1, "[0, 0]", "[2, 2]", "[0.5, 1, 2, 2]", "P(sum)"),
                          piece(12, 1, "[1, 0]", "[1, 2]", R"([3, "nan"])")}});
  // The reference: one rank, whole values.
  const std::string ref =
      value_dump("ref", {{piece(10, 0, "[0, 0]", "[2, 2]", "[1, 2, 3, 4]", "R"),
                          piece(11, 0, "[0, 0]", "[2, 2]", "[1, 2, 3, 4]", "R"),
                          piece(12, 0, "[0, 0]", "[2, 2]", "[1, 2, 3, 4]", "R")}});
  const CommandResult r = spmd_cli("parity " + run + " " + ref);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "ParityError: 'add' at train.cpp:12 (occurrence 1) departs"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "at index [1, 1]: nan here, 4 in the reference")) << r.output;
  EXPECT_TRUE(contains(r.output, "The last site that still agreed: 'add' at train.cpp:11"))
      << r.output;
  const CommandResult j = spmd_cli("parity " + run + " " + ref + " --json");
  EXPECT_EQ(j.exit_code, 1) << j.output;
  EXPECT_EQ(json::parse(j.output)["compared"], 2) << j.output;
  const CommandResult same = spmd_cli("parity " + ref + " " + ref);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_TRUE(contains(same.output, "parity: 3 values agree")) << same.output;
  // A piece outside its tensor, and a folder without a dump, are input errors naming the file.
  const std::string broken =
      value_dump("broken", {{piece(10, 0, "[1, 0]", "[2, 2]", "[1, 2, 3, 4]")}});
  expect_input_error("parity " + broken + " " + ref, {"values.rank0.jsonl:1", "outside shape"});
  expect_input_error("parity /nonexistent " + ref, {"/nonexistent is not a folder"});
}

TEST(SpmdCheckpoint, InspectListsEveryEntry) {
  const std::string dir = temp_path("ckpt");
  {
    World world = World::sim(4);
    const DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    DTensor w = distribute_tensor(ones({6, 4}), mesh, {Shard{0}, Replicate{}});
    Tensor step = zeros({1}, DType::I64);
    checkpoint::save(world, {{"w", &w}, {"step", &step}}, dir);
  }
  const json doc = spmd_json("checkpoint inspect " + dir + " --json");
  EXPECT_EQ(doc["w"]["shape"], json({6, 4}));
  EXPECT_EQ(doc["w"]["placements"], "S(0),R");
  EXPECT_EQ(doc["w"]["chunks"], 2);
  EXPECT_EQ(doc["w"]["bytes"], 96);
  EXPECT_EQ(doc["step"]["dtype"], "i64");
  const CommandResult text = spmd_cli("checkpoint inspect " + dir);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(contains(text.output, "2 entries, 104 bytes")) << text.output;
  expect_input_error("checkpoint inspect /nonexistent", {"/nonexistent is not a checkpoint"});
}

TEST(SpmdTrace, ConvertMergesTheRanksOfAnMpiRunIntoTheSimTrace) {
  if (!SPMD_HAVE_MPI) GTEST_SKIP() << "no MPI backend in this build";
  const std::string sim = tour_trace();
  // Under mpirun each process writes its rank's file: mpi.rank0.json ... mpi.rank7.json.
  const std::string mpi = temp_path("mpi.json");
  const CommandResult run = run_command(
      testing::mpi_env_prefix() +
      MPIEXEC_EXECUTABLE " -n 8 " SPMD_COLLECTIVES_TOUR " --spmd-backend=mpi --spmd-trace=" + mpi);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string merged = temp_path("merged.json");
  const json converted = spmd_json("trace convert " + mpi + " " + merged);
  EXPECT_EQ(converted["ranks"], json({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(converted["inputs"].size(), 8u);
  // The merged file holds what the sim run recorded, rank by rank, the digest's all_gather of
  // every rank's [1, 9] i64 digests over the world ("digest") included.
  const json diff = spmd_json("trace diff " + sim + " " + merged);
  EXPECT_EQ(diff["identical"], true) << diff.dump(2);
  ASSERT_EQ(diff["ranks"].size(), 8u) << diff.dump(2);
  const json a = spmd_json("trace summary " + sim);
  const json b = spmd_json("trace summary " + merged);
  const int64_t per_rank = a["records"].get<int64_t>() / 8;
  for (const json& rank : diff["ranks"]) {
    EXPECT_EQ(rank["kind"], "same") << rank;
    EXPECT_EQ(rank["compared"], per_rank) << rank;
  }
  EXPECT_EQ(b["total"]["calls"], a["total"]["calls"]);
  EXPECT_EQ(b["total"]["bytes"], a["total"]["bytes"]);
  bool digest_row = false;
  for (const json& row : a["rows"]) {
    if (row["op"] != "all_gather" || row["dim"] != "digest") continue;
    digest_row = true;
    EXPECT_EQ(row["calls"], 1) << row;
    EXPECT_EQ(row["bytes"], 8 * 9 * 8) << row;
  }
  EXPECT_TRUE(digest_row) << a.dump(2);
  for (int r = 0; r < 8; ++r) {
    std::remove(temp_path("mpi.rank" + std::to_string(r) + ".json").c_str());
  }
  std::remove(sim.c_str());
  std::remove(merged.c_str());
}

TEST(SpmdTrace, DiffAndConvertNameBadPaths) {
  const std::string path = tour_trace();
  expect_input_error("trace diff /nonexistent/a.json " + path, {"/nonexistent/a.json"});
  expect_input_error("trace diff " + path + " /nonexistent/b.json", {"/nonexistent/b.json"});
  expect_input_error("trace convert " + path + " /nonexistent/dir/out.json",
                     {"/nonexistent/dir/out.json"});
  expect_input_error("trace convert " + path, {"files"});
  std::remove(path.c_str());
}

// ---- spmd version, help, usage -------------------------------------------------------------

TEST(SpmdVersion, VersionAndBackendsOfThisBuild) {
  const json doc = spmd_json("version");
  EXPECT_EQ(doc["version"], SPMD_VERSION_STRING);
  EXPECT_EQ(doc["version_major"], SPMD_VERSION_MAJOR);
  const std::vector<std::string> backends = doc["backends"].get<std::vector<std::string>>();
  ASSERT_GE(backends.size(), 2u);
  EXPECT_EQ(backends[0], "sim");
  EXPECT_EQ(backends[1], "threads");
  auto has = [&](const char* b) {
    return std::find(backends.begin(), backends.end(), b) != backends.end();
  };
  EXPECT_EQ(has("mpi"), SPMD_HAVE_MPI == 1);
  EXPECT_EQ(has("nccl"), SPMD_HAVE_NCCL == 1);
  const CommandResult text = spmd_cli("version");
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_TRUE(contains(text.output, std::string("spmd ") + SPMD_VERSION_STRING)) << text.output;
}

TEST(SpmdHelp, EverySubcommandHasHelp) {
  for (const char* args :
       {"--help", "mesh --help", "layout --help", "layout coalesce --help",
        "layout complement --help", "layout compose --help", "redistribute --help", "trace --help",
        "trace summary --help", "trace diff --help", "trace convert --help", "version --help"}) {
    const CommandResult r = spmd_cli(args);
    EXPECT_EQ(r.exit_code, 0) << args << ":\n" << r.output;
    EXPECT_TRUE(contains(r.output, "Usage")) << args << ":\n" << r.output;
  }
  const CommandResult mesh = spmd_cli("mesh --help");
  for (const char* option :
       {"--shape", "--names", "--ranks", "--slice", "--flatten", "--unflatten", "--json"}) {
    EXPECT_TRUE(contains(mesh.output, option)) << option;
  }
}

TEST(SpmdHelp, NoOrUnknownSubcommandIsAUsageError) {
  expect_input_error("", {"subcommand"});
  expect_input_error("frobnicate", {"frobnicate"});
  expect_input_error("mesh --shape 2 --bogus", {"--bogus"});
}

}  // namespace
}  // namespace spmd
