// spmd/backends/sim/driver.cpp: the sim backend's driver (Note [Backend drivers] in
// world/backend_driver.h): one world in this process holding every rank.
#include <memory>
#include <numeric>

#include <spmd/backends/sim/backend.h>
#include <spmd/core/error.h>
#include <spmd/world/backend_driver.h>

namespace spmd {
namespace {

constexpr int kDefaultWorldSize = 8;
// One process holds every rank: a rank list (and each replicated LocalTensor's) of this many ints
// is already 64 MiB; beyond it a typo (a world of 2^31) would only exhaust memory.
constexpr int kMaxWorldSize = 1 << 24;

std::vector<World> start_sim(const WorldRequest& request) {
  const int size = request.world_size.value_or(kDefaultWorldSize);
  if (size < 1) {
    throw_error<ConfigError>("{}: the sim backend needs a world size of at least 1, got {}",
                             request.world_size_source, size);
  }
  if (size > kMaxWorldSize) {
    throw_error<ConfigError>("{}: the sim backend holds at most {} ranks, got {}",
                             request.world_size_source, kMaxWorldSize, size);
  }
  auto state = std::make_shared<WorldState>();
  state->size = size;
  state->held_ranks.resize(static_cast<size_t>(size));
  std::iota(state->held_ranks.begin(), state->held_ranks.end(), 0);
  state->coordinator = true;
  state->backend_name = "sim";
  state->backend = std::make_shared<SimBackend>();
  state->session = std::make_shared<BackendSession>();
  state->debug = request.debug;
  return {World(std::move(state))};
}

BackendDriver sim_driver() {
  BackendDriver d;
  d.name = "sim";
  d.debug_all = DebugOptions{.check = true,
                             .replicate = true,
                             .nan = true,
                             .divergence = true,
                             .types = true,
                             .parity = true};
  d.start = start_sim;
  return d;
}

}  // namespace
}  // namespace spmd

SPMD_REGISTER_BACKEND_DRIVER(sim, spmd::sim_driver)
