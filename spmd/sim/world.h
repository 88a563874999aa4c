// spmd/sim/world.h: World, the ranks this process (or rank thread) holds and the backend that runs
// their collectives.
//
// Every spmdsim program runs against a World. Under `sim` one World holds every rank; under
// `threads` each rank thread gets its own World holding its rank; under `mpi` and `nccl` each
// process holds its rank (or, for a process driving several GPUs, its ranks). Meshes, local
// tensors and collectives take their rank set and backend from it. World is a cheap handle;
// copies share one WorldState. runtime/ builds worlds for each backend (World::sim, launch()).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <spmd/tensor/storage.h>

namespace spmd {

class Backend;   // collectives/backend.h
class Topology;  // collectives/cost_model.h

// The checks --spmd-debug turns on (debug/ implements them).
struct DebugOptions {
  bool check = false;        // every DTensor op also runs on full tensors and is compared (sim)
  bool replicate = false;    // Replicate-placed shards must stay identical in their group (sim)
  bool fingerprint = false;  // ranks compare a fingerprint before each collective (mpi, nccl)
  bool nan = false;          // report the first op producing NaN or Inf, with its rank

  bool any() const { return check || replicate || fingerprint || nan; }
};

// The state World handles share. Filled in by runtime/ when a world is created.
struct WorldState {
  int size = 0;
  std::vector<int> held_ranks;  // ascending
  std::vector<Device> devices;  // the device of each held rank, in held_ranks order; empty: CPU
  bool coordinator = false;     // true in exactly one process / rank thread
  std::string backend_name;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<const Topology> topology;  // null: the default topology
  DebugOptions debug;
  // Keeps debug/'s observers of ops and collectives installed while a world with checks lives.
  std::shared_ptr<const void> debug_hooks;
  std::string trace_path;  // where launch() writes the Chrome trace at exit; empty for none
};

class World {
 public:
  // An undefined world; every accessor but defined() throws.
  World() = default;
  explicit World(std::shared_ptr<WorldState> state);

  // A lockstep simulated world holding ranks 0..world_size-1 (defined in runtime/).
  static World sim(int world_size);

  bool defined() const { return state_ != nullptr; }
  int size() const;
  // sim: all ranks; threads, mpi, nccl: this process's or thread's rank(s). Ascending.
  const std::vector<int>& held_ranks() const;
  bool holds(int rank) const;
  // The device a held rank's tensors live on: its GPU under nccl (Note [NCCL device placement]),
  // the CPU everywhere else. Error when `rank` is not held.
  Device device_of(int rank) const;
  std::string backend_name() const;
  bool is_coordinator() const;

  Backend& backend() const;
  const std::shared_ptr<Backend>& backend_ptr() const;
  // The topology the cost model uses (the default one unless set).
  const Topology& topology() const;
  void set_topology(std::shared_ptr<const Topology> topology);
  const DebugOptions& debug() const;
  // Turns the checks of --spmd-debug on or off for this world (defined in debug/checks.cpp).
  // ConfigError for check or replicate on a world that does not hold every rank (they compare
  // every rank's piece: sim only). fingerprint is read by a real backend when it is created
  // (launch(), make_world()), not here.
  void set_debug(const DebugOptions& debug);
  const WorldState& state() const;

  bool operator==(const World& other) const { return state_ == other.state_; }

 private:
  const WorldState& checked(const char* op) const;
  std::shared_ptr<WorldState> state_;
};

}  // namespace spmd
