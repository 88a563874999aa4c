// Sequence parallel RMSNorm in local code on (dp, tp): the activations are sharded over the
// sequence on tp and over the batch on dp; the norm gain is replicated on both. Its gradient is a
// pending sum over dp and over tp; only the dp reduction is done, so each tp rank updates the gain
// with the gradient of its own sequence shard (Megatron's sequence-parallel norm weights).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor gain = distribute_tensor(ones({8}), mesh, {Replicate{}, Replicate{}}).to_local();
    LocalTensor x = distribute_tensor(randn({2, 16, 8}, 1), mesh, {Shard{0}, Shard{1}}).to_local();
    gain.requires_grad_();
    LocalTensor rms = sqrt(sum(x * x, {2}, true) * (1.0 / 8) + 1e-6);
    LocalTensor y = x / rms * gain;
    backward(sum(y * y) * 0.5);
    LocalTensor grad = all_reduce(gain.grad(), mesh, "dp", ReduceOp::Avg);
    // BUG: grad = all_reduce(grad, mesh, "tp") is missing.
    NoGradGuard no_grad;
    LocalTensor updated = gain - grad * 0.1;  // REPORTED
    print_digest(world, {updated});
  });
}
