// spmd/world/world.cpp: World accessors, and World::sim through the sim backend's driver.
#include <spmd/world/world.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include <spmd/core/error.h>
#include <spmd/world/backend_driver.h>
#include <spmd/world/topology.h>

namespace spmd {

namespace {

struct NewWorldListeners {
  std::mutex mutex;
  std::vector<void (*)()> listeners;
};

NewWorldListeners& new_world_listeners() {
  static auto* listeners = new NewWorldListeners();  // never destroyed: worlds outlive statics
  return *listeners;
}

}  // namespace

void add_new_world_listener(void (*listener)()) {
  NewWorldListeners& l = new_world_listeners();
  const std::lock_guard lock(l.mutex);
  if (std::find(l.listeners.begin(), l.listeners.end(), listener) == l.listeners.end()) {
    l.listeners.push_back(listener);
  }
}

void AxisNames::add(const std::vector<std::string>& names) {
  const std::lock_guard lock(mutex_);
  for (const std::string& name : names) {
    auto it = std::lower_bound(names_.begin(), names_.end(), name);
    if (it == names_.end() || *it != name) names_.insert(it, name);
  }
}

bool AxisNames::contains(std::string_view name) const {
  const std::lock_guard lock(mutex_);
  return std::binary_search(names_.begin(), names_.end(), name);
}

std::vector<std::string> AxisNames::names() const {
  const std::lock_guard lock(mutex_);
  return names_;
}

World::World(std::shared_ptr<WorldState> state) : state_(std::move(state)) {
  static std::atomic<uint64_t> next_id{1};
  if (state_ && state_->id == 0) state_->id = next_id.fetch_add(1, std::memory_order_relaxed);
  if (state_ && state_->axis_names == nullptr) state_->axis_names = std::make_shared<AxisNames>();
  std::vector<void (*)()> listeners;
  {
    NewWorldListeners& l = new_world_listeners();
    const std::lock_guard lock(l.mutex);
    listeners = l.listeners;
  }
  for (void (*listener)() : listeners) listener();
}

World World::sim(int world_size) {
  if (world_size < 1) {
    throw_error<ConfigError>("World::sim: world size must be at least 1, got {}", world_size);
  }
  const std::string source = fmt::format("World::sim({})", world_size);
  WorldRequest request;
  request.world_size = world_size;
  request.world_size_source = source;
  return backend_driver("sim", source).start(request).front();
}

const std::shared_ptr<AxisNames>& World::axis_names() const {
  return checked("axis_names").axis_names;
}

std::string World::to_string() const {
  if (!state_) return "world (undefined)";
  const WorldState& s = *state_;
  std::string held;
  if (s.held_ranks.size() != static_cast<size_t>(s.size)) {
    held = s.held_ranks.size() == 1 ? fmt::format(", holding rank {}", s.held_ranks[0])
                                    : fmt::format(", holding {} ranks", s.held_ranks.size());
  }
  return fmt::format("world #{} ({}, {} rank{}{})", s.id, s.backend_name, s.size,
                     s.size == 1 ? "" : "s", held);
}

const WorldState& World::checked(const char* op) const {
  if (!state_) throw_error<Error>("World::{}: the world is undefined (default-constructed)", op);
  return *state_;
}

int World::size() const {
  return checked("size").size;
}

const std::vector<int>& World::held_ranks() const {
  return checked("held_ranks").held_ranks;
}

std::string DebugOptions::to_string() const {
  std::string out;
  auto add = [&](bool on, std::string_view name) {
    if (!on) return;
    if (!out.empty()) out += ',';
    out += name;
  };
  add(all, "all");
  add(check, "check");
  add(replicate, "replicate");
  add(fingerprint, "fingerprint");
  add(nan, allow_inf ? "nan:allow-inf" : "nan");
  add(divergence, "divergence");
  add(types, "types");
  add(parity, "parity");
  return out.empty() ? "none" : out;
}

PerRank<int> World::rank() const {
  const std::vector<int>& held = checked("rank").held_ranks;
  return PerRank<int>(held, held);
}

bool World::holds(int rank) const {
  const auto& held = checked("holds").held_ranks;
  return std::binary_search(held.begin(), held.end(), rank);
}

Device World::device_of(int rank) const {
  const auto& state = checked("device_of");
  const auto it = std::lower_bound(state.held_ranks.begin(), state.held_ranks.end(), rank);
  if (it == state.held_ranks.end() || *it != rank) {
    throw_error<Error>("World::device_of: rank {} is not held by this world (it holds {} ranks)",
                       rank, state.held_ranks.size());
  }
  if (state.devices.empty()) return Device{};
  return state.devices[static_cast<size_t>(it - state.held_ranks.begin())];
}

std::string World::backend_name() const {
  return checked("backend_name").backend_name;
}

const std::string& World::device_type() const {
  return checked("device_type").device_type;
}

bool World::is_coordinator() const {
  return checked("is_coordinator").coordinator;
}

Backend& World::backend() const {
  const auto& state = checked("backend");
  if (!state.backend) throw_error<Error>("World::backend: world has no backend attached");
  return *state.backend;
}

const std::shared_ptr<Backend>& World::backend_ptr() const {
  return checked("backend").backend;
}

const DebugOptions& World::debug() const {
  return checked("debug").debug;
}

void World::store_debug(const DebugOptions& debug, std::shared_ptr<const void> hooks) {
  checked("store_debug");
  state_->debug = debug;
  state_->debug_hooks = std::move(hooks);
}

const Topology& World::topology() const {
  const auto& state = checked("topology");
  return state.topology ? *state.topology : default_topology();
}

void World::set_topology(std::shared_ptr<const Topology> topology) {
  checked("set_topology");
  if (topology != nullptr) {
    const Topology& t = *topology;
    // The cost model divides by these (Topology::from_json checks the same).
    if (t.devices_per_host < 1 || !(t.intra_host_bandwidth_gbps > 0) ||
        !(t.inter_host_bandwidth_gbps > 0) || !(t.intra_host_latency_us >= 0) ||
        !(t.inter_host_latency_us >= 0) || !(t.base_latency_us >= 0)) {
      throw_error<ConfigError>(
          "World::set_topology: devices_per_host must be >= 1, bandwidths > 0 and latencies >= 0, "
          "got {}",
          t.to_json());
    }
  }
  state_->topology = std::move(topology);
}

const WorldState& World::state() const {
  return checked("state");
}

}  // namespace spmd
