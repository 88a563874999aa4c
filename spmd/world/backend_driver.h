// spmd/world/backend_driver.h: how a backend plugs in. Each backend registers a driver; launch()
// and make_world() (runtime/) find it by name and let it build this process's worlds.
//
// Note [Backend drivers]
// spmd/backends/<name>/driver.cpp defines one BackendDriver and registers it at static
// initialization with SPMD_REGISTER_BACKEND_DRIVER. runtime/ looks the driver up by the
// --spmd-backend name and calls start(): the driver checks the launch (launcher, world size, GPUs),
// creates its backend and returns this process's worlds, which share one BackendSession
// (WorldState::session). Everything that differs between backends is a field of the driver: the
// device type meshes report, whether launch() keeps a flight recorder, whether the program runs
// once per world on its own thread (threads), how a failed job is ended. So runtime/ and mesh/
// name no backend, and a program holds only the backends it links: spmd::spmd brings sim,
// threads and (where built) mpi; spmd::nccl brings nccl and the CUDA tensors.
//
// Static libraries keep an object file only when something refers to it, and nothing refers to a
// driver. So each driver's object defines the anchor symbol spmd_backend_driver_<name>
// (SPMD_REGISTER_BACKEND_DRIVER), and the backend's CMake target makes every program linking it
// keep that symbol (INTERFACE link option LINKER:-u,spmd_backend_driver_<name>, exported with the
// installed targets too).
//
// Adding a backend: a folder spmd/backends/<name>/ with the same file set as the others plus
// driver.cpp, one entry in cmake/SpmdModules.cmake, and its tests (docs/design.md).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/world/launcher.h>
#include <spmd/world/world.h>

namespace spmd {

// --spmd-timeout's default: seconds a rank may wait for its peers.
inline constexpr double kDefaultTimeoutSeconds = 300.0;

// What launch() (or make_world(), or World::sim) asks a driver for.
struct WorldRequest {
  // --spmd-world-size / SPMD_WORLD_SIZE; nullopt: the backend's default (sim and threads: 8;
  // under a launcher: the launcher's process count).
  std::optional<int> world_size;
  // Where world_size came from, for messages: "--spmd-world-size=8", "SPMD_WORLD_SIZE=8",
  // "World::sim(8)"; empty for the default.
  std::string world_size_source;
  // Stored in every world (a real backend reads fingerprint when it is created). The observers of
  // the other checks are installed by runtime/ afterwards (set_debug, debug/checks.h).
  DebugOptions debug;
  // --spmd-timeout: how long a rank may wait for its peers before the run is reported and ended
  // (threads: Note [Threads timeout]; mpi: Note [MPI watchdog]; nccl: Note [NCCL watchdog]).
  double timeout_s = kDefaultTimeoutSeconds;
  // Ranks per process, one GPU each (nccl: --spmd-gpus-per-process).
  int gpus_per_process = 1;
  // The launcher that started this process (detect_launcher()), if any.
  std::optional<LauncherInfo> launcher;
};

// What the worlds of one start() share: the backend's resources in this process.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  // Rank `rank`'s program has ended; `how` says how, for reports ("returned", "threw
  // CommError"). threads: every collective still waiting for that rank fails instead of waiting.
  // Called once per rank held by the session's worlds.
  virtual void rank_finished(int rank, const std::string& how);
  // Every program of the session has ended: releases what the backend holds (threads: the
  // rendezvous still held; mpi: MPI_Finalize; nccl: its communicators, then MPI_Finalize when MPI
  // was started). No world of the session may run a collective afterwards. Idempotent.
  virtual void finish();
  // Where the session's ranks are now, for the report of a signal (Note [Signal reports] in
  // runtime/signal_report.h): threads: every rank's state; mpi: whether this process waits in a
  // collective (which, at which file:line, for how long) or runs outside one. Empty when the
  // backend knows nothing beyond the trace. Called from another thread while the ranks run.
  virtual std::string describe_state();
  // The ranks still running will not be waited for: the run has failed in a way they cannot
  // notice (threads: Note [Threads timeout]), so whoever joins their threads should give up on
  // them. Called from another thread while the ranks run.
  virtual bool abandon_running_ranks();
};

struct BackendDriver {
  std::string name;                 // --spmd-backend=<name>; World::backend_name()
  std::string device_type = "cpu";  // where its ranks' tensors live: "cpu" or "cuda"
  // true: start() makes one world per rank of this process, and launch() runs the program once per
  // world, each on its own thread (threads). false: start() makes one world (sim, mpi, nccl).
  bool thread_per_world = false;
  // launch() keeps the last collectives and dumps them when the program fails (Note [Flight
  // recorder] in collectives/trace.h): the backends whose ranks live in other processes.
  bool flight_recorder = false;
  // The checks --spmd-debug=all turns on under this backend (docs/debugging.md has the table).
  DebugOptions debug_all;
  // This process's worlds for `request`, sharing one session (WorldState::session), with their
  // size, held ranks, coordinator, backend, device type and debug options set. ConfigError or
  // Unsupported when the launch cannot work here (no launcher, world sizes that disagree, no GPU).
  std::function<std::vector<World>(const WorldRequest&)> start;
  // Why the backend cannot start in this process as far as can be told without starting it (nccl:
  // no usable GPU), or nullopt. Optional: empty means it always can.
  std::function<std::optional<std::string>()> unavailable;
  // After a failure: ends every process of the job with `code` when the backend's library is
  // running (MPI_Abort; nccl: aborts its communicators and exits), else returns. Optional.
  std::function<void(int code)> abort_job;
};

// Registers `driver`, normally through SPMD_REGISTER_BACKEND_DRIVER. InternalError when a driver
// of that name is already registered or the name is not in known_backends().
void register_backend_driver(BackendDriver driver);
// The driver registered as `name`, or nullptr.
const BackendDriver* find_backend_driver(std::string_view name);
// Every registered driver, in the order of known_backends().
std::vector<const BackendDriver*> backend_drivers();
// The driver `name`, or why there is none: Unsupported when this build lacks the backend ("this
// build has no NCCL backend; configure with -DSPMD_WITH_NCCL=ON"), ConfigError when the program
// does not link it ("... link spmd::nccl"), ConfigError for a name no backend has. `source` names
// the setting in messages ("--spmd-backend=nccl").
const BackendDriver& backend_driver(std::string_view name, std::string_view source);

// A backend spmdsim has, built into this installation or not. The list is generated from the
// module list (cmake/SpmdModules.cmake) into spmd/config.h.
struct KnownBackend {
  std::string_view name;    // "nccl"
  std::string_view target;  // the CMake target a program links to get it: "spmd::nccl"
  std::string_view option;  // the CMake option that builds it, "" when it is always built
  bool built = false;       // this build compiled it
};
// Every backend, in the order messages list them ("sim, threads, mpi, nccl").
const std::vector<KnownBackend>& known_backends();
// Their names joined with ", ".
std::string known_backend_list();

}  // namespace spmd

// Registers the driver that `make` (a function returning BackendDriver) builds, and defines the
// anchor symbol spmd_backend_driver_<name> that keeps this object file in every program linking
// the backend (Note [Backend drivers]). Use once, at namespace scope of the driver's .cpp.
#define SPMD_REGISTER_BACKEND_DRIVER(name, make)                      \
  extern "C" void spmd_backend_driver_##name() {}                     \
  namespace {                                                         \
  [[maybe_unused]] const bool spmd_backend_driver_registered_##name = \
      (::spmd::register_backend_driver(make()), true);                \
  }
