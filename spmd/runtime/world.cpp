// spmd/runtime/world.cpp: factories of World for the in-process backends.
#include <numeric>

#include <spmd/backends/sim/backend.h>
#include <spmd/collectives/cost_model.h>
#include <spmd/core/error.h>
#include <spmd/sim/world.h>

namespace spmd {

World World::sim(int world_size) {
  if (world_size < 1) {
    throw_error<ConfigError>("World::sim: world size must be at least 1, got {}", world_size);
  }
  auto state = std::make_shared<WorldState>();
  state->size = world_size;
  state->held_ranks.resize(static_cast<size_t>(world_size));
  std::iota(state->held_ranks.begin(), state->held_ranks.end(), 0);
  state->coordinator = true;
  state->backend_name = "sim";
  state->backend = std::make_shared<SimBackend>();
  return World(std::move(state));
}

const Topology& World::topology() const {
  const auto& state = checked("topology");
  return state.topology ? *state.topology : default_topology();
}

}  // namespace spmd
