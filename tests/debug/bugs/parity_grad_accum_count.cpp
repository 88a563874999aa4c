// Gradient accumulation over 4 microbatches on a data-parallel mesh: each microbatch's loss is
// the mean over its global rows, so its DTensor gradient is already averaged over dp; the loop
// still divides the accumulated gradient by microbatches x dp (the dp division of a hand-written
// DDP, kept when moving to DTensor). On one device dp is 1 and the numbers are right, so the run
// on 8 ranks takes steps 8 times too small and no check but the parity run sees it.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    const int64_t microbatches = 4;
    DTensor w = distribute_tensor(randn({16, 4}, 1), mesh, {Replicate{}});
    w.requires_grad_();
    for (int64_t mb = 0; mb < microbatches; ++mb) {
      DTensor x =
          distribute_tensor(randn({32, 16}, 10 + static_cast<uint64_t>(mb)), mesh, {Shard{0}});
      DTensor y = matmul(x, w);
      backward(mean(y * y));
    }
    // BUG: the gradient is already a dp mean; only the microbatch count divides it.
    DTensor g = w.grad() * (1.0 / static_cast<double>(microbatches * mesh.size("dp")));  // REPORTED
    NoGradGuard no_grad;
    DTensor updated = w - g * 0.1;
    print_digest(world, {updated.to_local()});
  });
}
