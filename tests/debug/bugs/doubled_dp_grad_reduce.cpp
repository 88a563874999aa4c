// Data parallel in local code: each dp rank's weight gradient is averaged over dp by a gradient
// hook, and the training loop averages it again before the update (the hook and the loop were
// written by two people). The second reduction is of a value already identical on every rank;
// with Avg the numbers even stay right, until someone switches the loop to Sum.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    LocalTensor w = distribute_tensor(randn({8, 4}, 0), mesh, {Replicate{}}).to_local();
    LocalTensor x = distribute_tensor(randn({16, 8}, 1), mesh, {Shard{0}}).to_local();
    w.requires_grad_();
    LocalTensor y = matmul(x, w);
    backward(sum(y * y) * 0.5);
    LocalTensor grad = all_reduce(w.grad(), mesh, "dp", ReduceOp::Avg);  // the gradient hook
    // BUG: the loop reduces the hook's result again.
    grad = all_reduce(grad, mesh, "dp", ReduceOp::Avg);  // REPORTED
    NoGradGuard no_grad;
    print_digest(world, {w - grad * 0.1});
  });
}
