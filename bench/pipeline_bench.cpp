// bench/pipeline_bench.cpp: what running a model through spmd::pipeline costs under sim.
//
// BM_pipeline_step/<schedule>: one training step of a chain of 4 stages (tanh(x W_s), width 256,
// 64 rows per microbatch, 8 microbatches) run by run_pipeline on a pp=4 mesh under sim, against
// the same step without pp (the same stages and microbatches, one after another, on one rank),
// timed in the same run, interleaved, best of 3 rounds each:
//   pp_ms            the pipelined step (4 stage ranks, sends and recvs, the schedule's order)
//   flat_ms          the same step without pp
//   pp_over_flat     pp_ms / flat_ms
// BM_schedule_overhead/<schedule>: the same with [1, 1] tensors, where the arithmetic is nothing:
//   us_per_action    the step over the schedule's actions (F, B, I, W): what the runner, the
//                    transfers and the autograd bookkeeping cost per action
//
//   build/bench/bench/pipeline_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <spmd/spmd.h>

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kStages = 4;
constexpr int kMicrobatches = 8;

double time_ms(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Chain {
  int64_t rows;
  int64_t width;
  Tensor weight(int s) const { return randn({width, width}, 10 + static_cast<uint64_t>(s)) * 0.05; }
  Tensor input(int m) const { return randn({rows, width}, 100 + static_cast<uint64_t>(m)); }
};

// One step through run_pipeline on a pp mesh of `kStages` ranks.
double pipelined_step(const Chain& c, const World& world, const DeviceMesh& mesh,
                      const pipeline::Schedule& schedule) {
  std::vector<LocalTensor> w(kStages);
  pipeline::PipelineModel model;
  for (int s = 0; s < kStages; ++s) {
    const std::vector<int> ranks = pipeline::stage_ranks(mesh, "pp", s);
    w[static_cast<size_t>(s)] = LocalTensor::from_fn(ranks, [&](int) { return c.weight(s); });
    w[static_cast<size_t>(s)].requires_grad_(true);
    LocalTensor* p = &w[static_cast<size_t>(s)];
    model.stages.push_back(
        {[p](const LocalTensor& x) { return tanh(matmul(x, *p)); }, {p}, {c.rows, c.width}});
  }
  model.input = [&](int m, const std::vector<int>& ranks) {
    return LocalTensor::from_fn(ranks, [&](int) { return c.input(m); });
  };
  model.loss = [](const LocalTensor& y, int) { return sum(y * y); };
  return time_ms([&] { pipeline::run_pipeline(model, schedule, mesh, "pp"); });
}

// The same step without pp: every stage on one rank, microbatch after microbatch.
double flat_step(const Chain& c) {
  std::vector<LocalTensor> w(kStages);
  for (int s = 0; s < kStages; ++s) {
    w[static_cast<size_t>(s)] =
        LocalTensor::from_fn(std::vector<int>{0}, [&](int) { return c.weight(s); });
    w[static_cast<size_t>(s)].requires_grad_(true);
  }
  return time_ms([&] {
    for (int m = 0; m < kMicrobatches; ++m) {
      LocalTensor h = LocalTensor::from_fn(std::vector<int>{0}, [&](int) { return c.input(m); });
      for (const LocalTensor& ws : w) h = tanh(matmul(h, ws));
      backward(sum(h * h) * (1.0 / kMicrobatches));
    }
  });
}

void pipeline_step(benchmark::State& state, const std::string& name, const Chain& chain) {
  World world = World::sim(kStages);
  const DeviceMesh mesh = init_device_mesh(world, {kStages}, {"pp"});
  const pipeline::Schedule schedule = pipeline::make_schedule(name, kStages, kMicrobatches);
  pipelined_step(chain, world, mesh, schedule);  // warm-up
  flat_step(chain);
  double best_pp = 1e300;
  double best_flat = 1e300;
  for (auto _ : state) {
    for (int round = 0; round < 3; ++round) {
      best_pp = std::min(best_pp, pipelined_step(chain, world, mesh, schedule));
      best_flat = std::min(best_flat, flat_step(chain));
    }
  }
  size_t actions = 0;
  for (const auto& list : schedule.actions) actions += list.size();
  state.counters["pp_ms"] = best_pp;
  state.counters["flat_ms"] = best_flat;
  state.counters["pp_over_flat"] = best_pp / best_flat;
  state.counters["us_per_action"] = best_pp * 1e3 / static_cast<double>(actions);
}

void BM_pipeline_step(benchmark::State& state, const char* name) {
  pipeline_step(state, name, Chain{64, 256});
}
void BM_schedule_overhead(benchmark::State& state, const char* name) {
  pipeline_step(state, name, Chain{1, 1});
}

BENCHMARK_CAPTURE(BM_pipeline_step, gpipe, "gpipe")->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_pipeline_step, 1f1b, "1f1b")->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_pipeline_step, zb, "zb")->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_schedule_overhead, gpipe, "gpipe")->Iterations(1);
BENCHMARK_CAPTURE(BM_schedule_overhead, 1f1b, "1f1b")->Iterations(1);
BENCHMARK_CAPTURE(BM_schedule_overhead, zb, "zb")->Iterations(1);

}  // namespace
}  // namespace spmd
