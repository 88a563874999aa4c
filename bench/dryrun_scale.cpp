// bench/dryrun_scale.cpp: one training step of examples/gpt's model at a 7B-class shape (32
// layers, d_model 4096, 32 heads, sequence 4096, vocabulary 32000, bf16) as a shape-only dry run
// (Note [Shape-only tensors] in spmd/tensor/meta.h) under sim, on (dp, tp=8) meshes from 8 to
// 16384 ranks: one benchmark per world size, its real time, and user counters `ranks` and
// `peak_rss_mib` (the process's peak resident set during that benchmark, reset before it).
//
//   build/dev/bench/dryrun_scale                       # every size, one iteration each
//   build/dev/bench/dryrun_scale --benchmark_filter=/16384
//
// The global batch is one sequence per dp rank. The parameters are tensor- and sequence-parallel
// over tp and replicated over dp (the `sp` layout of examples/gpt), AdamW state included. Ranks
// whose shards have the same shapes are computed once (Note [Shard classes] in
// spmd/world/local_tensor.h), so the time follows the distinct shard shapes, not the world size.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <benchmark/benchmark.h>

#include <spmd/spmd.h>

#include "examples/gpt_model.h"

using namespace spmd;
using namespace gpt_model;

namespace {

constexpr int64_t kTp = 8;

// VmHWM of this process in MiB (the peak resident set since the last reset_peak_rss()).
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0.0;
}

// Returns freed heap to the OS and restarts the peak at the current resident set (Linux:
// writing 5 to clear_refs resets VmHWM).
void reset_peak_rss() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

Config model_config(int64_t dp) {
  Config c;
  c.layers = 32;
  c.d_model = 4096;
  c.heads = 32;
  c.seq = 4096;
  c.vocab = 32000;
  c.batch = dp;
  c.steps = 1;
  c.dtype = DType::BF16;
  return c;
}

void dry_run_step(int64_t ranks) {
  const MetaTensorsScope meta(true);
  World world = World::sim(static_cast<int>(ranks));
  trace().clear();
  const Config c = model_config(ranks / kTp);
  const DeviceMesh mesh = init_device_mesh(world, {ranks / kTp, kTp}, {"dp", "tp"});
  const ModelLayout layout{mesh, false};
  DryRun dry(world);
  Model<DTensor> model = init_model<DTensor>(c, &layout);
  std::vector<DTensor*> params = model.params();
  AdamW<DTensor> opt(params, adamw_options(c));
  train_step(c, Parallel{false}, model, opt, params, batch_tokens(c, "", 0), &layout, 0);
  benchmark::DoNotOptimize(dry.report({}).step_us);
}

void BM_DryRun(benchmark::State& state) {
  const int64_t ranks = state.range(0);
  reset_peak_rss();
  for (auto _ : state) dry_run_step(ranks);
  state.counters["ranks"] = static_cast<double>(ranks);
  state.counters["peak_rss_mib"] = peak_rss_mib();
  trace().clear();
}

BENCHMARK(BM_DryRun)->RangeMultiplier(2)->Range(8, 16384)->Iterations(1)->UseRealTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
