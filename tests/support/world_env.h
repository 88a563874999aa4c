// tests/support/world_env.h: the World a test body runs in.
//
// Test bodies are written once and run under every backend: under sim the world holds every
// rank; under mpirun (SPMD_BACKEND=mpi) each process holds its own rank. Expected values are
// computed for the held ranks only, from data defined by (seed, rank, index), so no test needs
// another rank's data.
#pragma once

#include "sim/world.h"

namespace spmd::testing {

// The environment's world: SPMD_BACKEND (default sim) with SPMD_WORLD_SIZE ranks (default
// `default_size`; under a launcher the launcher's size). Created once per process.
World test_world(int default_size = 8);

}  // namespace spmd::testing
