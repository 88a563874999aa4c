// Sequence parallelism: the activations are split over tp by sequence position and the RMSNorm
// gain is replicated, so each tp rank's gain gradient is a part of a sum over every position
// (Megatron's sequence-parallel gradient reduction). Here it is averaged over tp instead of
// summed: the SPMD types accept it (an Avg all_reduce also gives every rank the same value), the
// gain just learns tp times too slowly. On one device there is nothing to reduce.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
    DTensor x = distribute_tensor(randn({8, 16}, 3), mesh, {Replicate{}, Shard{0}});
    DTensor gain = distribute_tensor(ones({16}), mesh, {Replicate{}, Replicate{}});
    for (int step = 0; step < 2; ++step) {
      DTensor rms = sqrt(mean(x * x, {1}, /*keepdim=*/true) + 1e-6);
      DTensor xhat = x / rms;  // loss = sum(xhat * gain): the gain's gradient is sum(xhat, rows)
      LocalTensor dgain = sum(xhat.to_local(), {0});
      // BUG: Avg where the sequence-parallel gradient needs Sum.
      dgain = all_reduce(dgain, mesh, "tp", ReduceOp::Avg);
      gain = DTensor::from_local(gain.to_local() - dgain * 0.01, mesh,  // REPORTED
                                 {Replicate{}, Replicate{}});
    }
    print_digest(world, {gain.to_local()});
  });
}
