// bench/tensor_bench.cpp: the dense Tensor against the code it must keep up with.
//
// Headline counters (issue 2), each measured in the same run on the same data, interleaved
// iteration by iteration so a noisy shared machine slows both sides alike:
//   BM_Matmul512  vs_eigen = our matmul's speed / raw Eigen's (C.noalias() = A * B), F32.
//   BM_Matmul512Blas  vs_blas = our matmul's speed / raw OpenBLAS sgemm's with OpenBLAS's own
//                 threads, one per core (the best BLAS on the machine), F32.
//   BM_Add16M     vs_loop  = our a + b's speed / a plain loop into a preallocated buffer.
//   BM_Attention/S  vs_composed = causal attention's forward and backward (F32, 8 heads) through
//                 the blocked kernel (Note [Blocked attention]) against the same math composed of
//                 matmul and softmax with autograd (which makes the [S, S] scores), at S = 128
//                 (batch 8, head dim 32: gpt_bench's d_model 256) and S = 1024 (batch 1, 64).
// The reported time is ours (manual timing); ms_ours / ms_ref give both sides per iteration.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include <spmd/ops/ops.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/random.h>

#if SPMD_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

namespace {

using spmd::Tensor;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs `ours` and `reference` alternately; reports our time and the ratio of their speeds.
template <class Ours, class Reference>
void compare(benchmark::State& state, const char* counter, Ours&& ours, Reference&& reference) {
  double ours_total = 0;
  double ref_total = 0;
  for (auto _ : state) {
    Clock::time_point start = Clock::now();
    ours();
    const double t = seconds_since(start);
    ours_total += t;
    state.SetIterationTime(t);
    start = Clock::now();
    reference();
    ref_total += seconds_since(start);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters[counter] = ref_total / ours_total;
  state.counters["ms_ours"] = 1e3 * ours_total / n;
  state.counters["ms_ref"] = 1e3 * ref_total / n;
}

void BM_Matmul512(benchmark::State& state) {
  constexpr int64_t kN = 512;
  const Tensor a = spmd::randn({kN, kN}, 1);
  const Tensor b = spmd::randn({kN, kN}, 2);
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMajor> ea(a.data<float>(), kN, kN);
  const Eigen::Map<const RowMajor> eb(b.data<float>(), kN, kN);
  RowMajor ec(kN, kN);
  compare(
      state, "vs_eigen",
      [&] {
        Tensor c = spmd::matmul(a, b);
        benchmark::DoNotOptimize(c.data_ptr());
      },
      [&] {
        ec.noalias() = ea * eb;
        benchmark::DoNotOptimize(ec.data());
      });
  state.counters["GFLOPS"] = 2.0 * kN * kN * kN / (1e-3 * state.counters["ms_ours"]) / 1e9;
}
BENCHMARK(BM_Matmul512)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

#if SPMD_HAVE_OPENBLAS
// OpenBLAS's workers busy-wait for 2^28 cycles (a tenth of a second) after each of its calls
// before they sleep, so in BM_Matmul512Blas, which alternates the reference with ours call by
// call, the reference's worker would hold a core through much of our calls, which then ran on
// one core: vs_blas went from 0.5 to 0.87 from run to run on 2 cores, and is 0.97 to 1.09 with the
// shortest timeout (2^4 cycles), which makes the worker sleep at once, at the price of a wake-up
// in each reference call.
// OpenBLAS reads it when it loads, which is at our first product; a value the user set is kept.
const bool kBlasWorkersSleep = [] {
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
  return true;
}();

// The OpenBLAS our matmul loads (the same file: dlopen returns the loaded copy).
struct RawBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_threads = nullptr;
};

RawBlas raw_blas() {
  void* lib = dlopen(SPMD_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return {};
  return {reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm")),
          reinterpret_cast<decltype(&openblas_set_num_threads)>(
              dlsym(lib, "openblas_set_num_threads"))};
}

void BM_Matmul512Blas(benchmark::State& state) {
  benchmark::DoNotOptimize(spmd::matmul(spmd::ones({2, 2}), spmd::ones({2, 2})).data_ptr());
  const RawBlas blas = raw_blas();
  if (blas.sgemm == nullptr || blas.set_threads == nullptr) {
    state.SkipWithError("OpenBLAS did not load");
    return;
  }
  constexpr int kN = 512;
  const Tensor a = spmd::randn({kN, kN}, 1);
  const Tensor b = spmd::randn({kN, kN}, 2);
  std::vector<float> c(static_cast<std::size_t>(kN) * kN);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  compare(
      state, "vs_blas",
      [&] {
        Tensor out = spmd::matmul(a, b);
        benchmark::DoNotOptimize(out.data_ptr());
      },
      [&] {
        // OpenBLAS's threads for the reference only: ours keeps them off (Note [Matmul on BLAS]).
        blas.set_threads(cores);
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kN, kN, kN, 1.0f, a.data<float>(), kN,
                   b.data<float>(), kN, 0.0f, c.data(), kN);
        blas.set_threads(1);
        benchmark::DoNotOptimize(c.data());
      });
  state.counters["GFLOPS"] = 2.0 * kN * kN * kN / (1e-3 * state.counters["ms_ours"]) / 1e9;
  state.counters["GFLOPS_ref"] = 2.0 * kN * kN * kN / (1e-3 * state.counters["ms_ref"]) / 1e9;
  // The kernel set OpenBLAS loaded (Note [OpenBLAS core type]), for the bench page.
  state.SetLabel(spmd::cpu_kernels::matmul_library());
}
BENCHMARK(BM_Matmul512Blas)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);
#endif

void BM_Add16M(benchmark::State& state) {
  constexpr int64_t kN = int64_t{1} << 24;
  const Tensor a = spmd::rand({kN}, 1);
  const Tensor b = spmd::rand({kN}, 2);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  std::vector<float> out(kN);
  compare(
      state, "vs_loop",
      [&] {
        Tensor c = a + b;
        benchmark::DoNotOptimize(c.data_ptr());
      },
      [&] {
        float* po = out.data();
        for (int64_t i = 0; i < kN; ++i) po[i] = pa[i] + pb[i];
        benchmark::DoNotOptimize(po);
      });
  state.counters["GBps"] = 3.0 * sizeof(float) * kN / (1e-3 * state.counters["ms_ours"]) / 1e9;
}
BENCHMARK(BM_Add16M)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Informational: a + b from 16 floats (the per-op overhead) to 4M. Run once more with
// SPMD_NUM_THREADS=1 to see from which size the second thread pays (kElementwiseGrain).
void BM_AddSizes(benchmark::State& state) {
  const Tensor a = spmd::rand({state.range(0)}, 1);
  const Tensor b = spmd::rand({state.range(0)}, 2);
  for (auto _ : state) benchmark::DoNotOptimize((a + b).data_ptr());
  state.SetBytesProcessed(3 * 4 * a.numel() * state.iterations());
}
BENCHMARK(BM_AddSizes)->RangeMultiplier(4)->Range(16, 1 << 22);

// Informational: a strided copy, a reduction, softmax rows and the RNG.
void BM_ContiguousOfTranspose(benchmark::State& state) {
  const Tensor a = spmd::rand({4096, 4096}, 1).transpose(0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(a.contiguous().data_ptr());
  state.SetBytesProcessed(2 * 4 * a.numel() * state.iterations());
}
BENCHMARK(BM_ContiguousOfTranspose)->Unit(benchmark::kMillisecond);

void BM_Sum16M(benchmark::State& state) {
  const Tensor a = spmd::rand({int64_t{1} << 24}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(spmd::sum(a).item<float>());
  state.SetBytesProcessed(4 * a.numel() * state.iterations());
}
BENCHMARK(BM_Sum16M)->Unit(benchmark::kMillisecond);

void BM_SoftmaxRows(benchmark::State& state) {
  const Tensor a = spmd::randn({4096, 1024}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(spmd::softmax(a, 1).data_ptr());
  state.SetBytesProcessed(2 * 4 * a.numel() * state.iterations());
}
BENCHMARK(BM_SoftmaxRows)->Unit(benchmark::kMillisecond);

void BM_Randn1M(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(spmd::randn({1 << 20}, 7).data_ptr());
  state.SetItemsProcessed((int64_t{1} << 20) * state.iterations());
}
BENCHMARK(BM_Randn1M)->Unit(benchmark::kMillisecond);

// Dropout's keep mask for 4M F32 elements in rows of 1024 (Note [Philox in lanes]): one Philox
// evaluation and the keep test per element.
void BM_DropoutMask4M(benchmark::State& state) {
  const spmd::Shape shape = {4096, 1024};
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        spmd::dropout_mask_block(shape, 7, {0, 0}, shape, 0.1, spmd::DType::F32).data_ptr());
  }
  state.SetItemsProcessed(4096 * 1024 * state.iterations());
}
BENCHMARK(BM_DropoutMask4M)->Unit(benchmark::kMillisecond);

void BM_Attention(benchmark::State& state) {
  const int64_t s = state.range(0);
  const int64_t batch = s <= 128 ? 8 : 1;
  const int64_t d = s <= 128 ? 32 : 64;
  const Tensor q0 = spmd::randn({batch, 8, s, d}, 1);
  const Tensor k0 = spmd::randn({batch, 8, s, d}, 2);
  const Tensor v0 = spmd::randn({batch, 8, s, d}, 3);
  const Tensor w = spmd::randn({batch, 8, s, d}, 4);
  std::vector<bool> later(static_cast<size_t>(s * s));
  for (int64_t i = 0; i < s * s; ++i) later[static_cast<size_t>(i)] = i % s > i / s;
  const Tensor hidden = spmd::from_vector(later, {s, s});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto leaves = [&] {
    std::vector<Tensor> t = {q0.clone(), k0.clone(), v0.clone()};
    for (Tensor& x : t) x.requires_grad_();
    return t;
  };
  compare(
      state, "vs_composed",
      [&] {
        std::vector<Tensor> t = leaves();
        spmd::backward(spmd::sum(spmd::scaled_dot_product_attention(t[0], t[1], t[2], true) * w));
        benchmark::DoNotOptimize(t[0].grad().data_ptr());
      },
      [&] {
        std::vector<Tensor> t = leaves();
        const Tensor scores = spmd::masked_fill(spmd::matmul(t[0], t[1].transpose(-1, -2)) * scale,
                                                hidden, -INFINITY);
        spmd::backward(spmd::sum(spmd::matmul(spmd::softmax(scores, -1), t[2]) * w));
        benchmark::DoNotOptimize(t[0].grad().data_ptr());
      });
}
BENCHMARK(BM_Attention)->Arg(128)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);

// One AdamW update of a 1M-element F32 parameter: adamw_step (Note [Fused AdamW]: reads p, g, m,
// v and writes p, m, v once) against the eleven elementwise ops it replaced (the same bits).
void BM_AdamWStep(benchmark::State& state) {
  constexpr int64_t kN = int64_t{1} << 20;
  const Tensor p = spmd::randn({kN}, 1);
  const Tensor g = spmd::randn({kN}, 2);
  const Tensor m = spmd::randn({kN}, 3) * 0.1;
  const Tensor v = spmd::abs(spmd::randn({kN}, 4)) * 0.01;
  const spmd::AdamWStep s{.lr = 1e-3, .weight_decay = 0.1, .step = 5};
  const double step_size = s.lr / (1.0 - std::pow(s.beta1, 5.0));
  const double inv_correction = 1.0 / std::sqrt(1.0 - std::pow(s.beta2, 5.0));
  compare(
      state, "vs_composed",
      [&] { benchmark::DoNotOptimize(spmd::adamw_step(p, g, m, v, s).data_ptr()); },
      [&] {
        const Tensor m1 = m * s.beta1 + g * (1.0 - s.beta1);
        const Tensor v1 = v * s.beta2 + g * g * (1.0 - s.beta2);
        const Tensor denom = spmd::sqrt(v1) * inv_correction + s.eps;
        const Tensor p1 = p * (1.0 - s.lr * s.weight_decay) - m1 / denom * step_size;
        benchmark::DoNotOptimize(p1.data_ptr());
      });
}
BENCHMARK(BM_AdamWStep)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
