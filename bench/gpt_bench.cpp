// bench/gpt_bench.cpp: what simulating 8 ranks costs over computing the same training step once.
//
// BM_gpt_step: one training step of examples/gpt's model (forward, backward, clip_grad_norm,
// AdamW; F32, dropout on) with tensor + sequence parallelism on a (dp=2, tp=4) mesh under sim,
// against the same step on full tensors (autograd on Tensors), timed in the same run,
// interleaved, the median of 3 rounds each (each round times a model's second step in a row):
//   sim_ms           the sharded step (8 ranks' pieces, the collectives, propagation, autograd)
//   single_ms        the step on full tensors
//   sim_over_single  sim_ms / single_ms (goal <= 1.5)
//   fresh_blocks     buffers of a cached size the timed rounds (after three warm-up steps of
//                    each) took fresh from the C allocator
//                    rather than from the CPU caching allocator (goal 0: Note [CPU caching
//                    allocator] in spmd/tensor/storage.cpp)
//   step_gflop       the step's floating-point work on full tensors, as the op table counts it
//                    (step_gflop below); scripts/bench divides it by the best BLAS rate measured
//                    in the same run: the arithmetic floor of this step on this machine
// The model is larger than the example's default (d_model 256, sequence 128, batch 8), so that
// each op's arithmetic outweighs its fixed cost as it does in real training. BM_gpt_step_toy is
// the same step at the example's own shape (d_model 64, sequence 32), where the fixed cost per op
// dominates. bench/peers/torch_gpt.py times both steps in PyTorch's LocalTensorMode
// (scripts/bench --peers).
//
//   build/bench/bench/gpt_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include <spmd/debug/dry_run.h>
#include <spmd/tensor/storage.h>
#include "examples/gpt_model.h"

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;

// The benchmark's shape (toy: the example's default one), F32.
gpt_model::Config bench_config(bool toy) {
  gpt_model::Config c;
  if (!toy) {
    c.d_model = 256;
    c.heads = 8;
    c.seq = 128;
  }
  c.dtype = DType::F32;
  return c;
}

// Synthetic bytes: the benchmark reads no file.
std::string bench_text() {
  std::string text;
  for (int i = 0; i < 20000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  return text;
}

// Milliseconds of one call of fn, after one untimed call: the rounds alternate between the two
// models, so each timed step follows a step of its own model, as bench/peers/torch_gpt.py times
// PyTorch's steps (one after another).
double time_ms(const std::function<void()>& fn) {
  fn();
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The median of three times, as bench/peers/torch_gpt.py reports PyTorch's.
double median3(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[1];
}

// GFLOP of one training step of config `c` on full tensors: the op table's formulas (OpDef::flops:
// 2*M*N*K per matmul, 4*B*H*Sq*Sk*D per attention, and their backward entries) summed by a DryRun
// over the same step on a one-rank mesh, whose one rank holds the full tensors. The device is
// given a fused attention, so a causal attention counts the half of its products the mask leaves
// (Note [Dry-run estimates]): the products any implementation of the step must do. Ops the table
// gives no flops (elementwise ones, norms, softmax, the optimizer) are left out, so the floor is a
// low one.
double step_gflop(const gpt_model::Config& c, const Tensor& tokens) {
  World world = World::sim(1);
  const gpt_model::ModelLayout layout{init_device_mesh(world, {1, 1}, {"dp", "tp"}), false};
  gpt_model::Model<DTensor> model = gpt_model::init_model<DTensor>(c, &layout);
  std::vector<DTensor*> params = model.params();
  AdamW<DTensor> opt(params, gpt_model::adamw_options(c));
  DeviceSpec device;
  device.flash_attention = true;
  DryRun dry(world, device);
  gpt_model::train_step(c, gpt_model::Parallel{}, model, opt, params, tokens, &layout, 0);
  return dry.report({}).flops / 1e9;
}

void gpt_step(benchmark::State& state, bool toy) {
  const gpt_model::Config c = bench_config(toy);
  const std::string text = bench_text();
  World world = World::sim(8);
  const gpt_model::ModelLayout layout{init_device_mesh(world, {2, 4}, {"dp", "tp"}), false};
  gpt_model::Model<DTensor> sim = gpt_model::init_model<DTensor>(c, &layout);
  gpt_model::Model<Tensor> single = gpt_model::init_model<Tensor>(c, nullptr);
  std::vector<DTensor*> sim_params = sim.params();
  std::vector<Tensor*> single_params = single.params();
  AdamW<DTensor> sim_opt(sim_params, gpt_model::adamw_options(c));
  AdamW<Tensor> single_opt(single_params, gpt_model::adamw_options(c));
  const Tensor tokens = gpt_model::batch_tokens(c, text, 0);
  int64_t step = 0;
  auto sim_step = [&] {
    gpt_model::train_step(c, gpt_model::Parallel{}, sim, sim_opt, sim_params, tokens, &layout,
                          step++);
  };
  auto single_step = [&] {
    gpt_model::train_step(c, gpt_model::Single{}, single, single_opt, single_params, tokens,
                          nullptr, step++);
  };
  for (int warm = 0; warm < 3; ++warm) {  // AdamW's state, then the cache filling
    sim_step();
    single_step();
  }
  for (auto _ : state) sim_step();
  std::vector<double> sim_times, single_times;
  const uint64_t fresh_before = cpu_allocator_stats().fresh_blocks;
  for (int round = 0; round < 3; ++round) {
    sim_times.push_back(time_ms(sim_step));
    single_times.push_back(time_ms(single_step));
  }
  const double sim_ms = median3(sim_times), single_ms = median3(single_times);
  state.counters["fresh_blocks"] =
      static_cast<double>(cpu_allocator_stats().fresh_blocks - fresh_before);
  state.counters["sim_ms"] = sim_ms;
  state.counters["single_ms"] = single_ms;
  state.counters["sim_over_single"] = sim_ms / single_ms;
  state.counters["step_gflop"] = step_gflop(c, tokens);
}
void BM_gpt_step(benchmark::State& state) {
  gpt_step(state, false);
}
BENCHMARK(BM_gpt_step)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_gpt_step_toy(benchmark::State& state) {
  gpt_step(state, true);
}
BENCHMARK(BM_gpt_step_toy)->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace
}  // namespace spmd
