// tests/support/world_env.cpp: the test world from the environment.
#include "tests/support/world_env.h"

#include <optional>

#include "runtime/launch.h"

namespace spmd::testing {
namespace {

std::optional<World>& the_world() {
  static std::optional<World> world;
  return world;
}

}  // namespace

World test_world(int default_size) {
  std::optional<World>& world = the_world();
  if (!world) {
    LaunchOptions options = launch_options_from_env();
    if (!options.world_size && options.backend == "sim") options.world_size = default_size;
    world = make_world(options);
  }
  return *world;
}

void finish_test_world() {
  if (the_world()) finish_world(*the_world());
}

}  // namespace spmd::testing
