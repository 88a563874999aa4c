// tests/mesh/mesh_test_support.h: worlds and communicator tokens for the mesh tests.
#pragma once

#include <memory>
#include <numeric>
#include <vector>

#include <spmd/mesh/comm_cache.h>
#include <spmd/world/world.h>

namespace spmd::testing {

// A sim-like world of `size` ranks holding `held` (all ranks when empty), built directly.
inline World make_world(int size, std::vector<int> held = {}) {
  if (held.empty()) {
    held.resize(static_cast<size_t>(size));
    std::iota(held.begin(), held.end(), 0);
  }
  auto state = std::make_shared<WorldState>();
  state->size = size;
  state->held_ranks = std::move(held);
  state->coordinator = true;
  state->backend_name = "sim";
  return World(state);
}

// A distinct Communicator pointer for cache tests. Communicator is only declared in mesh/, so
// the pointer aliases an int it keeps alive and is never dereferenced.
inline std::shared_ptr<Communicator> make_token(int id) {
  auto owner = std::make_shared<int>(id);
  return std::shared_ptr<Communicator>(owner, reinterpret_cast<Communicator*>(owner.get()));
}

}  // namespace spmd::testing
