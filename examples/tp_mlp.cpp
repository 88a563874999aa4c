// examples/tp_mlp.cpp: a Megatron-style tensor-parallel MLP on a (dp, tp) mesh, one training
// step, checked against the same step on full tensors.
//
//   ./tp_mlp                                   # sim: 8 ranks in this process, mesh (dp=2, tp=4)
//   ./tp_mlp --spmd-world-size=4               # mesh (dp=2, tp=2); any even world size works
//   mpirun -n 8 ./tp_mlp --spmd-backend=mpi    # one rank per process, the same digest
//
// The layer is y = tanh(x W1) W2 with W1 [H, F] split by columns over tp (column-parallel) and W2
// [F, H] split by rows (row-parallel), as in Megatron-LM (which uses GELU; tanh keeps the
// derivative a one-liner). Each dp replica takes its own slice of the batch. tp = world size / 2
// need not divide F: the column blocks are then uneven, and with tp > F some are empty
// (Note [Uneven sharding]); the step and its check are the same.
//
//   forward (DTensor ops; sharding propagation picks every plan):
//     h = x @ W1          S(0),S(1)     each tp rank has its columns of h: no communication
//     z = tanh(h) @ W2    S(0),P(sum)   each tp rank has a partial sum of the whole output
//     y = z -> S(0),R     all_reduce over tp
//     loss = mean((y - target)^2)
//   backward: backward(loss) (autograd; every gradient gets its placements by propagation):
//     dW2 = a^T dy        P(sum),S(0) -> R,S(0)      all_reduce over dp (each replica's rows)
//     dW1 = x^T dh        P(sum),S(1) -> R,S(1)      all_reduce over dp
//     dx  = dh W1^T       S(0),P(sum) -> S(0),R      all_reduce over tp (partial column sums)
//   SGD: W -= lr dW on each rank's blocks, outside the tape (NoGradGuard).
//
// The check computes the same step on full tensors with the gradients written out by hand and
// compares the loss, y, dx and both updated weights. The weights and data come from
// mesh-invariant random DTensors, so every backend and mesh starts from the same values.
// (tests/dtensor/autograd_test.cpp also checks these gradients against the backward written out
// on the local shards with its collectives.)
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

constexpr int64_t kBatch = 16;   // global batch N (split over dp)
constexpr int64_t kHidden = 16;  // H
constexpr int64_t kFfn = 32;     // F (split over tp)
constexpr double kLr = 0.1;
constexpr double kTolerance = 1e-5;

// The step on full tensors: what every rank of the mesh computes together.
struct Reference {
  Tensor loss, y, dx, w1, w2;
};

Reference reference_step(const Tensor& x, const Tensor& target, const Tensor& w1,
                         const Tensor& w2) {
  const double numel = static_cast<double>(target.numel());
  const Tensor a = tanh(matmul(x, w1));
  const Tensor y = matmul(a, w2);
  const Tensor diff = y - target;
  const Tensor loss = sum(diff * diff) / numel;
  const Tensor dy = diff * (2.0 / numel);
  const Tensor dw2 = matmul(a.transpose(0, 1), dy);
  const Tensor dh = matmul(dy, w2.transpose(0, 1)) * (1.0 - a * a);
  const Tensor dw1 = matmul(x.transpose(0, 1), dh);
  const Tensor dx = matmul(dh, w1.transpose(0, 1));
  return {loss, y, dx, w1 - dw1 * kLr, w2 - dw2 * kLr};
}

void section(const World& world, const std::string& title) {
  if (world.is_coordinator()) fmt::print("\n== {}\n", title);
}

void show(const World& world, const std::string& name, const std::string& role, const DTensor& t) {
  if (!world.is_coordinator()) return;
  // Short pictures, so that the whole step fits on a terminal.
  fmt::print("\n{} {} {}: {}\n{}\n", name, shape_str(t.shape()), to_string(t.placements()), role,
             visualize_sharding(t, {.max_height = 4}));
}

int tp_mlp(World& world) {
  if (world.size() < 2 || world.size() % 2 != 0) {
    throw_error<ConfigError>(
        "tp_mlp runs on a (dp=2, tp) mesh and needs an even world size, got {}", world.size());
  }
  const int64_t tp = world.size() / 2;
  DeviceMesh mesh = init_device_mesh(world, {2, tp}, {"dp", "tp"});
  if (world.is_coordinator()) {
    fmt::print("tp_mlp: one training step of a Megatron-style tensor-parallel MLP\n");
    fmt::print(
        "        y = tanh(x W1) W2, x [{}, {}], W1 [{}, {}], W2 [{}, {}]; {} ranks, backend {}\n",
        kBatch, kHidden, kHidden, kFfn, kFfn, kHidden, world.size(), world.backend_name());
    fmt::print("\n== mesh, layout {}\n{}", mesh.layout(), mesh.to_grid());
  }

  section(world, "sharding (which ranks hold which block)");
  const Placements batch = {Shard{0}, Replicate{}};
  DTensor x = randn({kBatch, kHidden}, mesh, batch, /*seed=*/1);
  DTensor target = randn({kBatch, kHidden}, mesh, batch, /*seed=*/2);
  DTensor w1 = randn({kHidden, kFfn}, mesh, {Replicate{}, Shard{1}}, /*seed=*/3) *
               (1.0 / std::sqrt(static_cast<double>(kHidden)));
  DTensor w2 = randn({kFfn, kHidden}, mesh, {Replicate{}, Shard{0}}, /*seed=*/4) *
               (1.0 / std::sqrt(static_cast<double>(kFfn)));
  x.requires_grad_();
  w1.requires_grad_();
  w2.requires_grad_();
  show(world, "x", "the batch split over dp, replicated over tp", x);
  show(world, "W1", "column-parallel (its columns split over tp)", w1);
  show(world, "W2", "row-parallel (its rows split over tp)", w2);

  section(world, "forward (DTensor ops)");
  const DTensor h = matmul(x, w1);
  const DTensor a = tanh(h);
  const DTensor z = matmul(a, w2);
  const DTensor y = z.redistribute(batch);
  const DTensor diff = y - target;
  const double numel = static_cast<double>(kBatch * kHidden);
  const DTensor loss = sum(diff * diff) / numel;
  // Every rank: a collective. A dry run (--spmd-tensors=meta) has shapes, not values.
  const Tensor loss_full = loss.full_tensor();
  const double loss_value = loss_full.is_meta() ? std::nan("") : loss_full.item<double>();
  if (world.is_coordinator()) {
    fmt::print("h = x @ W1          {:<12} no communication\n", to_string(h.placements()));
    fmt::print("z = tanh(h) @ W2    {:<12} partial sums over tp\n", to_string(z.placements()));
    fmt::print("y = z.redistribute  {:<12} all_reduce over tp\n", to_string(y.placements()));
    fmt::print("loss = mean((y - target)^2) = {:.6f}   {} (partial sums over dp)\n", loss_value,
               to_string(loss.placements()));
  }

  section(world, "backward (autograd)");
  backward(loss);
  const DTensor dw1 = w1.grad();
  const DTensor dw2 = w2.grad();
  const DTensor dx = x.grad();
  if (world.is_coordinator()) {
    fmt::print("dW1 {:<12} (W1's placements; its dp partial sums reduced)\n",
               to_string(dw1.placements()));
    fmt::print("dW2 {:<12} (W2's placements)\n", to_string(dw2.placements()));
    fmt::print("dx  {:<12} (x's placements; its tp partial sums reduced)\n",
               to_string(dx.placements()));
    fmt::print("SGD step, lr {}\n", kLr);
  }
  DTensor w1_new, w2_new;
  {
    NoGradGuard no_grad;
    w1_new = w1 - dw1 * kLr;
    w2_new = w2 - dw2 * kLr;
  }

  section(world, fmt::format("collectives of the step (this process's trace; estimates on the {} "
                             "topology, {} devices per host)",
                             world.topology() == default_topology() ? "default" : "given",
                             world.topology().devices_per_host));
  if (world.is_coordinator()) fmt::print("{}", trace().summary_table());

  section(world, "check against the same step on full tensors");
  NoGradGuard no_grad;
  const Reference ref =
      reference_step(x.full_tensor(), target.full_tensor(), w1.full_tensor(), w2.full_tensor());
  const bool dry_run = meta_tensors();
  auto error_of = [](const Tensor& got, const Tensor& expected) {
    return got.is_meta() ? std::nan("") : max_abs_diff(got, expected);
  };
  const std::vector<std::pair<std::string, double>> errors = {
      {"loss", error_of(loss.full_tensor(), ref.loss)},
      {"y", error_of(y.full_tensor(), ref.y)},
      {"dx", error_of(dx.full_tensor(), ref.dx)},
      {"W1 after SGD", error_of(w1_new.full_tensor(), ref.w1)},
      {"W2 after SGD", error_of(w2_new.full_tensor(), ref.w2)}};
  double worst = 0.0;
  for (const auto& [name, error] : errors) worst = std::max(worst, error);
  const bool pass = dry_run || worst <= kTolerance;
  if (world.is_coordinator() && dry_run) {
    fmt::print("check: skipped (--spmd-tensors=meta: a dry run has no values)\n");
  } else if (world.is_coordinator()) {
    for (const auto& [name, error] : errors) fmt::print("{:<14} max |error| {:.3g}\n", name, error);
    fmt::print("check: {} (max error {:.3g}, tolerance {:.0e})\n", pass ? "PASS" : "FAIL", worst,
               kTolerance);
  }
  print_digest(world, {y.to_local(), dx.to_local(), w1_new.to_local(), w2_new.to_local()});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, tp_mlp);
}
