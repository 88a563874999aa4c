// A gain replicated over dp and tp, applied to activations sharded over both; its gradient is
// summed over tp and averaged over dp, then summed over tp a second time (a gradient hook and the
// optimizer both reduce it), which multiplies it by the tp size.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor g = distribute_tensor(randn({16}, 0), mesh, {Replicate{}, Replicate{}}).to_local();
    LocalTensor x = distribute_tensor(randn({32, 16}, 1), mesh, {Shard{0}, Shard{0}}).to_local();
    g.requires_grad_();
    LocalTensor y = x * g;
    backward(sum(y * y) * 0.5);
    LocalTensor grad = all_reduce(g.grad(), mesh, "tp");  // the gradient hook
    grad = all_reduce(grad, mesh, "dp", ReduceOp::Avg);
    // BUG: the optimizer reduces over tp again.
    grad = all_reduce(grad, mesh, "tp");  // REPORTED
    NoGradGuard no_grad;
    print_digest(world, {g - grad * 0.1});
  });
}
