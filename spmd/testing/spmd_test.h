// spmd/testing/spmd_test.h: SPMD_TEST, a GoogleTest test whose body is written once and runs under
// the backend the run selects, and the World it runs in.
//
//   SPMD_TEST(ColumnParallel, Forward) {       // `world`: the World of this run's backend
//     DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
//     ...
//   }
//
//   ./my_tests                                       sim: one world holding every rank (8)
//   SPMD_WORLD_SIZE=4 ./my_tests                     sim with 4 ranks (or --spmd-world-size=4)
//   SPMD_BACKEND=threads ./my_tests                  each body once per rank thread
//   mpirun -n 4 ./my_tests --spmd-backend=mpi        each process runs every test for its rank
//
// spmd_add_tests() (cmake/SpmdTesting.cmake) registers each SPMD_TEST with CTest once per backend
// and world size, so `ctest` runs all of them.
//
// Under sim the body runs once with a world holding every rank. Under threads it runs once per
// rank thread (runtime/launch.h run_rank_threads), each with the world of its rank; a rank that
// throws, a collective the ranks disagree on and a deadlock are failures naming the rank. Under mpi
// (and nccl) every process runs every test and checks its own rank: the coordinator prints
// GoogleTest's report, the other ranks only their failures, each line prefixed "[rank N]". There a
// rank that throws or fails a fatal assertion (ASSERT_*) would leave its peers waiting in their
// next collective, so it prints why and ends the whole job (abort_job) instead; the other tests of
// that run do not run. Non-fatal failures (EXPECT_*) let every rank go on.
//
// Expected values are best computed for the ranks the world holds only, from data defined by
// (seed, rank, index), so that no test needs another rank's data; the assertions of
// spmd/testing/assertions.h compare whole DTensors where a test needs every rank's data.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <spmd/runtime/options.h>
#include <spmd/world/world.h>

namespace spmd::testing {

// The options the tests run with: those run_all_tests() parsed (the SPMD_* environment
// overridden by --spmd-* flags), else the SPMD_* environment. ConfigError for a bad value.
LaunchOptions test_options();
// Replaces them (run_all_tests() calls it with the parsed flags).
void set_test_options(const LaunchOptions& options);

// The test options' world, made through the runtime (runtime/launch.h make_world). Under sim: a
// world of SPMD_WORLD_SIZE ranks, or `default_size` when that is unset, one per size, made on first
// use and kept for the process. Under mpi and nccl: the process's world (the launcher's size), made
// once. Under threads: the calling rank thread's world (only inside an SPMD_TEST body; ConfigError
// elsewhere).
World test_world(int default_size = 8);

// finish_world() of every world test_world() made (run_all_tests() calls it after the tests).
void finish_test_world();

// Runs `body` with the test world: once under sim, mpi and nccl; under threads once per rank
// thread (SPMD_WORLD_SIZE threads, default 8), each failure of a rank (an exception, a collective
// mismatch, a deadlock) becoming a test failure naming the ranks. Under mpi and nccl a fatal
// failure on this rank ends the job (see above). SPMD_TEST calls it.
void run_test_body(const std::function<void(World&)>& body);

// SPMD_TEST's registry of its tests, "Suite.Name": what `--spmd-list-tests` marks as SPMD tests.
bool register_spmd_test(const char* suite, const char* name);
bool is_spmd_test(const std::string& full_name);

// main() of a test program linking spmd::testing (which brings a main() calling this; a program
// with its own main() calls it there). Initializes GoogleTest; removes the --spmd-* flags of argv
// and makes them the test options; `--spmd-list-tests` prints each test that the --gtest_filter
// selects, one per line as "spmd Suite.Name" (SPMD_TEST) or "gtest Suite.Name" (any other test),
// and returns (spmd_add_tests reads it). Then runs the tests: under mpi and nccl with the world
// made first and the report printed as described above; a backend that cannot start here (nccl
// without a usable GPU) skips the run with exit code 77. Returns RUN_ALL_TESTS()'s exit code; 2
// for a bad --spmd-* flag or SPMD_* variable; 1 when a test threw under mpi or nccl (after ending
// the job).
int run_all_tests(int& argc, char** argv);

}  // namespace spmd::testing

// A test whose body runs with `world` (spmd::World&), once per rank thread under threads.
#define SPMD_TEST(suite, name)                                               \
  static void spmd_test_body_##suite##_##name(::spmd::World& world);         \
  [[maybe_unused]] static const bool spmd_test_registered_##suite##_##name = \
      ::spmd::testing::register_spmd_test(#suite, #name);                    \
  TEST(suite, name) {                                                        \
    ::spmd::testing::run_test_body(&spmd_test_body_##suite##_##name);        \
  }                                                                          \
  static void spmd_test_body_##suite##_##name([[maybe_unused]] ::spmd::World& world)
