// Sequence parallelism: the activations are split over tp by sequence position, the RMSNorm gain
// is replicated. The gain's gradient sums over every position, so each tp rank's local sum is a
// partial sum that must be all-reduced over tp (Megatron's "sequence-parallel gradient"
// reduction). It is forgotten: every tp rank updates the gain with its own part of the gradient.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor x = distribute_tensor(randn({8, 16}, 3), mesh, {Replicate{}, Shard{0}});
    DTensor gain = distribute_tensor(ones({16}), mesh, {Replicate{}, Replicate{}});
    for (int step = 0; step < 2; ++step) {
      DTensor rms = sqrt(mean(x * x, {1}, /*keepdim=*/true) + 1e-6);
      DTensor xhat = x / rms;
      DTensor y = xhat * gain;  // loss = sum(y) so dloss/dy = 1
      LocalTensor dgain = sum(xhat.to_local(), {0});
      // BUG: dgain = all_reduce(dgain, mesh, "tp") is missing.
      gain = DTensor::from_local(gain.to_local() - dgain * 0.01, mesh,  // REPORTED
                                 {Replicate{}, Replicate{}});
      (void)y;
    }
    print_digest(world, {gain.to_local()});
  });
}
