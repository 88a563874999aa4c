// tests/support/world_env.h: the World a test body runs in.
//
// Test bodies are written once and run under every backend: under sim the world holds every
// rank; under mpirun (SPMD_BACKEND=mpi) each process holds its own rank. Expected values are
// computed for the held ranks only, from data defined by (seed, rank, index), so no test needs
// another rank's data.
//
// Executables whose tests use test_world() link spmd_test_main (spmd_add_gtest(... MAIN spmd)),
// whose main() runs the tests, finishes the world and, under a real backend, quiets the other
// ranks' output and ends the whole job when a rank throws.
#pragma once

#include "sim/world.h"

namespace spmd::testing {

// The environment's world, built through the runtime (runtime/launch.h make_world) from
// SPMD_BACKEND (default sim), SPMD_WORLD_SIZE (default `default_size` under sim; under a launcher
// the launcher's size) and the other SPMD_* variables. Created once per process, on first use.
World test_world(int default_size = 8);

// finish_world() of the test world when one was created (the test main calls it).
void finish_test_world();

}  // namespace spmd::testing
