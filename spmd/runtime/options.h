// spmd/runtime/options.h: what launch() reads from the command line and the environment. Which
// launcher (mpirun, srun, spmdrun) started this process is world/launcher.h.
//
// Every flag has an environment variable; a flag wins over its variable:
//   --spmd-backend=sim|threads|mpi|nccl   SPMD_BACKEND     (default sim)
//   --spmd-world-size=N                   SPMD_WORLD_SIZE  (sim/threads: default 8; under a
//                                                           launcher it must match its size)
//   --spmd-trace=path                     SPMD_TRACE       (Chrome trace JSON written at exit)
//   --spmd-debug=all or a list of check,replicate,fingerprint,nan[:allow-inf],divergence,types,
//                 parity                  SPMD_DEBUG
//   --spmd-parity-tol=X                   SPMD_PARITY_TOL  (parity's largest relative difference;
//                                                           Note [Parity run] in debug/parity.h)
//   --spmd-dump-values=DIR                SPMD_DUMP_VALUES (every DTensor's values per call site,
//                                                           for `spmd parity`; Note [Value dumps]
//                                                           in debug/value_dump.h)
//   --spmd-topology=file.json             SPMD_TOPOLOGY    (the cost model's topology)
//   --spmd-timeout=S                      SPMD_TIMEOUT     (seconds a rank may wait for its peers
//                                                           before the run is reported and ended,
//                                                           every backend; default 300)
//   --spmd-nccl-timeout=S                 SPMD_NCCL_TIMEOUT (the older name of --spmd-timeout;
//                                                           SPMD_TIMEOUT wins over it)
//   --spmd-gpus-per-process=K             SPMD_GPUS_PER_PROCESS (nccl: ranks, one GPU each,
//                                                           per process; default 1)
//   --spmd-tensors=real|meta              SPMD_TENSORS     (meta: shape-only tensors, a dry run;
//                                                           sim and threads; tensor/meta.h)
// Both `--spmd-x=value` and `--spmd-x value` are accepted; parsing stops at `--`.
//
//   LaunchOptions o = parse_launch_options(argc, argv);  // argv now lacks the --spmd-* flags
//   if (auto l = detect_launcher()) fmt::print("{} rank {} of {}\n", l->name, l->rank, l->size);
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/world/launcher.h>
#include <spmd/world/world.h>

namespace spmd {

// The backends launch() knows, built into this installation or not, in the order error messages
// list them (known_backends() in world/backend_driver.h). Whether a program can run one depends on
// the libraries it links: spmd::spmd (sim, threads, mpi) or spmd::nccl.
const std::vector<std::string>& backend_names();

// "sim, threads, mpi, nccl".
std::string backend_list();

struct LaunchOptions {
  std::string backend = "sim";
  std::optional<int> world_size;
  std::string trace_path;  // empty: no trace file
  DebugOptions debug;
  std::string topology_path;  // empty: the default topology
  // --spmd-timeout: how long a rank may wait for its peers (WorldRequest::timeout_s); nullopt:
  // kDefaultTimeoutSeconds.
  std::optional<double> timeout_s;
  int gpus_per_process = 1;
  bool meta_tensors = false;  // --spmd-tensors=meta (Note [Shape-only tensors])
  // Where each setting came from, for messages: "--spmd-world-size=8", "SPMD_WORLD_SIZE=8" or
  // empty for the default.
  std::string backend_source;
  std::string world_size_source;
};

// The options from the SPMD_* environment only. ConfigError for a bad value, naming the variable.
LaunchOptions launch_options_from_env();
// The environment's options overridden by the --spmd-* flags of argv. The flags are removed from
// argv and argc is updated (argv[argc] stays nullptr). ConfigError for an unknown --spmd-* flag,
// a flag without its value, a backend name spmdsim does not have, an unknown debug check, or a
// world size that is not a positive integer. (A backend this build or program lacks is reported
// when the world is made: make_world, launch().)
LaunchOptions parse_launch_options(int& argc, char** argv);
// "check,nan" -> DebugOptions{.check = true, .nan = true}; empty items are skipped. ConfigError
// naming `source` and the valid checks for anything else.
DebugOptions parse_debug_options(std::string_view list, std::string_view source = "--spmd-debug");

}  // namespace spmd
