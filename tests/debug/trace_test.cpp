// Trace files (debug/trace_file.h), the flight recorder's dump (Note [Flight recorder]) and the
// trace diff (debug/trace_diff.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/debug/trace_diff.h>
#include <spmd/debug/trace_file.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/spmd_debug_" + name;
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

// all_reduce over tp, all_gather over dp, all_reduce over dp on a (2, 2) mesh.
void three_calls(const World& world, const DeviceMesh& mesh) {
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  all_reduce(x, mesh, "tp");
  all_gather(x, mesh, "dp", 0);
  all_reduce(x, mesh, "dp", ReduceOp::Max);
}

void expect_same_records(const std::vector<TraceRecord>& got,
                         const std::vector<TraceRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    TraceRecord g = got[i];
    const TraceRecord& w = want[i];
    EXPECT_NEAR(g.start_us, w.start_us, 1e-3) << i;
    EXPECT_NEAR(g.end_us, w.end_us, 1e-2) << i;
    g.start_us = w.start_us;
    g.end_us = w.end_us;
    EXPECT_EQ(g, w) << "record " << i << ": " << format_record(g) << " vs " << format_record(w);
  }
}

// ---- trace files
// ---------------------------------------------------------------------------------

TEST(TraceFile, ChromeJsonReadsBackIntoTheSameRecords) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  trace().clear();
  three_calls(world, mesh);
  const std::string path = temp_path("roundtrip.json");
  trace().to_chrome_json(path);
  TraceFile file = read_trace_file(path);
  expect_same_records(file.records, trace().records());
  ASSERT_EQ(file.infos.size(), 1u);
  EXPECT_EQ(file.infos[0].kind, "trace");
  EXPECT_EQ(file.infos[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(file.ranks(), (std::vector<int>{0, 1, 2, 3}));
  // clear() dropped the earlier events: the file says so.
  EXPECT_EQ(file.infos[0].first_event, trace().first_event_id());
  EXPECT_EQ(file.truncated(0), trace().first_event_id() > 0);
  EXPECT_EQ(file.records_of(2).size(), 3u);
  EXPECT_EQ(format_record(file.records_of(2)[1]).substr(0, 57),
            "seq 0 all_gather 'dp' group [0, 2] [2] f32 gather_dim=0 a");

  // A records-based summary: one call per group and sequence number.
  const std::string table = summary_table(file.records);
  EXPECT_NE(table.find("all_reduce         tp                2             32"), std::string::npos)
      << table;
  EXPECT_NE(table.find("total                                6             96"), std::string::npos)
      << table;
}

// Note [Pipeline context]: collectives inside a pipeline action carry its stage and microbatch,
// the actions are compute spans, both survive the file, the diff names a wrong microbatch, and
// the summary draws the schedule as it ran.
TEST(TraceFile, PipelineStagesMicrobatchesAndSpansSurviveTheFile) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  trace().clear();
  {
    const PipelineContextScope action(1, 3);
    three_calls(world, mesh);
  }
  all_reduce(LocalTensor::from_fn(world, [](int r) { return full({2}, r); }), mesh, "tp");
  for (int rank = 0; rank < 2; ++rank) {
    trace().add_span(ComputeSpan{rank, 0, 0, 'F', 0, 10, 20});
    trace().add_span(ComputeSpan{rank, 0, 0, 'B', 2, 30, 50});
  }
  trace().add_span(ComputeSpan{2, 1, 0, 'F', 1, 20, 30});
  const std::vector<TraceRecord> records = trace().records();
  ASSERT_EQ(records.size(), 16u);
  EXPECT_EQ(records[0].stage, 1);
  EXPECT_EQ(records[0].microbatch, 3);
  EXPECT_EQ(records[3].stage, -1);  // rank 0's fourth call: outside the action
  EXPECT_NE(format_record(records[0]).find("[stage 1 microbatch 3]"), std::string::npos);

  const std::string path = temp_path("pipeline.json");
  trace().to_chrome_json(path);
  TraceFile file = read_trace_file(path);
  expect_same_records(file.records, records);
  EXPECT_EQ(file.spans, trace().spans());

  const std::string picture = schedule_picture(file.spans);
  EXPECT_NE(picture.find("rank   0  F0  . B0   idle 33%"), std::string::npos) << picture;
  EXPECT_NE(picture.find("rank   2   . F0  .   idle 67%"), std::string::npos) << picture;
  EXPECT_NE(picture.find("3 ranks x 3 ticks, bubble 44.4%"), std::string::npos) << picture;
  EXPECT_NE(trace().summary_table().find("pipeline schedule as it ran:"), std::string::npos);

  // The same calls from microbatch 4: the diff names the field.
  TraceFile other = file;
  for (TraceRecord& r : other.records) {
    if (r.microbatch == 3) r.microbatch = 4;
  }
  const TraceDiff d = diff_traces(file, other, "a", "b");
  ASSERT_FALSE(d.identical());
  EXPECT_EQ(d.ranks[0].fields, (std::vector<std::string>{"microbatch"}));
  trace().clear();
}

TEST(TraceFile, ReadsPerRankFilesAndFolders) {
  const std::string dir = temp_path("ranks");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (int rank = 0; rank < 2; ++rank) {
    TraceRecord r;
    r.rank = rank;
    r.op = "all_reduce";
    r.dim_name = "tp";
    r.group_ranks = {0, 1};
    r.shape = {4};
    r.dtype = "f32";
    r.start_us = 1.0;
    r.end_us = 3.0;
    write_trace_file(dir + "/t.rank" + std::to_string(rank) + ".json", {&r, 1},
                     TraceFileInfo{.ranks = {rank}});
  }
  TraceFile by_name = read_trace_file(dir + "/t.json");
  EXPECT_EQ(by_name.paths.size(), 2u);
  EXPECT_EQ(by_name.ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(read_trace_file(dir).records.size(), 2u);
  testing::expect_throws<ConfigError>([&] { read_trace_file(dir + "/nothing.json"); },
                                      {"no trace file", "nothing.rank0.json"});
  testing::expect_throws<ConfigError>([&] { parse_trace_json("{\"x\": 1}", "bad.json"); },
                                      {"bad.json", "traceEvents"});
  testing::expect_throws<ConfigError>([&] { parse_trace_json("{", "broken.json"); },
                                      {"broken.json", "not JSON"});
}

// ---- the flight recorder
// ---------------------------------------------------------------------------

TEST(FlightRecorder, DumpsTheLastEventsWithThePendingOne) {
  const std::string path = temp_path("flight_recorder.json");
  std::remove(path.c_str());
  ScopedEnv file("SPMD_FLIGHT_RECORDER_FILE", path);
  ScopedEnv size("SPMD_FLIGHT_RECORDER_SIZE", "3");
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  trace().clear();
  const uint64_t first = trace().first_event_id();
  three_calls(world, mesh);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  auto pending = all_reduce_async(x, mesh, "tp");  // not waited for: its record stays pending

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(dump_flight_recorder(world, "timeout after 1 s"), path);
  const std::string err = ::testing::internal::GetCapturedStderr();
  pending.wait();

  EXPECT_NE(err.find("flight recorder (timeout after 1 s): 12 collective record(s) of the last 3 "
                     "written to " +
                     path + " (older ones dropped)\n"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("rank 3's last 3 collective(s), oldest first:\n  seq 0 all_gather 'dp' "
                     "group [1, 3] [2] f32 gather_dim=0 at trace_test.cpp:"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("  seq 1 all_reduce 'tp' group [2, 3] [2] f32 op=sum at trace_test.cpp:"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("(pending)\n"), std::string::npos) << err;

  TraceFile dump = read_trace_file(path);
  ASSERT_EQ(dump.infos.size(), 1u);
  const TraceFileInfo& info = dump.infos[0];
  EXPECT_EQ(info.kind, "flight_recorder");
  EXPECT_EQ(info.reason, "timeout after 1 s");
  EXPECT_EQ(info.ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.backend, "sim");
  EXPECT_EQ(info.capacity, 3u);
  EXPECT_EQ(info.first_event, first + 1);
  EXPECT_TRUE(dump.truncated(0));
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<TraceRecord> mine = dump.records_of(rank);
    ASSERT_EQ(mine.size(), 3u) << rank;
    EXPECT_EQ(mine[0].op, "all_gather");
    EXPECT_EQ(mine[1].op, "all_reduce");
    EXPECT_EQ(mine[1].detail, "op=max");
    EXPECT_GT(mine[1].end_us, 0.0);
    EXPECT_EQ(mine[2].op, "all_reduce");
    EXPECT_EQ(mine[2].sequence, 1u);
    EXPECT_EQ(mine[2].end_us, 0.0);  // pending
  }
}

TEST(FlightRecorder, OffAtSizeZeroAndRejectsBadSizes) {
  World world = World::sim(2);
  {
    ScopedEnv size("SPMD_FLIGHT_RECORDER_SIZE", "0");
    EXPECT_EQ(flight_recorder_size(), 0u);
    EXPECT_EQ(dump_flight_recorder(world, "x"), "");
  }
  EXPECT_EQ(flight_recorder_size(), 2000u);
  ScopedEnv size("SPMD_FLIGHT_RECORDER_SIZE", "many");
  testing::expect_throws<ConfigError>([] { flight_recorder_size(); },
                                      {"SPMD_FLIGHT_RECORDER_SIZE=many"});
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(dump_flight_recorder(world, "x"), "");  // never throws
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("flight recorder: the dump failed"),
            std::string::npos);
}

// ---- the diff
// ------------------------------------------------------------------------------------

TraceRecord record(int rank, uint64_t seq, std::string op, std::string dim, std::vector<int> group,
                   Shape shape = {4}, std::string detail = "op=sum") {
  TraceRecord r;
  r.rank = rank;
  r.sequence = seq;
  r.op = std::move(op);
  r.dim_name = std::move(dim);
  r.group_ranks = std::move(group);
  r.shape = std::move(shape);
  r.dtype = "f32";
  r.detail = std::move(detail);
  r.file = "/src/train.cpp";
  r.line = 10 + static_cast<uint32_t>(seq);
  r.start_us = 1.0;
  r.end_us = 2.0;
  return r;
}

// Rank r's expected calls on a (2, 2) mesh: tp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
std::vector<TraceRecord> expected_calls(int rank) {
  const std::vector<int> tp = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  const std::vector<int> dp = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  return {record(rank, 0, "all_reduce", "tp", tp),
          record(rank, 0, "all_gather", "dp", dp, {4}, "gather_dim=0"),
          record(rank, 1, "all_reduce", "tp", tp), record(rank, 1, "all_reduce", "dp", dp)};
}

TEST(TraceDiff, ReportsTheFirstDifferencePerRank) {
  TraceFile a;
  a.infos.push_back(TraceFileInfo{.ranks = {0, 1, 2, 3}});
  for (int rank = 0; rank < 4; ++rank) {
    for (TraceRecord& r : expected_calls(rank)) a.records.push_back(r);
  }
  TraceFile b;
  b.infos.push_back(TraceFileInfo{.kind = "flight_recorder", .ranks = {0, 1, 2}});
  b.infos.push_back(TraceFileInfo{.kind = "flight_recorder", .ranks = {3}, .first_event = 2});
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<TraceRecord> calls = expected_calls(rank);
    if (rank == 1) {  // record 2 is another collective
      calls[2].op = "all_gather";
      calls[2].detail = "gather_dim=0";
    }
    if (rank == 2) {  // hangs in its third call
      calls.resize(3);
      calls[2].end_us = 0.0;
    }
    for (TraceRecord& r : calls) b.records.push_back(r);
  }
  std::vector<TraceRecord> tail = expected_calls(3);  // the last two, from a ring of 2
  b.records.push_back(tail[2]);
  b.records.push_back(tail[3]);
  b.records.push_back(record(5, 0, "barrier", "all", {5}, {0}, ""));

  TraceDiff d = diff_traces(a, b, "sim.json", "dump");
  ASSERT_EQ(d.ranks.size(), 5u);
  EXPECT_FALSE(d.identical());
  EXPECT_EQ(d.ranks[0].kind, TraceRankDiff::Kind::Same);
  EXPECT_EQ(d.ranks[1].kind, TraceRankDiff::Kind::Differs);
  EXPECT_EQ(d.ranks[1].index_a, 2u);
  EXPECT_EQ(d.ranks[1].fields, (std::vector<std::string>{"op", "detail"}));
  EXPECT_EQ(d.ranks[2].kind, TraceRankDiff::Kind::EndsEarlyB);
  EXPECT_EQ(d.ranks[2].compared, 3u);
  EXPECT_EQ(d.ranks[3].kind, TraceRankDiff::Kind::Same);
  EXPECT_EQ(d.ranks[3].index_a, 4u);
  EXPECT_EQ(d.ranks[4].kind, TraceRankDiff::Kind::OnlyInB);
  EXPECT_EQ(d.to_string(),
            "trace diff: a = sim.json (16 records), b = dump (14 records)\n"
            "rank 0: the same 4 records\n"
            "rank 1: first difference at record 2 of a, 2 of b (after 2 equal):\n"
            "  a: seq 1 all_reduce 'tp' group [0, 1] [4] f32 op=sum at train.cpp:11 (completed, "
            "1.0 us)\n"
            "  b: seq 1 all_gather 'tp' group [0, 1] [4] f32 gather_dim=0 at train.cpp:11 "
            "(completed, 1.0 us)\n"
            "  differs in: op, detail\n"
            "rank 2: b ends after 3 equal records; a goes on with:\n"
            "  a: seq 1 all_reduce 'dp' group [0, 2] [4] f32 op=sum at train.cpp:11 (completed, "
            "1.0 us)\n"
            "  b's last: seq 1 all_reduce 'tp' group [2, 3] [4] f32 op=sum at train.cpp:11 "
            "(pending)\n"
            "rank 3: the same 2 records (aligned: a's record 2 is b's record 0)\n"
            "rank 5: only in b\n"
            "3 rank(s) differ\n");
}

TEST(TraceDiff, ComparesFilesOfTwoRuns) {
  auto run = [](const std::string& name, bool differ) {
    World world = World::sim(4);
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    trace().clear();
    three_calls(world, mesh);
    LocalTensor x = LocalTensor::from_fn(world, [&](int) { return zeros({differ ? 3 : 2}); });
    all_reduce(x, mesh, "tp");
    const std::string path = temp_path(name);
    trace().to_chrome_json(path);
    return path;
  };
  const std::string a = run("diff_a.json", false);
  const std::string same = run("diff_same.json", false);
  const std::string other = run("diff_other.json", true);
  EXPECT_TRUE(diff_traces(a, same).identical()) << diff_traces(a, same).to_string();
  TraceDiff d = diff_traces(a, other);
  ASSERT_EQ(d.ranks.size(), 4u);
  for (const TraceRankDiff& r : d.ranks) {
    EXPECT_EQ(r.kind, TraceRankDiff::Kind::Differs);
    EXPECT_EQ(r.index_a, 3u);
    EXPECT_EQ(r.fields, std::vector<std::string>{"shape"});
  }
}

}  // namespace
}  // namespace spmd
