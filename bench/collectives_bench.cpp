// bench/collectives_bench: the sim backend's collectives against memcpy.
//
// For R = 8 ranks and S = 64 MiB per rank, each collective's effective bandwidth 2*R*S / time
// (the bytes any implementation must read and write) is reported next to memcpy bandwidth
// (2*S / time for one S-byte memcpy: S read + S written) measured in the same run:
//   vs_memcpy   effective bandwidth / memcpy bandwidth   (64 MiB benchmarks)
//   latency_us  time per call                            (4-byte benchmarks)
//   replicated_x  bytes held by a replicated 64 MiB LocalTensor over 8 ranks / 64 MiB
// The size sweep (BM_sweep_<collective>/<bytes per rank>, 4 KiB to 64 MiB in powers of 4) times
// each call next to R memcpys of S bytes (the same 2*R*S bytes, from R source buffers into R
// destination buffers), interleaved call by call so load on a shared machine hits both alike:
//   effective_GBps  2*R*S / the collective's time
//   memcpy_GBps     2*R*S / the R memcpys' time
//   sweep_vs_memcpy effective_GBps / memcpy_GBps
// (scripts/bench plots these; the counter is not named vs_memcpy so that name stays the 64 MiB
// benchmarks' headline.)
// Run: build/bench/collectives_bench [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

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

// The size sweep. Memory is allocated once per size: inputs, the reference's source and
// destination buffers, and (through the caching allocator) the collective's results.
template <class Op>
void run_sweep(benchmark::State& state, Op&& op) {
  BenchSetup& s = setup();
  const int64_t bytes = state.range(0);
  const int64_t elements = bytes / 4;
  LocalTensor x = LocalTensor::from_fn(s.world, [&](int r) { return full({elements}, r + 1); });
  std::vector<std::vector<char>> src(kRanks, std::vector<char>(static_cast<size_t>(bytes), 1));
  std::vector<std::vector<char>> dst(kRanks, std::vector<char>(static_cast<size_t>(bytes), 0));
  op(x, s.mesh);  // warm the caching allocator
  double ours = 0.0, reference = 0.0;
  for (auto _ : state) {
    double t0 = now_s();
    LocalTensor y = op(x, s.mesh);
    benchmark::DoNotOptimize(y);
    const double t = now_s() - t0;
    ours += t;
    state.SetIterationTime(t);
    t0 = now_s();
    for (int r = 0; r < kRanks; ++r) {
      std::memcpy(dst[r].data(), src[r].data(), static_cast<size_t>(bytes));
      benchmark::DoNotOptimize(dst[r].data());
    }
    reference += now_s() - t0;
  }
  const double moved = 2.0 * kRanks * static_cast<double>(bytes);
  const double n = static_cast<double>(state.iterations());
  state.counters["bytes_per_rank"] = static_cast<double>(bytes);
  state.counters["effective_GBps"] = moved * n / ours / 1e9;
  state.counters["memcpy_GBps"] = moved * n / reference / 1e9;
  state.counters["sweep_vs_memcpy"] = reference / ours;
}

void BM_sweep_all_reduce(benchmark::State& state) {
  run_sweep(state, [](const LocalTensor& x, const DeviceMesh& m) { return all_reduce(x, m, 0); });
}
void BM_sweep_all_gather(benchmark::State& state) {
  run_sweep(state, [](const LocalTensor& x, const DeviceMesh& m) { return all_gather(x, m, 0); });
}
void BM_sweep_reduce_scatter(benchmark::State& state) {
  run_sweep(state,
            [](const LocalTensor& x, const DeviceMesh& m) { return reduce_scatter(x, m, 0); });
}
void BM_sweep_all_to_all(benchmark::State& state) {
  run_sweep(state, [](const LocalTensor& x, const DeviceMesh& m) { return all_to_all(x, m, 0); });
}

// 4 KiB, 16 KiB, ..., 64 MiB per rank; the reported time is the collective's alone.
void sweep_sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(4)->Range(4 << 10, 64 << 20)->UseManualTime()->Unit(benchmark::kMicrosecond);
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
BENCHMARK(BM_sweep_all_reduce)->Apply(sweep_sizes);
BENCHMARK(BM_sweep_all_gather)->Apply(sweep_sizes);
BENCHMARK(BM_sweep_reduce_scatter)->Apply(sweep_sizes);
BENCHMARK(BM_sweep_all_to_all)->Apply(sweep_sizes);

}  // namespace
}  // namespace spmd
