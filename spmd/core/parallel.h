// spmd/core/parallel.h: a small process-wide thread pool for memory-bound kernels.
//
// The sim backend's collectives and large elementwise kernels are bandwidth-bound; on a
// machine with few cores a second thread still raises achieved bandwidth. parallel_for is the
// only entry point: it splits a range into contiguous chunks, runs them on the pool and the
// calling thread, and returns when all are done.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace spmd {

// Threads parallel_for may use, the caller included: SPMD_NUM_THREADS if set, otherwise
// std::thread::hardware_concurrency(), at least 1.
int num_threads();

// The most threads SPMD_NUM_THREADS may ask for.
constexpr int kMaxThreads = 4096;
// SPMD_NUM_THREADS, or nullopt when unset; ConfigError naming the value when it is not an integer
// in [1, kMaxThreads]. launch() checks it before the program runs (the pool reads it at its first
// parallel_for, deep inside some op).
std::optional<int> env_num_threads();

// Sets the thread count (1 runs everything inline). Not thread-safe against running
// parallel_for calls; call it at start-up.
void set_num_threads(int n);

// Calls fn(begin, end) on disjoint sub-ranges that cover [0, n) exactly once.
// Runs inline when n < 2 * grain, when only one thread is configured, when called from inside
// another parallel_for, or while another thread is using the pool (the threads backend runs one
// program per rank thread; nested parallelism there would only oversubscribe the cores).
// If chunks throw, the first exception is rethrown after every chunk has finished.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace spmd
