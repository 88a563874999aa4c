// spmd/runtime/options.h: what launch() reads from the command line and the environment, and which
// launcher (mpirun, srun, spmdrun) started this process.
//
// Every flag has an environment variable; a flag wins over its variable:
//   --spmd-backend=sim|threads|mpi|nccl   SPMD_BACKEND     (default sim)
//   --spmd-world-size=N                   SPMD_WORLD_SIZE  (sim/threads: default 8; under a
//                                                           launcher it must match its size)
//   --spmd-trace=path                     SPMD_TRACE       (Chrome trace JSON written at exit)
//   --spmd-debug=check,replicate,fingerprint,nan  SPMD_DEBUG
//   --spmd-topology=file.json             SPMD_TOPOLOGY    (the cost model's topology)
//   --spmd-nccl-timeout=S                 SPMD_NCCL_TIMEOUT (nccl: seconds before a stuck
//                                                           collective ends the run; default 300)
//   --spmd-gpus-per-process=K             SPMD_GPUS_PER_PROCESS (nccl: ranks, one GPU each,
//                                                           per process; default 1)
// Both `--spmd-x=value` and `--spmd-x value` are accepted; parsing stops at `--`.
//
//   LaunchOptions o = parse_launch_options(argc, argv);  // argv now lacks the --spmd-* flags
//   if (auto l = detect_launcher()) fmt::print("{} rank {} of {}\n", l->name, l->rank, l->size);
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/sim/world.h>

namespace spmd {

// The backends launch() knows, in the order error messages list them.
inline const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names = {"sim", "threads", "mpi", "nccl"};
  return names;
}

// "sim, threads, mpi, nccl".
std::string backend_list();

struct LaunchOptions {
  std::string backend = "sim";
  std::optional<int> world_size;
  std::string trace_path;  // empty: no trace file
  DebugOptions debug;
  std::string topology_path;             // empty: the default topology
  std::optional<double> nccl_timeout_s;  // Note [NCCL watchdog]; default 300
  int gpus_per_process = 1;
  // Where each setting came from, for messages: "--spmd-world-size=8", "SPMD_WORLD_SIZE=8" or
  // empty for the default.
  std::string backend_source;
  std::string world_size_source;
};

// The options from the SPMD_* environment only. ConfigError for a bad value, naming the variable.
LaunchOptions launch_options_from_env();
// The environment's options overridden by the --spmd-* flags of argv. The flags are removed from
// argv and argc is updated (argv[argc] stays nullptr). ConfigError for an unknown --spmd-* flag,
// a flag without its value, an unknown backend or debug check, or a world size that is not a
// positive integer.
LaunchOptions parse_launch_options(int& argc, char** argv);
// "check,nan" -> DebugOptions{.check = true, .nan = true}; empty items are skipped. ConfigError
// naming `source` and the valid checks for anything else.
DebugOptions parse_debug_options(std::string_view list, std::string_view source = "--spmd-debug");

// The process launcher that started this process, from its environment.
struct LauncherInfo {
  std::string name;           // "mpirun", "srun" or "spmdrun"
  int rank = 0;               // this process's rank in the job
  int size = 0;               // processes in the job
  int local_rank = 0;         // rank among the processes on this host
  int local_size = 0;         // processes on this host; 0 when the launcher does not say
  std::string size_variable;  // the variable the size came from, e.g. "OMPI_COMM_WORLD_SIZE"
};
// mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID) or spmdrun (SPMD_RANK, SPMD_WORLD_SIZE, SPMD_LOCAL_RANK, SPMD_LOCAL_WORLD_SIZE),
// checked in that order; nullopt when none is set. ConfigError when a variable is not a number or
// the rank is outside 0..size-1.
std::optional<LauncherInfo> detect_launcher();

}  // namespace spmd
