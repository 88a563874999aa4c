// The planted-bug catalog (tests/debug/bugs/README.md): every program, run with --spmd-debug=all
// (or what its row says) under each backend its row names, exits non-zero with a report naming
// one of the lines marked `// REPORTED` in its source. The bugs the SPMD types see are reported
// with no flag at all; the others run to the end without their check (a silent bug). This file
// builds twice: bug_catalog_test runs the sim and threads rows, and, where MPI is built,
// bug_catalog_mpi_test (SPMD_BUG_CATALOG_MPI, label mpi) runs the mpi rows under mpirun -n 8.
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
  std::vector<const char*> backends;  // where it is reported: sim, threads, mpi
  const char* report;                 // what the report says (a fragment)
  const char* debug = "all";          // the --spmd-debug list ("" for none)
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

// The program's command line under `backend`.
std::string command_for(const Bug& bug, std::string_view backend) {
  const std::string program = fmt::format("{}/bug_{}", SPMD_BUGS_DIR, bug.name);
  const std::string flags =
      std::string(bug.debug).empty() ? "" : fmt::format(" --spmd-debug={}", bug.debug);
#ifdef SPMD_BUG_CATALOG_MPI
  return fmt::format("{}{} -n 8 {} --spmd-backend=mpi{}", testing::mpi_env_prefix(), SPMD_MPIEXEC,
                     program, flags);
#else
  return fmt::format("{} --spmd-backend={} --spmd-world-size=8{}", program, backend, flags);
#endif
}

TEST_P(BugCatalog, ReportedAtTheUsersLine) {
  const Bug& bug = GetParam();
  const std::vector<std::string> lines = reported_lines(bug.name);
  for (const char* backend : bug.backends) {
#ifdef SPMD_BUG_CATALOG_MPI
    if (std::string_view(backend) != "mpi") continue;
#else
    if (std::string_view(backend) == "mpi") continue;
#endif
    const std::string command = command_for(bug, backend);
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

#ifndef SPMD_BUG_CATALOG_MPI
// Without their checks, the bugs that only a check sees run to the end (that is the point of the
// catalog: each needs its check). The SPMD types need no flag: the last rows above (debug "").
TEST(BugCatalogSilent, SilentUnderSimWithoutChecks) {
  for (const char* name :
       {"coordinator_collective", "held_ranks_branch", "diverged_replica", "to_local_claim_untyped",
        "parity_rope_positions", "parity_dropout_per_rank", "parity_local_batch_mean",
        "parity_sp_norm_gain_avg", "parity_grad_accum_count"}) {
    CommandResult r =
        run_command(fmt::format("{}/bug_{} --spmd-world-size=8", SPMD_BUGS_DIR, name));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
}
#endif

// The rows. `report` is the same under every backend its row names unless the row says otherwise.
const Bug kBugs[] = {
    // Under sim `all` includes types, which see the varying pieces before the replicate check;
    // the types run on every backend without a flag.
    {"forgotten_dp_grad_reduce",
     {"sim", "threads", "mpi"},
     "along mesh axis 'dp' the LocalTensor is V (to_local at",
     ""},
    {"sp_norm_gain_reduce",
     {"sim", "threads", "mpi"},
     "along mesh axis 'tp' the LocalTensor is V (sub at",
     ""},
    {"coordinator_collective", {"sim"}, "only the coordinator reaches this call"},
    {"coordinator_collective", {"threads"}, "DeadlockError"},
    {"local_rank_branch", {"sim"}, "PerRank comparison `==`"},
    {"local_rank_branch", {"threads"}, "DeadlockError"},
    {"held_ranks_branch", {"threads"}, "DeadlockError"},
    {"partial_claimed_replicate",
     {"sim", "threads", "mpi"},
     "along mesh axis 'tp' the LocalTensor is V (to_local at",
     ""},
    {"diverged_replica", {"sim", "threads", "mpi"}, "input 1 of DTensor op 'matmul'"},
    {"early_return", {"sim"}, "PerRank comparison `==`"},
    {"early_return", {"threads"}, "rank 3 has finished (returned)"},
    // SPMD types (Note [SPMD types] in world/spmd_types.h): always on, on every backend.
    {"moe_shared_expert_replicate",
     {"sim", "threads", "mpi"},
     "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is R",
     ""},
    {"partial_to_local_from_local",
     {"sim", "threads", "mpi"},
     "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is P (to_local at",
     ""},
    {"forgotten_dp_grad_local",
     {"sim", "threads", "mpi"},
     "TypeError: sub: along mesh axis 'dp'",
     ""},
    {"doubled_tp_grad_reduce",
     {"sim", "threads", "mpi"},
     "TypeError: all_reduce: along mesh axis 'tp' the input is R (all_reduce at",
     ""},
    {"doubled_dp_grad_reduce",
     {"sim", "threads", "mpi"},
     "TypeError: all_reduce: along mesh axis 'dp' the input is R (all_reduce at",
     ""},
    // ... and under `all`, which includes types on every backend.
    {"doubled_dp_grad_reduce", {"sim", "threads", "mpi"}, "a doubled reduction"},
    {"sp_norm_gain_local", {"sim", "threads", "mpi"}, "TypeError: sub: along mesh axis 'tp'", ""},
    {"grad_norm_clip_local",
     {"sim", "threads", "mpi"},
     "TypeError: DTensor::from_local: along mesh axis 'tp' the LocalTensor is V (sub at",
     ""},
    // Gradient claims of to_local: the types see them where the local code uses the value...
    {"to_local_used_per_rank",
     {"sim", "threads", "mpi"},
     "to_local at to_local_used_per_rank.cpp:17 claims this value's gradient arrives identical",
     ""},
    {"tp_grad_claimed_replicate",
     {"sim", "threads", "mpi"},
     "to_local at tp_grad_claimed_replicate.cpp:17 claims this value's gradient arrives "
     "identical on every rank of 'tp'",
     ""},
    // ... and the data check sees them when the gradient arrives (untyped data hides the cause).
    {"to_local_claim_untyped",
     {"sim", "threads", "mpi"},
     "to_local at to_local_claim_untyped.cpp:20 claims through grad_placements R that the "
     "gradient of its LocalTensor is Replicate on mesh dim 0 ('tp')"},
    // The debug checks' own gathers must not pair a skipped DTensor op with the next one.
    {"rank_skips_clip", {"sim"}, "PerRank comparison `!=`"},
    {"rank_skips_clip",
     {"threads"},
     "CollectiveMismatchError: call #36 of group ranks [0, 1, 2, 3, 4, 5, 6, 7] over mesh dim 'dp "
     "(--spmd-debug check)'"},
    {"rank_skips_clip", {"mpi"}, "the ranks are at different DTensor ops"},
    // Pipelines (Note [Point-to-point]): no flag needed, every backend sees these.
    {"pp_skipped_send", {"sim"}, "rank 0 has sent nothing to rank 1 over 'pp'", ""},
    // threads: the senders wait in the digest's collective, the receivers in the recv. (mpi sees
    // it only at --spmd-timeout: the senders are not gone, they wait elsewhere.)
    {"pp_skipped_send", {"threads"}, "waits in recv over 'pp' [2, 4] f32 tag=3", ""},
    {"pp_swapped_tag", {"sim", "threads", "mpi"}, "they differ in tag", ""},
    {"pp_wrong_microbatch",
     {"sim", "threads", "mpi"},
     "stage 1 receives microbatch 1 where microbatch 0 was due",
     ""},
    {"pp_dropped_backward", {"sim", "threads", "mpi"}, "B(stage 1, mb 3)", ""},
    // Llama and MoE in local code (issue 27).
    {"ep_expert_grad_replicate",
     {"sim", "threads", "mpi"},
     "to_local at ep_expert_grad_replicate.cpp:21 claims this value's gradient arrives identical "
     "on every rank of 'dp'",
     ""},
    {"moe_router_tp_unreduced",
     {"sim", "threads", "mpi"},
     "TypeError: sub: along mesh axis 'tp'",
     ""},
    {"gqa_kv_not_repeated",
     {"sim", "threads", "mpi"},
     "k has 2 heads for q's 8: repeat the key/value heads (repeat_interleave(k, 4, -3)) or pass "
     "enable_gqa",
     ""},
    // Values that depart from one device (issue 24, Note [Parity run] in debug/parity.h): only
    // the parity run sees them, at the line whose DTensor first differs; `all` includes it.
    {"parity_rope_positions",
     {"sim"},
     "ParityError: --spmd-debug=parity: 'from_local' at parity_rope_positions.cpp:18 "
     "(occurrence 1) departs from the same program on one rank"},
    {"parity_rope_positions", {"sim"}, "'from_local' at parity_rope_positions.cpp:18", "parity"},
    {"parity_dropout_per_rank", {"sim"}, "'from_local' at parity_dropout_per_rank.cpp:", "parity"},
    {"parity_local_batch_mean", {"sim"}, "'from_local' at parity_local_batch_mean.cpp:", "parity"},
    {"parity_sp_norm_gain_avg", {"sim"}, "'from_local' at parity_sp_norm_gain_avg.cpp:", "parity"},
    {"parity_grad_accum_count", {"sim"}, "'mul' at parity_grad_accum_count.cpp:", "parity"},
};

INSTANTIATE_TEST_SUITE_P(Planted, BugCatalog, ::testing::ValuesIn(kBugs),
                         [](const ::testing::TestParamInfo<Bug>& info) {
                           return fmt::format("{}_{}_{}", info.param.name,
                                              info.param.backends.front(), info.index);
                         });

}  // namespace
}  // namespace spmd
