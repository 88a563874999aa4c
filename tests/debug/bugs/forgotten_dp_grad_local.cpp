// Data parallel in local code: each dp rank computes the loss of its own batch against a weight
// replicated over dp, and updates the weight with its gradient. The gradient is each rank's share
// of a pending dp sum; the all_reduce over dp is missing, so the replicas drift apart.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    LocalTensor w = distribute_tensor(randn({8, 4}, 0), mesh, {Replicate{}}).to_local();
    LocalTensor x = distribute_tensor(randn({16, 8}, 1), mesh, {Shard{0}}).to_local();
    for (int step = 0; step < 2; ++step) {
      LocalTensor leaf = w.detach();
      leaf.requires_grad_();
      LocalTensor y = matmul(x, leaf);
      backward(sum(y * y) * 0.5);
      LocalTensor grad = leaf.grad();
      // BUG: grad = all_reduce(grad, mesh, "dp", ReduceOp::Avg) is missing.
      NoGradGuard no_grad;
      w = w - grad * 0.1;  // REPORTED
    }
    print_digest(world, {w});
  });
}
