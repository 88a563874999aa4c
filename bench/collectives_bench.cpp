// bench/collectives_bench: the sim backend's collectives against memcpy.
//
// For R = 8 ranks and S = 64 MiB per rank, each collective's effective bandwidth 2*R*S / time
// (the bytes any implementation must read and write) is reported next to memcpy bandwidth
// (2*S / time for one S-byte memcpy: S read + S written) measured in the same run:
//   vs_memcpy   effective bandwidth / memcpy bandwidth   (64 MiB benchmarks)
//   latency_us  time per call                            (4-byte benchmarks)
//   replicated_x  bytes held by a replicated 64 MiB LocalTensor over 8 ranks / 64 MiB
// Run: build/bench/collectives_bench [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "collectives/functional.h"
#include "collectives/trace.h"
#include "mesh/device_mesh.h"
#include "sim/local_ops.h"
#include "tensor/ops.h"

namespace spmd {
namespace {

constexpr int kRanks = 8;
constexpr int64_t kBytes = int64_t{64} << 20;
constexpr int64_t kElements = kBytes / 4;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes moved per second by memcpy of one 64 MiB buffer into another (2*S per copy); the best
// of several repetitions, measured once per process.
double memcpy_bandwidth() {
  static const double bw = [] {
    std::vector<char> src(static_cast<size_t>(kBytes), 1), dst(static_cast<size_t>(kBytes), 0);
    double best = 1e30;
    for (int rep = 0; rep < 8; ++rep) {
      const double t0 = now_s();
      std::memcpy(dst.data(), src.data(), src.size());
      benchmark::DoNotOptimize(dst.data());
      best = std::min(best, now_s() - t0);
    }
    return 2.0 * static_cast<double>(kBytes) / best;
  }();
  return bw;
}

struct BenchSetup {
  World world = World::sim(kRanks);
  DeviceMesh mesh = init_device_mesh(world, {kRanks}, {"x"});
};

// The trace stays on, as in any program (its ring buffer bounds memory).
BenchSetup& setup() {
  static BenchSetup s;
  return s;
}

template <class Op>
void run_bandwidth(benchmark::State& state, Op&& op) {
  BenchSetup& s = setup();
  LocalTensor x = LocalTensor::from_fn(s.world, [](int r) { return full({kElements}, r + 1); });
  op(x, s.mesh);  // warm the caching allocator
  double elapsed = 0.0;
  for (auto _ : state) {
    const double t0 = now_s();
    LocalTensor y = op(x, s.mesh);
    benchmark::DoNotOptimize(y);
    elapsed += now_s() - t0;
  }
  const double per_call = elapsed / static_cast<double>(state.iterations());
  const double effective = 2.0 * kRanks * static_cast<double>(kBytes) / per_call;
  state.counters["effective_GBps"] = effective / 1e9;
  state.counters["memcpy_GBps"] = memcpy_bandwidth() / 1e9;
  state.counters["vs_memcpy"] = effective / memcpy_bandwidth();
}

void BM_all_reduce_64MiB(benchmark::State& state) {
  run_bandwidth(state,
                [](const LocalTensor& x, const DeviceMesh& m) { return all_reduce(x, m, 0); });
}
void BM_all_gather_64MiB(benchmark::State& state) {
  run_bandwidth(state,
                [](const LocalTensor& x, const DeviceMesh& m) { return all_gather(x, m, 0); });
}
void BM_reduce_scatter_64MiB(benchmark::State& state) {
  run_bandwidth(state,
                [](const LocalTensor& x, const DeviceMesh& m) { return reduce_scatter(x, m, 0); });
}
void BM_all_to_all_64MiB(benchmark::State& state) {
  run_bandwidth(state,
                [](const LocalTensor& x, const DeviceMesh& m) { return all_to_all(x, m, 0); });
}

// `elements` per rank: 1 (4 bytes), or one per peer for the all-to-alls.
template <class Op>
void run_latency(benchmark::State& state, Op&& op, int64_t elements = 1) {
  BenchSetup& s = setup();
  LocalTensor x = LocalTensor::from_fn(s.world, [&](int r) { return full({elements}, r); });
  double elapsed = 0.0;
  for (auto _ : state) {
    const double t0 = now_s();
    LocalTensor y = op(x, s.mesh);
    benchmark::DoNotOptimize(y);
    elapsed += now_s() - t0;
  }
  state.counters["latency_us"] = elapsed / static_cast<double>(state.iterations()) * 1e6;
}

void BM_all_reduce_4B(benchmark::State& state) {
  run_latency(state, [](const LocalTensor& x, const DeviceMesh& m) { return all_reduce(x, m, 0); });
}
void BM_all_gather_4B(benchmark::State& state) {
  run_latency(state, [](const LocalTensor& x, const DeviceMesh& m) { return all_gather(x, m, 0); });
}
void BM_broadcast_4B(benchmark::State& state) {
  run_latency(state, [](const LocalTensor& x, const DeviceMesh& m) { return broadcast(x, m, 0); });
}
void BM_all_to_all_single_4B(benchmark::State& state) {
  run_latency(
      state,
      [](const LocalTensor& x, const DeviceMesh& m) { return all_to_all_single(x, m, 0, {}, {}); },
      kRanks);
}

void BM_replicated_memory_64MiB(benchmark::State& state) {
  BenchSetup& s = setup();
  Tensor t = full({kElements}, 1);
  double ratio = 0.0;
  for (auto _ : state) {
    LocalTensor x = LocalTensor::replicate(s.world, t);
    ratio = static_cast<double>(x.bytes_held()) / static_cast<double>(kBytes);
    benchmark::DoNotOptimize(x);
  }
  state.counters["replicated_x"] = ratio;
}

BENCHMARK(BM_all_reduce_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_all_gather_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_reduce_scatter_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_all_to_all_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_all_reduce_4B)->UseRealTime();
BENCHMARK(BM_all_gather_4B)->UseRealTime();
BENCHMARK(BM_broadcast_4B)->UseRealTime();
BENCHMARK(BM_all_to_all_single_4B)->UseRealTime();
BENCHMARK(BM_replicated_memory_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace spmd
