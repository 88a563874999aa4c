// A MoE layer's shared expert on a tp mesh, in local code: the tokens are replicated over tp
// (to_local with grad_placements Partial: their gradient is pending a tp sum, reduced once where
// the tokens became replicated), the shared expert runs on every tp rank with replicated weights,
// and its output goes back to DTensor as Replicate. With from_local's default grad_placements the
// backward all-reduces the shared expert's gradient over tp here, and it is reduced again
// upstream (torchtitan#2416; the fix is grad_placements={Partial{}}).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
    DTensor h = distribute_tensor(randn({4, 8}, 0), mesh, {Replicate{}});
    h.requires_grad_();
    DTensor w_shared = distribute_tensor(randn({8, 8}, 1), mesh, {Replicate{}});
    LocalTensor tokens = h.to_local(Placements{Partial{}});
    LocalTensor shared = relu(matmul(tokens, w_shared.to_local()));
    // BUG: grad_placements={Partial{}} is missing.
    DTensor out = DTensor::from_local(shared, mesh, {Replicate{}});  // REPORTED
    backward(sum(out));
    print_digest(world, {h.grad().to_local()});
  });
}
