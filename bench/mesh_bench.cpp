// bench/mesh_bench.cpp: DeviceMesh operations on a (64,16,8,16) mesh of 131072 ranks.
//
// Slicing, flatten, unflatten, concatenate and one rank's coordinate only build small layouts,
// so their cost must not depend on the world size (target: each under 10 us). groups(dim) lists
// every rank once; it reports ranks per second (user counter ranks_per_s).
//
//   build-bench/bench/mesh_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>
#include <numeric>
#include <vector>

#include <spmd/mesh/device_mesh.h>
#include <spmd/world/world.h>

namespace spmd {
namespace {

constexpr int kWorld = 64 * 16 * 8 * 16;

const DeviceMesh& big_mesh() {
  static const DeviceMesh mesh = [] {
    auto state = std::make_shared<WorldState>();
    state->size = kWorld;
    state->held_ranks.resize(kWorld);
    std::iota(state->held_ranks.begin(), state->held_ranks.end(), 0);
    state->coordinator = true;
    state->backend_name = "sim";
    return init_device_mesh(World(state), {64, 16, 8, 16}, {"dp", "pp", "cp", "tp"});
  }();
  return mesh;
}

void BM_mesh_slice(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  for (auto _ : state) benchmark::DoNotOptimize(mesh[{"dp", "cp"}]);
}
BENCHMARK(BM_mesh_slice);

void BM_mesh_slice_one_dim(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  for (auto _ : state) benchmark::DoNotOptimize(mesh["tp"]);
}
BENCHMARK(BM_mesh_slice_one_dim);

// The registry already holds the name after the first call: later flattens check and return it.
void BM_mesh_flatten(benchmark::State& state) {
  const DeviceMesh sub = big_mesh()[{"dp", "cp"}];
  for (auto _ : state) benchmark::DoNotOptimize(sub.flatten("dp_cp"));
}
BENCHMARK(BM_mesh_flatten);

void BM_mesh_flatten_whole_mesh(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  for (auto _ : state) benchmark::DoNotOptimize(mesh.flatten("world"));
}
BENCHMARK(BM_mesh_flatten_whole_mesh);

void BM_mesh_unflatten(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  for (auto _ : state) {
    benchmark::DoNotOptimize(mesh.unflatten("dp", {8, 4, 2}, {"dp_rep", "dp_shard", "ep"}));
  }
}
BENCHMARK(BM_mesh_unflatten);

void BM_mesh_concatenate(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  const DeviceMesh dp_pp = mesh[{"dp", "pp"}];
  const DeviceMesh tp = mesh["tp"];
  for (auto _ : state) benchmark::DoNotOptimize(concatenate({dp_pp, tp}));
}
BENCHMARK(BM_mesh_concatenate);

void BM_mesh_coordinate_of_one_rank(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  int rank = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(mesh.coordinate_of(rank));
    rank = (rank + 7919) % kWorld;
  }
}
BENCHMARK(BM_mesh_coordinate_of_one_rank);

void BM_mesh_coordinate_of_one_rank_in_submesh(benchmark::State& state) {
  const DeviceMesh sub = big_mesh()[{"pp", "tp"}];
  int rank = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(sub.coordinate_of(rank));
    rank = (rank + 7919) % kWorld;
  }
}
BENCHMARK(BM_mesh_coordinate_of_one_rank_in_submesh);

// Every group along one dim (arg: the dim index), listed afresh each time.
void BM_mesh_groups(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  const int dim = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(mesh.groups(dim));
  state.counters["ranks_per_s"] = benchmark::Counter(static_cast<double>(kWorld),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_mesh_groups)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

// All held ranks' coordinates (a PerRank over 131072 ranks).
void BM_mesh_coordinate_all_ranks(benchmark::State& state) {
  const DeviceMesh& mesh = big_mesh();
  for (auto _ : state) benchmark::DoNotOptimize(mesh.coordinate());
  state.counters["ranks_per_s"] = benchmark::Counter(static_cast<double>(kWorld),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_mesh_coordinate_all_ranks)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace spmd
