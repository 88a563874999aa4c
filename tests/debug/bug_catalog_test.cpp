// The planted-bug catalog (tests/debug/bugs/README.md): every program, run with --spmd-debug=all
// under each backend its row names, exits non-zero with a report naming one of the lines marked
// `// REPORTED` in its source, and runs clean with the bug's effect absent from the flags (it is a
// silent bug without them, except the ones the threads backend always stops).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/support/run_command.h"

namespace spmd {
namespace {

using testing::CommandResult;
using testing::run_command;

struct Bug {
  const char* name;
  std::vector<const char*> backends;  // where --spmd-debug=all reports it
  const char* report;                 // what the report says (a fragment)
  const char* debug = "all";          // the --spmd-debug list
};

// "name.cpp:12" for every line of the program's source marked `// REPORTED`.
std::vector<std::string> reported_lines(const std::string& name) {
  std::ifstream in(std::string(SPMD_BUGS_SOURCE_DIR) + "/" + name + ".cpp");
  EXPECT_TRUE(in) << name;
  std::vector<std::string> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find("// REPORTED") != std::string::npos)
      out.push_back(fmt::format("{}.cpp:{}", name, n));
  }
  EXPECT_FALSE(out.empty()) << name << " marks no line `// REPORTED`";
  return out;
}

class BugCatalog : public ::testing::TestWithParam<Bug> {};

TEST_P(BugCatalog, ReportedAtTheUsersLine) {
  const Bug& bug = GetParam();
  const std::vector<std::string> lines = reported_lines(bug.name);
  for (const char* backend : bug.backends) {
    const std::string command = fmt::format(
        "{}/bug_{} --spmd-backend={} --spmd-world-size=8 "
        "--spmd-debug={}",
        SPMD_BUGS_DIR, bug.name, backend, bug.debug);
    CommandResult r = run_command(command);
    SCOPED_TRACE(fmt::format("{} ({:.2f} s)\n{}", command, r.seconds, r.output));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find(bug.report), std::string::npos) << "missing: " << bug.report;
    bool names_a_line = false;
    for (const std::string& line : lines) names_a_line |= r.output.find(line) != std::string::npos;
    EXPECT_TRUE(names_a_line) << "the report names none of the lines marked REPORTED";
    std::printf("%s under %s: %.2f s\n", bug.name, backend, r.seconds);
  }
}

// Without the checks, the bugs that sim cannot see otherwise run to the end (that is the point of
// the catalog: each needs its check).
TEST(BugCatalogSilent, SilentUnderSimWithoutChecks) {
  for (const char* name :
       {"forgotten_dp_grad_reduce", "sp_norm_gain_reduce", "coordinator_collective",
        "held_ranks_branch", "partial_claimed_replicate", "moe_shared_expert_replicate",
        "partial_to_local_from_local", "forgotten_dp_grad_local", "doubled_tp_grad_reduce",
        "sp_norm_gain_local", "grad_norm_clip_local"}) {
    CommandResult r =
        run_command(fmt::format("{}/bug_{} --spmd-world-size=8", SPMD_BUGS_DIR, name));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Planted, BugCatalog,
    ::testing::Values(
        // Under sim `all` includes types, which see the varying pieces before the replicate check.
        Bug{"forgotten_dp_grad_reduce",
            {"sim"},
            "along mesh axis 'dp' the LocalTensor is V (to_local at"},
        Bug{"forgotten_dp_grad_reduce", {"threads"}, "DTensor::from_local at"},
        Bug{"sp_norm_gain_reduce", {"sim"}, "along mesh axis 'tp' the LocalTensor is V (sub at"},
        Bug{"sp_norm_gain_reduce", {"threads"}, "claims Replicate on mesh dim 1 ('tp')"},
        Bug{"coordinator_collective", {"sim"}, "only the coordinator reaches this call"},
        Bug{"coordinator_collective", {"threads"}, "DeadlockError"},
        Bug{"local_rank_branch", {"sim"}, "PerRank comparison `==`"},
        Bug{"local_rank_branch", {"threads"}, "DeadlockError"},
        Bug{"held_ranks_branch", {"threads"}, "DeadlockError"},
        Bug{"partial_claimed_replicate",
            {"sim"},
            "along mesh axis 'tp' the LocalTensor is V (to_local at"},
        Bug{"partial_claimed_replicate", {"threads"}, "say Partial()"},
        Bug{"diverged_replica", {"sim", "threads"}, "input 1 of DTensor op 'matmul'"},
        Bug{"early_return", {"sim"}, "PerRank comparison `==`"},
        Bug{"early_return", {"threads"}, "rank 3 has finished (returned)"},
        // SPMD types (Note [SPMD types] in sim/spmd_types.h): part of `all` under sim; under
        // threads the type rules run with --spmd-debug=types.
        Bug{"moe_shared_expert_replicate",
            {"sim"},
            "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is R"},
        Bug{"moe_shared_expert_replicate", {"threads"}, "must stay Partial", "types"},
        Bug{"partial_to_local_from_local",
            {"sim"},
            "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is P (to_local "
            "at"},
        Bug{"partial_to_local_from_local",
            {"threads"},
            "to_local + from_local on a Partial",
            "types"},
        Bug{"forgotten_dp_grad_local", {"sim"}, "TypeError: sub: along mesh axis 'dp'"},
        Bug{"forgotten_dp_grad_local", {"threads"}, "is P (backward at", "types"},
        Bug{"doubled_tp_grad_reduce",
            {"sim"},
            "TypeError: all_reduce: along mesh axis 'tp' the input is R (all_reduce at"},
        Bug{"doubled_tp_grad_reduce", {"threads"}, "doubled reduction", "types"},
        Bug{"sp_norm_gain_local", {"sim"}, "TypeError: sub: along mesh axis 'tp'"},
        Bug{"sp_norm_gain_local", {"threads"}, "along mesh axis 'tp'", "types"},
        Bug{"grad_norm_clip_local",
            {"sim"},
            "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is V (sub at"},
        Bug{"grad_norm_clip_local", {"threads"}, "placement R claims identical pieces", "types"}),
    [](const ::testing::TestParamInfo<Bug>& info) {
      return fmt::format("{}_{}", info.param.name, info.param.backends.front());
    });

}  // namespace
}  // namespace spmd
