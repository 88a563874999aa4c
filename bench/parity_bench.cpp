// bench/parity_bench.cpp: what --spmd-debug=parity costs (Note [Parity run] in
// spmd/debug/parity.h): a whole launch() of a GPT training program (examples/gpt's model, tensor +
// sequence parallel on (dp=2, tp=4), F32, dropout on, AdamW) under sim, plain and with parity,
// timed in the same run, interleaved, best of 3 rounds each:
//   plain_ms           launch() of the program on 8 ranks
//   parity_ms          the same with --spmd-debug=parity: the program on one rank first, every
//                      DTensor recorded, then on 8 ranks, every DTensor compared
//   parity_over_plain  parity_ms / plain_ms (goal <= 2.5)
// BM_parity_gpt is the example's own shape (d_model 64, sequence 32); BM_parity_gpt_large the
// gpt_bench shape (d_model 256, sequence 128), where each op's arithmetic outweighs its fixed cost.
//
//   build/bench/bench/parity_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/gpt_model.h"

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;

std::string bench_text() {
  std::string text;
  for (int i = 0; i < 20000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  return text;
}

// Three training steps of the GPT under launch() with `flags`; milliseconds.
double run_ms(bool large, const std::vector<std::string>& flags) {
  gpt_model::Config c;
  if (large) {
    c.d_model = 256;
    c.heads = 8;
    c.seq = 128;
  }
  c.dtype = DType::F32;
  const std::string text = bench_text();
  std::vector<std::string> args{"parity_bench", "--spmd-world-size=8"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  const auto start = Clock::now();
  const int code = launch(argc, argv.data(), [&](World& world) {
    const gpt_model::ModelLayout layout{
        init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"}), false};
    gpt_model::Model<DTensor> model = gpt_model::init_model<DTensor>(c, &layout);
    std::vector<DTensor*> params = model.params();
    AdamW<DTensor> opt(params, gpt_model::adamw_options(c));
    for (int64_t step = 0; step < 3; ++step) {
      gpt_model::train_step(c, gpt_model::Parallel{}, model, opt, params,
                            gpt_model::batch_tokens(c, text, step), &layout, step);
    }
  });
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (code != 0) throw std::runtime_error("parity_bench: the program failed");
  return ms;
}

void parity_cost(benchmark::State& state, bool large) {
  for (auto _ : state) run_ms(large, {"--spmd-debug=parity"});
  double plain = 1e300, parity = 1e300;
  for (int round = 0; round < 3; ++round) {
    plain = std::min(plain, run_ms(large, {}));
    parity = std::min(parity, run_ms(large, {"--spmd-debug=parity"}));
  }
  state.counters["plain_ms"] = plain;
  state.counters["parity_ms"] = parity;
  state.counters["parity_over_plain"] = parity / plain;
}

void BM_parity_gpt(benchmark::State& state) {
  parity_cost(state, false);
}
BENCHMARK(BM_parity_gpt)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_parity_gpt_large(benchmark::State& state) {
  parity_cost(state, true);
}
BENCHMARK(BM_parity_gpt_large)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace spmd
