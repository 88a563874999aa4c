// Data parallel in local code: each rank takes the mean squared error of its own rows and calls
// the result a Partial of the loss. The pieces of a Partial add up: the loss meant is the sum of
// dp local means, dp times the mean over the global batch (the right piece is the local sum
// divided by the global batch size). On one device there is one mean; the loss and every
// gradient are dp times too large here, and training with a tuned learning rate diverges.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    DTensor w = distribute_tensor(randn({16, 4}, 1), mesh, {Replicate{}});
    DTensor x = distribute_tensor(randn({32, 16}, 2), mesh, {Shard{0}});
    DTensor target = distribute_tensor(randn({32, 4}, 3), mesh, {Shard{0}});
    DTensor err = matmul(x, w) - target;
    LocalTensor e = err.to_local();
    // BUG: the mean over the local rows, not the sum over them / the global row count.
    DTensor loss = DTensor::from_local(mean(e * e), mesh, {Partial{}});  // REPORTED
    print_digest(world, {loss.redistribute({Replicate{}}).to_local()});
  });
}
