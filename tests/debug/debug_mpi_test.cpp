// The debug modes under real mpirun jobs (label mpi): the fingerprint exchange turns a mismatched
// collective into a CollectiveMismatchError listing every rank's call, a failing rank dumps its
// flight recorder, check refuses a world that lacks ranks, nan works per process, and a cluster's
// trace diffs against the simulator's.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <spmd/debug/trace_diff.h>
#include <spmd/debug/trace_file.h>
#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

CommandResult mpirun(int n, const std::string& args, const std::string& env = "") {
  return testing::run_mpirun(SPMD_MPIEXEC, n, SPMD_DEBUG_PROBE, "--spmd-backend=mpi " + args, env);
}

using testing::contains;

TEST(FingerprintMpi, ShapeMismatchListsEveryRanksCallAndSite) {
  CommandResult plain = mpirun(4, "--probe-bug=shape");
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output,
                       "CommError: all_reduce over mesh dim 'tp' (group ranks [0, "
                       "1]): inputs differ within the group: rank 0: [2, 2] f32, "
                       "rank 1: [3, 2] f32"))
      << plain.output;

  CommandResult r = mpirun(4, "--probe-bug=shape --spmd-debug=fingerprint");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "CollectiveMismatchError: all_reduce over mesh dim 'tp' (group ranks [0, "
                       "1]): the ranks of the group issued different calls: rank 0: all_reduce "
                       "[2, 2] f32 op=sum (call #0 at debug_probe.cpp:"))
      << r.output;
  EXPECT_TRUE(
      contains(r.output, "rank 1: all_reduce [3, 2] f32 op=sum (call #0 at debug_probe.cpp:"))
      << r.output;
  EXPECT_LT(r.seconds, 60.0);
}

TEST(FingerprintMpi, DifferentCollectivesFailInsteadOfHanging) {
  CommandResult r = mpirun(4, "--probe-bug=kind --spmd-debug=fingerprint");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: all_reduce [2, 2] f32 op=sum (call #0 at ")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: all_gather [2, 2] f32 gather_dim=0 (call #0 at "))
      << r.output;
}

TEST(FlightRecorderMpi, FailingRankDumpsItsLastCollectives) {
  const std::string dir = testing::fresh_temp_dir("spmd_debug_mpi_flight_recorder");
  CommandResult r = mpirun(4, "--probe-bug=throw", "SPMD_FLIGHT_RECORDER_FILE=" + dir + "/fr.json");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] CommError: probe: rank 2 fails on purpose")) << r.output;
  const std::string path = dir + "/fr.rank2.json";
  EXPECT_TRUE(contains(r.output,
                       "[rank 2] flight recorder (CommError: probe: rank 2 fails on "
                       "purpose): "))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[rank 2] rank 2's last 3 collective(s), oldest first:\n[rank 2]   seq 0 "
                       "all_reduce 'tp' group [2, 3] [2, 2] f32 op=sum at debug_probe.cpp:"))
      << r.output;
  ASSERT_TRUE(std::filesystem::exists(path)) << r.output;
  TraceFile dump = read_trace_file(path);
  ASSERT_EQ(dump.infos.size(), 1u);
  EXPECT_EQ(dump.infos[0].kind, "flight_recorder");
  EXPECT_EQ(dump.infos[0].backend, "mpi");
  EXPECT_EQ(dump.infos[0].ranks, std::vector<int>{2});
  EXPECT_EQ(dump.infos[0].world_size, 4);
  ASSERT_EQ(dump.ranks(), std::vector<int>{2});
  std::vector<TraceRecord> mine = dump.records_of(2);
  ASSERT_GE(mine.size(), 2u);
  EXPECT_EQ(mine[0].op, "all_reduce");
  EXPECT_EQ(mine[0].dim_name, "tp");
  EXPECT_EQ(mine[0].group_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(mine[1].op, "all_gather");
  EXPECT_EQ(mine[1].dim_name, "dp");

  // The simulator's expected sequence against the cluster's dump: rank 2 agrees up to its failure.
  const std::string sim = dir + "/sim.json";
  CommandResult s = run_command(std::string(SPMD_DEBUG_PROBE) +
                                " --spmd-world-size=4 --probe-bug=throw --spmd-trace=" + sim);
  EXPECT_EQ(s.exit_code, 1) << s.output;
  TraceDiff d = diff_traces(sim, path);
  ASSERT_EQ(d.ranks.size(), 4u) << d.to_string();
  EXPECT_EQ(d.ranks[2].kind, TraceRankDiff::Kind::Same) << d.to_string();
  EXPECT_EQ(d.ranks[0].kind, TraceRankDiff::Kind::OnlyInA) << d.to_string();
}

TEST(TraceDiffMpi, ClusterTraceMatchesTheSimulatorsAndShowsADifference) {
  const std::string dir = testing::fresh_temp_dir("spmd_debug_mpi_diff");
  CommandResult m = mpirun(4, "--spmd-trace=" + dir + "/mpi.json");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  CommandResult s = run_command(std::string(SPMD_DEBUG_PROBE) +
                                " --spmd-world-size=4 --spmd-trace=" + dir + "/sim.json");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  TraceDiff same = diff_traces(dir + "/sim.json", dir + "/mpi.json");
  EXPECT_TRUE(same.identical()) << same.to_string();
  EXPECT_EQ(same.ranks.size(), 4u);

  CommandResult other =
      run_command(std::string(SPMD_DEBUG_PROBE) +
                  " --spmd-world-size=4 --probe-rows=3 --spmd-trace=" + dir + "/sim3.json");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  TraceDiff d = diff_traces(dir + "/sim3.json", dir + "/mpi.json");
  EXPECT_FALSE(d.identical());
  for (const TraceRankDiff& r : d.ranks) {
    EXPECT_EQ(r.kind, TraceRankDiff::Kind::Differs) << d.to_string();
    EXPECT_EQ(r.index_a, 0u);
    EXPECT_EQ(r.fields, std::vector<std::string>{"shape"});
  }
}

TEST(DebugModesMpi, NanReportsTheRankUnderMpi) {
  CommandResult r = mpirun(4, "--probe-bug=nan --spmd-debug=nan");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output, "NonFiniteError: --spmd-debug=nan: DTensor op 'log' at debug_probe.cpp:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "produced NaN on rank ")) << r.output;
  EXPECT_TRUE(contains(
      r.output, "at index [1, 0] of its piece (global index [4, 0]); its inputs were finite"))
      << r.output;
}

// Under mpi each process holds one rank of a CPU world: check and replicate gather the pieces over
// the internal collectives, so the same bugs are caught as under sim.
TEST(DebugModesMpi, CheckAndReplicateRunUnderMpi) {
  CommandResult clean = mpirun(4, "--spmd-debug=check,replicate");
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_TRUE(contains(clean.output, "probe: total 65 on 4 ranks")) << clean.output;
  CommandResult uneven = mpirun(4, "--probe-bug=uneven --spmd-debug=check");
  EXPECT_NE(uneven.exit_code, 0) << uneven.output;
  EXPECT_TRUE(contains(uneven.output,
                       "DivergenceError: --spmd-debug=check: DTensor op 'add_row_index' at "
                       "debug_probe.cpp:"))
      << uneven.output;
  EXPECT_TRUE(contains(uneven.output, "differs from the same op on the full tensors"))
      << uneven.output;
  CommandResult replica = mpirun(4, "--probe-bug=replica --spmd-debug=replicate");
  EXPECT_NE(replica.exit_code, 0) << replica.output;
  EXPECT_TRUE(contains(replica.output,
                       "DivergenceError: --spmd-debug=replicate: input 0 of DTensor op 'mul' at "
                       "debug_probe.cpp:"))
      << replica.output;
}

}  // namespace
}  // namespace spmd
