// tests/support/world_env.h: the World a test body runs in.
//
// Test bodies are written once and run under every backend: under sim the world holds every
// rank; under mpirun (SPMD_BACKEND=mpi) each process holds its own rank; under SPMD_BACKEND=threads
// each test body declared with SPMD_TEST runs once per rank thread, each holding its own rank.
// Expected values are computed for the held ranks only, from data defined by (seed, rank, index),
// so no test needs another rank's data.
//
// Executables whose tests use test_world() link spmd_test_main (spmd_add_gtest(... MAIN spmd)),
// whose main() runs the tests, finishes the world and, under a real backend, quiets the other
// ranks' output and ends the whole job when a rank throws.
//
//   SPMD_TEST(Conformance, AllReduce) {
//     World world = test_world();   // under threads: this rank thread's world
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include <functional>

#include <spmd/sim/world.h>

namespace spmd::testing {

// The environment's world, built through the runtime (runtime/launch.h make_world) from
// SPMD_BACKEND (default sim), SPMD_WORLD_SIZE (default `default_size` under sim; under a launcher
// the launcher's size) and the other SPMD_* variables. Created once per process, on first use;
// under threads, the calling rank thread's world (only inside an SPMD_TEST body).
World test_world(int default_size = 8);

// finish_world() of the test world when one was created (the test main calls it).
void finish_test_world();

// Runs `body` once under sim and the real backends; under threads once per rank thread
// (runtime/launch.h run_rank_threads, SPMD_WORLD_SIZE threads, default 8), each failure of a rank
// (an exception, a collective mismatch, a deadlock) becoming a test failure naming the rank.
void run_test_body(const std::function<void()>& body);

}  // namespace spmd::testing

// A TEST whose body runs through run_test_body: once per rank thread under threads.
#define SPMD_TEST(suite, name)                                        \
  void spmd_test_body_##suite##_##name();                             \
  TEST(suite, name) {                                                 \
    ::spmd::testing::run_test_body(&spmd_test_body_##suite##_##name); \
  }                                                                   \
  void spmd_test_body_##suite##_##name()
