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
        "--spmd-debug=all",
        SPMD_BUGS_DIR, bug.name, backend);
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
        "held_ranks_branch", "partial_claimed_replicate"}) {
    CommandResult r =
        run_command(fmt::format("{}/bug_{} --spmd-world-size=8", SPMD_BUGS_DIR, name));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Planted, BugCatalog,
    ::testing::Values(
        Bug{"forgotten_dp_grad_reduce", {"sim", "threads"}, "DTensor::from_local at"},
        Bug{"sp_norm_gain_reduce", {"sim", "threads"}, "claims Replicate on mesh dim 1 ('tp')"},
        Bug{"coordinator_collective", {"sim"}, "only the coordinator reaches this call"},
        Bug{"coordinator_collective", {"threads"}, "DeadlockError"},
        Bug{"local_rank_branch", {"sim"}, "PerRank comparison `==`"},
        Bug{"local_rank_branch", {"threads"}, "DeadlockError"},
        Bug{"held_ranks_branch", {"threads"}, "DeadlockError"},
        Bug{"partial_claimed_replicate", {"sim", "threads"}, "say Partial()"},
        Bug{"diverged_replica", {"sim", "threads"}, "input 1 of DTensor op 'matmul'"},
        Bug{"early_return", {"sim"}, "PerRank comparison `==`"},
        Bug{"early_return", {"threads"}, "rank 3 has finished (returned)"}),
    [](const ::testing::TestParamInfo<Bug>& info) {
      return fmt::format("{}_{}", info.param.name, info.param.backends.front());
    });

}  // namespace
}  // namespace spmd
