// Gradient-norm clipping on a tp mesh in local code: a column-sharded weight and a replicated bias.
// The norm must sum the squares of every shard (an all_reduce over tp of the sharded weight's
// part); computed from the local shards only, each tp rank clips by a different factor, and the
// bias, meant to be replicated, differs per rank after the update.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
    LocalTensor x = distribute_tensor(randn({4, 8}, 0), mesh, {Replicate{}}).to_local();
    LocalTensor w = distribute_tensor(randn({8, 16}, 1), mesh, {Shard{1}}).to_local();
    LocalTensor b = distribute_tensor(randn({4, 8}, 2), mesh, {Replicate{}}).to_local();
    w.requires_grad_();
    b.requires_grad_();
    LocalTensor h = matmul(x, w);
    backward(sum(h * h) + sum(x * b));
    LocalTensor gw = w.grad();
    LocalTensor gb = all_reduce(b.grad(), mesh, "tp");
    // BUG: sum(gw * gw) must be all_reduced over tp: each rank sees only its shard's part.
    LocalTensor norm = sqrt(sum(gw * gw) + sum(gb * gb));
    LocalTensor clip = 1.0 / (norm + 1e-6);
    NoGradGuard no_grad;
    LocalTensor b_new = b - gb * clip * 0.1;                         // REPORTED
    DTensor bias = DTensor::from_local(b_new, mesh, {Replicate{}});  // REPORTED
    print_digest(world, {bias.to_local(), w - gw * clip * 0.1});
  });
}
