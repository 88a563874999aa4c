// The example programs as processes under sim: each one's check passes at the world sizes it
// supports, and it prints what its banner promises (gpt is what scripts/demo shows).
// The digest tests (CMakeLists.txt) compare the same programs under mpirun.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

using testing::contains;

// `text` with every run of spaces as one space, so expectations do not depend on column widths.
std::string squeeze(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  return out;
}

CommandResult run_example(const std::string& name, int world_size,
                          const std::string& backend = "sim") {
  return run_command(std::string(SPMD_EXAMPLES_DIR) + "/" + name + " --spmd-backend=" + backend +
                     " --spmd-world-size=" + std::to_string(world_size));
}

std::string digest_of(const std::string& output) {
  const std::size_t at = output.find("\ndigest: ");
  return at == std::string::npos ? std::string() : output.substr(at + 1, 25);
}

// Runs `name` on `world_size` ranks; it must exit 0, pass its check, print one digest and every
// line of `expected`.
void expect_passes(const std::string& name, int world_size,
                   const std::vector<std::string>& expected = {}) {
  const CommandResult r = run_example(name, world_size);
  const std::string where = name + " on " + std::to_string(world_size) + " ranks:\n" + r.output;
  EXPECT_EQ(r.exit_code, 0) << where;
  EXPECT_TRUE(contains(r.output, "check: PASS")) << where;
  EXPECT_FALSE(contains(r.output, "FAIL")) << where;
  EXPECT_TRUE(contains(r.output, "\ndigest: ")) << where;
  for (const std::string& line : expected) {
    EXPECT_TRUE(contains(squeeze(r.output), squeeze(line))) << line << "\n" << where;
  }
}

TEST(Examples, TpMlpShowsMeshShardingForwardBackwardTraceAndCheck) {
  expect_passes("tp_mlp", 8,
                {"DeviceMesh((dp=2, tp=4), stride=(4, 1))", "== sharding",
                 "R,S(1): column-parallel", "R,S(0): row-parallel", "h = x @ W1          S(0),S(1)",
                 "z = tanh(h) @ W2    S(0),P(sum)", "y = z.redistribute  S(0),R", "== backward",
                 "== collectives of the step (this process's trace; estimates on the default "
                 "topology, 8 devices per host)",
                 "all_reduce", "estimated us", "W2 after SGD"});
  expect_passes("tp_mlp", 4, {"DeviceMesh((dp=2, tp=2), stride=(2, 1))"});
  expect_passes("tp_mlp", 2);
}

// Under threads each rank thread runs the program on its own World; every example must pass and
// print sim's digest. (The digest tests run -n 8 for all but tp_mlp, whose float sums over 4 ranks
// differ under mpirun; see CMakeLists.txt.)
TEST(Examples, EveryExampleUnderThreadsMatchesSim) {
  for (const char* name : {"tp_mlp", "fsdp_tp_2d", "expert_parallel_mesh", "pipeline"}) {
    const CommandResult sim = run_example(name, 8);
    const CommandResult threads = run_example(name, 8, "threads");
    EXPECT_EQ(threads.exit_code, 0) << name << ":\n" << threads.output;
    EXPECT_TRUE(contains(threads.output, "backend threads")) << name << ":\n" << threads.output;
    EXPECT_TRUE(contains(threads.output, "check: PASS")) << name << ":\n" << threads.output;
    EXPECT_FALSE(digest_of(sim.output).empty()) << name << ":\n" << sim.output;
    EXPECT_EQ(digest_of(threads.output), digest_of(sim.output)) << name;
  }
}

TEST(Examples, TpMlpRejectsAnOddWorld) {
  for (int world_size : {1, 3, 7}) {
    const CommandResult r = run_example("tp_mlp", world_size);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "even world size, got " + std::to_string(world_size)))
        << r.output;
  }
}

// Every even world size: tp = size / 2 need not divide F = 32 (uneven column blocks; with tp > 32
// some ranks hold none), and tp may exceed 4.
TEST(Examples, TpMlpRunsOnEveryEvenWorld) {
  expect_passes("tp_mlp", 6, {"DeviceMesh((dp=2, tp=3), stride=(3, 1))"});
  expect_passes("tp_mlp", 12);
  expect_passes("tp_mlp", 16);
  expect_passes("tp_mlp", 64);
  expect_passes("tp_mlp", 66, {"DeviceMesh((dp=2, tp=33), stride=(33, 1))"});
  const CommandResult sim = run_example("tp_mlp", 6);
  const CommandResult threads = run_example("tp_mlp", 6, "threads");
  EXPECT_EQ(threads.exit_code, 0) << threads.output;
  EXPECT_FALSE(digest_of(sim.output).empty()) << sim.output;
  EXPECT_EQ(digest_of(threads.output), digest_of(sim.output)) << threads.output;
}

TEST(Examples, FsdpTp2dConcatenatesTheDpAndTpSubmeshes) {
  expect_passes("fsdp_tp_2d", 8,
                {"concatenate({root[\"dp\"], root[\"tp\"]}) = DeviceMesh((dp=2, tp=2)",
                 "equals root[{\"dp\", \"tp\"}]: true", "communicator of dp is the root's: true",
                 "reduce_scatter", "all_gather"});
  expect_passes("fsdp_tp_2d", 4);
  expect_passes("fsdp_tp_2d", 12);
}

TEST(Examples, ExpertParallelMeshReusesCommunicatorsOfCoincidingGroups) {
  expect_passes("expert_parallel_mesh", 8,
                {"moe ep          = dense cp                     reused (dense cp)",
                 "moe ep_tp       = dense tp                     reused (dense tp)",
                 "moe_wide ep     [0, 2, 4, 6] [1, 3, 5, 7]      new",
                 "communicators in the cache: 3 after dense, 3 after moe, 4 after moe_wide",
                 "all_to_all_single"});
  expect_passes("expert_parallel_mesh", 4);
  expect_passes("expert_parallel_mesh", 16);
}

// Every schedule's step against one device (examples/pipeline.cpp), on (pp, dp) meshes of 4 and 8
// ranks and a 3-stage one; a dry run reports the in-flight activations per pp rank.
TEST(Examples, PipelineRunsEveryMicrobatchThroughEveryStage) {
  expect_passes("pipeline", 8,
                {"4 stages (4 pp ranks x 1 per rank), 4 microbatches",
                 "1f1b: 4 ranks, 4 microbatches", "makespan 21, bubble 42.9%"});
  expect_passes("pipeline --schedule interleaved", 8, {"8 stages (4 pp ranks x 2 per rank)"});
  expect_passes("pipeline --schedule zb --microbatches 8", 4);
  expect_passes("pipeline --schedule gpipe", 6);
  const CommandResult r = run_command(std::string(SPMD_EXAMPLES_DIR) +
                                      "/pipeline --spmd-world-size=8 --spmd-tensors=meta");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "pipeline: 1f1b, 4 pp ranks x 4 microbatches")) << r.output;
  EXPECT_TRUE(contains(r.output, "in flight")) << r.output;
}

TEST(Examples, GptTrainsWithTpSpAndFsdpAndMatchesOneDevice) {
  expect_passes("gpt", 8,
                {"DeviceMesh((dp=2, tp=4), stride=(4, 1))",
                 "token embedding (vocabulary parallel) [256, 64] R,S(0)",
                 "attention query (column-wise: heads over tp) [64, 64] S(0),S(1)",
                 "reduce_scatter tp", "reduce_scatter dp", "all_gather dp", "loss falls: yes"});
  // Heads that do not divide over tp (4 over 3) are gathered where a shard cannot hold them.
  expect_passes("gpt", 6);
  const CommandResult r =
      run_command(std::string(SPMD_EXAMPLES_DIR) + "/gpt --spmd-world-size=4 --heads 3 --steps 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--d-model 64 must be a multiple of --heads 3")) << r.output;
}

// Gradient accumulation (--accumulate, Note [No sync]) and recompute (dropout on): the check
// against one device running the same microbatches passes, also in a dry run; --recompute changes
// no digest; a batch that does not split is a ConfigError that says so, as is --accumulate with
// --pp.
TEST(Examples, GptAccumulatesMicrobatchesAndRefusesWhatDoesNotSplit) {
  expect_passes("gpt --accumulate 2 --recompute --steps 2", 8,
                {"gradient accumulation: 2 microbatches of 4 rows a step",
                 "every block's activations recomputed in backward", "loss falls: yes"});
  const std::string gpt = std::string(SPMD_EXAMPLES_DIR) + "/gpt --spmd-world-size=8 ";
  // Recomputed blocks draw the same dropout masks: the digest of the run without --recompute.
  const CommandResult plain = run_command(gpt + "--steps 2");
  const CommandResult recomputed = run_command(gpt + "--steps 2 --recompute");
  EXPECT_FALSE(digest_of(plain.output).empty()) << plain.output;
  EXPECT_EQ(digest_of(recomputed.output), digest_of(plain.output)) << recomputed.output;
  const CommandResult dry =
      run_command(gpt + "--accumulate 2 --steps 1 --mode sp --spmd-tensors=meta");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--accumulate 3", "--batch 8 must split into --accumulate 3 microbatches"},
           {"--accumulate 8", "microbatches of a multiple of dp = 2 rows each"},
           {"--pp 2 --accumulate 2", "--accumulate, --save and --load run without --pp"},
           {"--pp 2 --schedule zb --recompute",
            "--recompute with --pp runs the gpipe, 1f1b and interleaved schedules"},
           {"--accumulate 0", "--accumulate needs a positive integer"}}) {
    const CommandResult r = run_command(gpt + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_TRUE(contains(r.output, "ConfigError")) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, message)) << args << "\n" << r.output;
  }
}

// Pipeline parallelism (--pp): the (pp, dp, tp) mesh, the schedule as it ran and one device's
// losses; a layer count that does not split into the stages is a ConfigError that says so.
TEST(Examples, GptPipelineMatchesOneDevice) {
  expect_passes("gpt --pp 2 --steps 2", 8,
                {"DeviceMesh((pp=2, dp=2, tp=2), stride=(4, 2, 1))",
                 "pipeline: schedule 1f1b, 4 microbatches of 2 rows, 2 stages (2 pp ranks x 1 "
                 "virtual), blocks per stage: 1",
                 "send pp", "all_reduce pp", "pipeline schedule as it ran:"});
  expect_passes("gpt --pp 4 --schedule interleaved --steps 2", 8,
                {"8 stages (4 pp ranks x 2 virtual)"});
  const CommandResult r =
      run_command(std::string(SPMD_EXAMPLES_DIR) + "/gpt --spmd-world-size=8 --pp 2 --layers 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--layers 3 does not split into 2 pipeline stages")) << r.output;
  // A dry run: 1F1B's in-flight microbatches per pp rank (2, then 1) and the pipelined step.
  const CommandResult dry = run_command(std::string(SPMD_EXAMPLES_DIR) +
                                        "/gpt --spmd-world-size=8 --pp 2 --steps 1 --mode sp "
                                        "--spmd-tensors=meta");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_TRUE(contains(squeeze(dry.output), squeeze("pipeline: 1f1b, 2 pp ranks x 4 microbatches")))
      << dry.output;
  EXPECT_TRUE(contains(dry.output, "pipelined: makespan")) << dry.output;
}

}  // namespace
}  // namespace spmd
