// bench/sim_vs_mpi: one tensor-parallel MLP training step, timed under whichever backend it is
// launched with. bench/run_sim_vs_mpi.sh runs it under sim and under `mpirun -n 8
// --spmd-backend=mpi` on the same machine and prints the ratio of per-step times.
//
// The step (Megatron-LM's MLP, tanh activation) on a (dp=2, tp=4) mesh, each dp replica with its
// own batch [B, H]; tp rank t holds column block t of W1 [H, F] and row block t of W2 [F, H]:
//   h = x @ W1_t;  a = tanh(h);  z = all_reduce(a @ W2_t, tp)          column- then row-parallel
//   dz = z / B                                                          (loss 0.5 |z|^2 / B)
//   dW2_t = a^T dz;  dh = (dz @ W2_t^T) * (1 - a^2);  dW1_t = x^T dh
//   dx = all_reduce(dh @ W1_t^T, tp)                                    input gradient
//   dW1_t, dW2_t = all_reduce(., dp, avg);  W -= lr * dW               data parallel + SGD
// Four all_reduces per step: two over tp of [B, H], two over dp of the weight blocks.
//
//   sim_vs_mpi [--steps=N] [--hidden=H] [--batch=B]    prints `per_step_ms: ...` and a digest
#include <chrono>
#include <cstdlib>
#include <string_view>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

struct Config {
  int steps = 10;
  int warmup = 2;
  int64_t hidden = 512;
  int64_t batch = 64;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(World& world, const Config& cfg) {
  const double start = now_s();
  const int64_t tp = 4;
  if (world.size() != 8)
    throw_error<ConfigError>("sim_vs_mpi runs on 8 ranks, not {}", world.size());
  DeviceMesh mesh = init_device_mesh(world, {2, tp}, {"dp", "tp"});
  const int64_t H = cfg.hidden;
  const int64_t F = 4 * H;
  const int64_t B = cfg.batch;
  const double lr = 1e-2;
  // Blocks of the global weights (same values under every backend and mesh) and each dp
  // replica's batch.
  auto dp_of = [&](int r) { return r / static_cast<int>(tp); };
  auto tp_of = [&](int r) { return r % static_cast<int>(tp); };
  LocalTensor w1 = LocalTensor::from_fn(world, [&](int r) {
    return randn_block({H, F}, 1, {0, tp_of(r) * (F / tp)}, {H, F / tp}) * (1.0 / std::sqrt(H));
  });
  LocalTensor w2 = LocalTensor::from_fn(world, [&](int r) {
    return randn_block({F, H}, 2, {tp_of(r) * (F / tp), 0}, {F / tp, H}) * (1.0 / std::sqrt(F));
  });
  LocalTensor x = LocalTensor::from_fn(world, [&](int r) {
    return randn_block({2 * B, H}, 3, {dp_of(r) * B, 0}, {B, H});
  });

  LocalTensor dx;
  auto step = [&] {
    LocalTensor a = tanh(matmul(x, w1));
    LocalTensor z = all_reduce(matmul(a, w2), mesh, "tp");
    LocalTensor dz = z * (1.0 / static_cast<double>(B));
    LocalTensor dw2 = matmul(a.transpose(0, 1), dz);
    LocalTensor dh = matmul(dz, w2.transpose(0, 1)) * (1.0 - a * a);
    LocalTensor dw1 = matmul(x.transpose(0, 1), dh);
    dx = all_reduce(matmul(dh, w1.transpose(0, 1)), mesh, "tp");
    dw1 = all_reduce(dw1, mesh, "dp", ReduceOp::Avg);
    dw2 = all_reduce(dw2, mesh, "dp", ReduceOp::Avg);
    w1 = w1 - dw1 * lr;
    w2 = w2 - dw2 * lr;
  };
  for (int i = 0; i < cfg.warmup; ++i) step();
  barrier(mesh);
  const double t0 = now_s();
  for (int i = 0; i < cfg.steps; ++i) step();
  barrier(mesh);
  const double per_step_ms = (now_s() - t0) * 1e3 / cfg.steps;
  if (world.is_coordinator()) {
    fmt::print(
        "sim_vs_mpi: backend {}, {} ranks, mesh (dp=2, tp={}), H={} F={} B={} per replica, "
        "{} steps after {} warm-up\n",
        world.backend_name(), world.size(), tp, H, F, B, cfg.steps, cfg.warmup);
    fmt::print("per_step_ms: {:.3f}\n", per_step_ms);
    fmt::print("program_ms: {:.1f}\n", (now_s() - start) * 1e3);
  }
  print_digest(world, {w1, w2, dx});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) {
    Config cfg;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.starts_with("--steps=")) cfg.steps = std::atoi(argv[i] + 8);
      if (arg.starts_with("--hidden=")) cfg.hidden = std::atoll(argv[i] + 9);
      if (arg.starts_with("--batch=")) cfg.batch = std::atoll(argv[i] + 8);
    }
    return run(world, cfg);
  });
}
