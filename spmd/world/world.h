// spmd/world/world.h: World, the ranks this process (or rank thread) holds and the backend that
// runs their collectives.
//
// Every spmdsim program runs against a World. Under `sim` one World holds every rank; under
// `threads` each rank thread gets its own World holding its rank; under `mpi` and `nccl` each
// process holds its rank (or, for a process driving several GPUs, its ranks). Meshes, local
// tensors and collectives take their rank set and backend from it. World is a cheap handle;
// copies share one WorldState. Each backend's driver builds its worlds (world/backend_driver.h);
// World::sim and launch() (runtime/) ask it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/tensor/storage.h>
#include <spmd/world/per_rank.h>

namespace spmd {

class Backend;         // collectives/backend.h
class BackendSession;  // world/backend_driver.h
class Topology;        // world/topology.h

// The checks --spmd-debug turns on (debug/ implements them; set_debug in debug/checks.h turns
// them on for a world).
struct DebugOptions {
  bool check = false;        // every DTensor op also runs on full tensors and is compared
  bool replicate = false;    // Replicate-placed pieces must stay identical in their group
  bool fingerprint = false;  // ranks compare a fingerprint before each collective (mpi, nccl)
  bool nan = false;          // report the first op producing NaN or Inf, with its rank
  bool allow_inf = false;    // with nan: only NaN is reported (-inf masks are fine)
  bool divergence =
      false;  // sim: the program also runs as a non-coordinator rank (Note [Shadow run])
  // SPMD types of local code (always inferred and checked, Note [SPMD types] in
  // world/spmd_types.h) are also checked against the data (sim), and to_local's grad_placements
  // against the gradient that arrives
  bool types = false;
  // sim: the program also runs on one rank (every mesh dim of size 1) and every DTensor it makes
  // is compared with the one made at the same line there (Note [Parity run] in debug/parity.h)
  bool parity = false;
  // The largest relative difference parity accepts (--spmd-parity-tol); 0: the dtype's default.
  double parity_tol = 0.0;
  // Where every DTensor's values are written, per call site (--spmd-dump-values; Note [Value
  // dumps] in debug/parity.h); empty: nowhere.
  std::string dump_values{};
  bool all = false;  // every check the backend supports (resolved by launch())

  bool any() const {
    return check || replicate || fingerprint || nan || divergence || types || parity ||
           !dump_values.empty() || all;
  }
  // "check,replicate,nan:allow-inf" (the --spmd-debug spelling), "none" when off.
  std::string to_string() const;
};

// The names of the mesh dims built on one world (DeviceMesh registers them): the axes its
// LocalTensors' SPMD types may name (world/spmd_types.h). Thread-safe.
class AxisNames {
 public:
  void add(const std::vector<std::string>& names);
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> names_;  // sorted, unique
};

// The state World handles share. Filled in by the backend's driver when a world is created.
struct WorldState {
  // This world's number in the process (1, 2, ...), given by World(state) when 0: reports tell
  // worlds apart by it (World::to_string). A copy of the state made to adjust a world (launch()'s
  // trace path) keeps it: it is the same world.
  uint64_t id = 0;
  int size = 0;
  std::vector<int> held_ranks;  // ascending
  std::vector<Device> devices;  // the device of each held rank, in held_ranks order; empty: CPU
  bool coordinator = false;     // true in exactly one process / rank thread
  // The reference world of a parity run (Note [Parity run] in debug/parity.h): every mesh made on
  // it has every dim of size 1 but those named in parity_kept_dims, whose coordinates become ranks
  // 0, 1, ... of held_ranks (rank 0 alone when there are none).
  bool parity_reference = false;
  std::vector<std::string> parity_kept_dims;
  std::string backend_name;
  std::string device_type = "cpu";  // where the ranks' tensors live: "cpu" or "cuda"
  std::shared_ptr<Backend> backend;
  // What the worlds of one driver start() share (world/backend_driver.h); null for a world built by
  // hand.
  std::shared_ptr<BackendSession> session;
  std::shared_ptr<const Topology> topology;  // null: the default topology
  DebugOptions debug;
  // Keeps debug/'s observers of ops and collectives installed while a world with checks lives.
  std::shared_ptr<const void> debug_hooks;
  std::string trace_path;  // where launch() writes the Chrome trace at exit; empty for none
  // Made by World(state) when null; a copy of the state (launch()'s) shares it.
  std::shared_ptr<AxisNames> axis_names;
};

// Note [Caches and worlds]
// The process-wide caches above this module (the DTensor sharding decisions and redistribute
// plans, dtensor/dispatch.h and dtensor/redistribute.h, and a dry run's per-spec rank tables,
// dtensor/spec.cpp) hold DTensorSpecs, so meshes, and through
// them the worlds those meshes were built on. Left alone they would keep every past world alive:
// a process that runs one program after another (a dry-run sweep over layouts, a test binary)
// would grow by every past world's meshes, about 11 KB per rank for a GPT step at 16384 ranks.
// So each new world (World(std::shared_ptr<WorldState>), which every driver and launch() use)
// calls the listeners registered here, and the caches drop their entries: the worlds and meshes
// nothing else holds are freed. A new world is rare (once per program, per rank thread, or per
// shadow run), and a dropped entry costs one new decision on its next use.
void add_new_world_listener(void (*listener)());
// What such a listener does to a cache with members `mutex` and `map`: empties the map under the
// lock and destroys the entries after it (freeing a mesh may take other locks).
template <class Cache>
void drop_cache_entries(Cache& cache) {
  decltype(cache.map) dropped;
  {
    const std::lock_guard lock(cache.mutex);
    dropped.swap(cache.map);
  }
}

// The mesh dim a parity run's reference world always keeps at its size: a pipeline's stages hold
// different layers rather than pieces of one tensor (Note [Parity run] in debug/parity.h).
inline constexpr std::string_view kParityKeptDim = "pp";

// Thrown on a parity reference world (never seen by user code: not an spmd::Error) when the run
// must start again on another reference: one holding `ranks` ranks, which a mesh's kept dims
// need, or one that also keeps `keep_dim`, over which the program's local code issued a
// collective whose arguments need the dim's real size (Note [Parity run]).
struct ParityRestart {
  int64_t ranks = 0;
  std::string keep_dim;
  std::string where;  // the collective and its line, for the report
};

class World {
 public:
  // An undefined world; every accessor but defined() throws.
  World() = default;
  // A new world (the backend drivers build them): calls the new-world listeners (Note [Caches and
  // worlds]).
  explicit World(std::shared_ptr<WorldState> state);

  // A lockstep simulated world holding ranks 0..world_size-1, from the sim backend's driver.
  // ConfigError when world_size < 1 or above 2^24 (the sim backend's limit), or when the program
  // does not link the sim backend.
  static World sim(int world_size);

  bool defined() const { return state_ != nullptr; }
  int size() const;
  // sim: all ranks; threads, mpi, nccl: this process's or thread's rank(s). Ascending.
  // Not "my rank": under sim held_ranks()[0] is 0 for every simulated rank, so a branch on it
  // takes rank 0's path everywhere (and the bug shows only on a cluster). Use rank().
  const std::vector<int>& held_ranks() const;
  // My rank: each held rank's own number, {0: 0, 1: 1, ...} under sim, the thread's or process's
  // rank elsewhere. Comparing it is a PerRank comparison, so under sim a branch that differs
  // between ranks is a DivergenceError at its line (Note [Divergence checks]).
  PerRank<int> rank() const;
  bool holds(int rank) const;
  // The device a held rank's tensors live on: its GPU under nccl (Note [NCCL device placement]),
  // the CPU everywhere else. Error when `rank` is not held.
  Device device_of(int rank) const;
  std::string backend_name() const;
  // "cpu", or "cuda" when the backend puts the ranks' tensors on GPUs (nccl): the device type of
  // the meshes built on this world.
  const std::string& device_type() const;
  bool is_coordinator() const;

  Backend& backend() const;
  const std::shared_ptr<Backend>& backend_ptr() const;
  // The topology the cost model uses (the default one unless set).
  const Topology& topology() const;
  // ConfigError for devices_per_host < 1, a bandwidth that is not > 0, or a negative latency.
  void set_topology(std::shared_ptr<const Topology> topology);
  const DebugOptions& debug() const;
  // Stores `debug` and keeps `hooks` (debug/'s observers) alive as long as the world. Call
  // set_debug (debug/checks.h) instead: it checks the options and installs the observers.
  void store_debug(const DebugOptions& debug, std::shared_ptr<const void> hooks);
  const WorldState& state() const;

  // The mesh dim names of the meshes built on this world so far (DeviceMesh records them).
  const std::shared_ptr<AxisNames>& axis_names() const;

  // "world #2 (sim, 4 ranks)", "world #1 (mpi, 8 ranks, holding rank 3)": the world in reports,
  // e.g. of values from two worlds that cannot be combined. "world (undefined)" for an undefined
  // one.
  std::string to_string() const;

  bool operator==(const World& other) const { return state_ == other.state_; }

 private:
  const WorldState& checked(const char* op) const;
  std::shared_ptr<WorldState> state_;
};

}  // namespace spmd
