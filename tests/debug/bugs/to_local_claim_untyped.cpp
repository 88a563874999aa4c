// A replicated gain applied in local code to per-rank data read in without a World (a rank-list
// LocalTensor: untyped, so the SPMD types cannot see that it differs per rank). to_local's
// default grad_placements claim the gain's gradient arrives Replicate; it differs per rank. The
// data check of --spmd-debug (replicate, types) finds it when the gradient arrives and names the
// to_local's line.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
    DTensor gain = distribute_tensor(ones({8}), mesh, {Replicate{}});
    gain.requires_grad_();
    // Each rank's own activations, as a loader would hand them over.
    LocalTensor h = LocalTensor::from_fn(world.held_ranks(), [](int r) {
      return randn({4, 8}, 10 + static_cast<uint64_t>(r));
    });
    // BUG: the gain's gradient is a pending tp sum; grad_placements {Partial{}} is missing.
    LocalTensor scaled = h * gain.to_local();  // REPORTED
    backward(sum(scaled * scaled));            // each rank's own loss term
    print_digest(world, {gain.grad().to_local()});
  });
}
