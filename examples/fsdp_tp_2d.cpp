// examples/fsdp_tp_2d.cpp: 2-D parallelism, FSDP over dp and tensor parallelism over tp, on a
// mesh made by concatenating the dp and tp sub-meshes of a larger mesh.
//
//   ./fsdp_tp_2d                                   # sim: 8 ranks, root mesh (pp=2, dp=2, tp=2)
//   mpirun -n 8 ./fsdp_tp_2d --spmd-backend=mpi    # the same digest
//
// Why concatenate: a training job's root mesh has more dims than FSDP needs (here a pipeline dim
// pp). FSDP+TP wants the 2-D (dp, tp) mesh of the ranks it shares parameters with. PyTorch first
// sliced that out of the root mesh; concatenate({mesh["dp"], mesh["tp"]}) builds it from the two
// 1-D meshes FSDP and TP already hold (pytorch/pytorch "[DeviceMesh][2D] Use concatenate for 2D
// (FSDP+TP)"). The result is one (dp, tp) mesh per pp coordinate: its sibling meshes (Note
// [Sub-meshes and siblings], mesh/device_mesh.h). Each pipeline stage trains its own copy of the
// layer here; examples/pipeline.cpp shows stages passing activations.
//
// The layer y = tanh(x W1) W2. Each parameter is stored as its FSDP shard of its TP block:
//   W1 [H, F]  placements (S(0), S(1)) on (dp, tp): columns over tp (column-parallel), and each
//              column block's rows over dp (FSDP)
//   W2 [F, H]  placements (S(1), S(0)): rows over tp (row-parallel), columns over dp (FSDP)
// A step, written with DTensor ops and autograd:
//   W1 -> (R, S(1)), W2 -> (R, S(0))   all_gather over dp (FSDP: the TP blocks, just before use)
//   y = tanh(x W1) W2 -> (S(0), R)     one all_reduce over tp
//   backward(loss)                      the all_gather's backward is a reduce_scatter over dp: each
//                                       rank gets its FSDP shard's gradient, summed over dp
//   SGD on the shards. Checked against the same step on full tensors.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

constexpr int64_t kBatch = 8;
constexpr int64_t kHidden = 8;
constexpr int64_t kFfn = 16;
constexpr double kLr = 0.1;
constexpr double kTolerance = 1e-5;

int fsdp_tp_2d(World& world) {
  if (world.size() % 4 != 0) {
    throw_error<ConfigError>("fsdp_tp_2d needs a world size divisible by 4, got {}", world.size());
  }
  const int64_t pp = world.size() / 4;
  const DeviceMesh root = init_device_mesh(world, {pp, 2, 2}, {"pp", "dp", "tp"});
  const DeviceMesh mesh = concatenate({root["dp"], root["tp"]});
  // The universe caches communicators by the dim's layout: the concatenated mesh's dp dim is
  // root's dp dim, so FSDP reuses the communicator the root mesh made. (Every process asks: under
  // a real backend, making a communicator is collective.)
  const bool shared_comm = communicator(mesh, "dp") == communicator(root, "dp");
  auto groups_str = [](const std::vector<std::vector<int>>& groups) {
    std::string out;
    for (const std::vector<int>& g : groups) out += (out.empty() ? "" : " ") + ranks_str(g);
    return out;
  };
  if (world.is_coordinator()) {
    fmt::print("fsdp_tp_2d: FSDP over dp and TP over tp, {} ranks, backend {}\n\n", world.size(),
               world.backend_name());
    fmt::print("root mesh, layout {}:\n{}\n", root.layout(), root.to_grid());
    fmt::print("concatenate({{root[\"dp\"], root[\"tp\"]}}) = {}  layout {}\n", mesh,
               mesh.layout());
    fmt::print("  one (dp, tp) mesh per pipeline stage ({} siblings):\n{}\n", mesh.num_siblings(),
               mesh.to_grid());
    fmt::print("  equals root[{{\"dp\", \"tp\"}}]: {}\n", mesh == root[{"dp", "tp"}]);
    fmt::print("  dp groups {}\n  tp groups {}\n", groups_str(mesh.groups("dp")),
               groups_str(mesh.groups("tp")));
    fmt::print("  communicator of dp is the root's: {}\n\n", shared_comm);
  }

  const Placements batch = {Shard{0}, Replicate{}};
  const Placements w1_placements = {Shard{0}, Shard{1}};
  const Placements w2_placements = {Shard{1}, Shard{0}};
  const DTensor x = randn({kBatch, kHidden}, mesh, batch, /*seed=*/11);
  const DTensor target = randn({kBatch, kHidden}, mesh, batch, /*seed=*/12);
  const DTensor w1 = randn({kHidden, kFfn}, mesh, w1_placements, /*seed=*/13) *
                     (1.0 / std::sqrt(static_cast<double>(kHidden)));
  const DTensor w2 = randn({kFfn, kHidden}, mesh, w2_placements, /*seed=*/14) *
                     (1.0 / std::sqrt(static_cast<double>(kFfn)));
  if (world.is_coordinator()) {
    fmt::print("W1 {} {} (each rank stores 1/{} of it):\n{}\n\n", shape_str(w1.shape()),
               to_string(w1.placements()), mesh.size(), visualize_sharding(w1));
    fmt::print("W2 {} {}:\n{}\n\n", shape_str(w2.shape()), to_string(w2.placements()),
               visualize_sharding(w2));
  }

  // FSDP: gather the TP blocks over dp just before use (recorded: backward reduce-scatters).
  DTensor w1_param = w1;
  DTensor w2_param = w2;
  w1_param.requires_grad_();
  w2_param.requires_grad_();
  const DTensor w1_block = w1_param.redistribute({Replicate{}, Shard{1}});
  const DTensor w2_block = w2_param.redistribute({Replicate{}, Shard{0}});
  // TP forward: column-parallel then row-parallel.
  const DTensor a = tanh(matmul(x, w1_block));
  const DTensor y = matmul(a, w2_block).redistribute(batch);
  const double numel = static_cast<double>(kBatch * kHidden);
  const DTensor diff = y - target;
  backward(sum(diff * diff) / numel);
  DTensor w1_new, w2_new;
  {
    NoGradGuard no_grad;
    w1_new = w1_param - w1_param.grad() * kLr;
    w2_new = w2_param - w2_param.grad() * kLr;
  }
  if (world.is_coordinator()) {
    fmt::print("gradients: dW1 {}, dW2 {} (each rank's FSDP shard)\n",
               to_string(w1_param.grad().placements()), to_string(w2_param.grad().placements()));
    fmt::print("collectives of the step:\n{}\n", trace().summary_table());
  }

  // The same step on full tensors, its gradients written out.
  NoGradGuard no_grad;
  const Tensor xf = x.full_tensor();
  const Tensor w1f = w1.full_tensor();
  const Tensor w2f = w2.full_tensor();
  const Tensor af = tanh(matmul(xf, w1f));
  const Tensor yf = matmul(af, w2f);
  const Tensor dyf = (yf - target.full_tensor()) * (2.0 / numel);
  const Tensor dhf = matmul(dyf, w2f.transpose(0, 1)) * (1.0 - af * af);
  const Tensor w1_ref = w1f - matmul(xf.transpose(0, 1), dhf) * kLr;
  const Tensor w2_ref = w2f - matmul(af.transpose(0, 1), dyf) * kLr;
  // A dry run (--spmd-tensors=meta) gathers the same tensors but has no values to compare.
  const bool dry_run = meta_tensors();
  auto error_of = [](const Tensor& got, const Tensor& expected) {
    return got.is_meta() ? std::nan("") : max_abs_diff(got, expected);
  };
  const double err_y = error_of(y.full_tensor(), yf);
  const double err_w1 = error_of(w1_new.full_tensor(), w1_ref);
  const double err_w2 = error_of(w2_new.full_tensor(), w2_ref);
  const double worst = std::max({err_y, err_w1, err_w2});
  const bool pass = dry_run || worst <= kTolerance;
  if (world.is_coordinator() && dry_run) {
    fmt::print("check: skipped (--spmd-tensors=meta: a dry run has no values)\n");
  } else if (world.is_coordinator()) {
    fmt::print("max |error| against full tensors: y {:.3g}, W1 {:.3g}, W2 {:.3g}\n", err_y, err_w1,
               err_w2);
    fmt::print("check: {} (tolerance {:.0e})\n", pass ? "PASS" : "FAIL", kTolerance);
  }
  print_digest(world, {y.to_local(), w1_new.to_local(), w2_new.to_local()});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, fsdp_tp_2d);
}
