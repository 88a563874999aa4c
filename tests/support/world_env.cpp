// tests/support/world_env.cpp: the test world from the environment.
#include "tests/support/world_env.h"

#include <string>

#include "core/env.h"
#include "core/error.h"

namespace spmd::testing {

World test_world(int default_size) {
  static World world = [&] {
    int size = default_size;
    if (auto value = env_value("SPMD_WORLD_SIZE")) size = std::stoi(*value);
    const std::string backend = env_value("SPMD_BACKEND").value_or("sim");
    if (backend != "sim") {
      throw_error<ConfigError>("test_world: backend '{}' is not available to tests yet", backend);
    }
    return World::sim(size);
  }();
  return world;
}

}  // namespace spmd::testing
