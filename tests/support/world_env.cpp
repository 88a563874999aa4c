// tests/support/world_env.cpp: the test world from the environment.
#include "tests/support/world_env.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include <spmd/runtime/launch.h>

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
    // Each rank thread has its own world; make_world returns the calling thread's.
    if (options.backend == "threads") return make_world(options);
    if (!options.world_size && options.backend == "sim") options.world_size = default_size;
    world = make_world(options);
  }
  return *world;
}

void run_test_body(const std::function<void()>& body) {
  const LaunchOptions options = launch_options_from_env();
  if (options.backend != "threads") {
    body();
    return;
  }
  const std::vector<RankOutcome> outcomes = run_rank_threads(options, [&](World&) {
    body();
    return 0;
  });
  for (const RankOutcome& outcome : outcomes) {
    if (outcome.error) {
      ADD_FAILURE() << "[rank " << outcome.rank << "] " << error_text(outcome.error);
    }
  }
}

void finish_test_world() {
  if (the_world()) finish_world(*the_world());
}

}  // namespace spmd::testing
