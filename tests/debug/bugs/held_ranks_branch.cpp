// "My rank" taken from world.held_ranks()[0]. Under threads, mpi and nccl that is the rank; under
// sim every simulated rank reads 0, so the branch silently follows rank 0's path on every rank and
// the sim run looks fine. World::rank() is the per-rank value to use. Caught under threads.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor grad = LocalTensor::from_fn(world, [](int r) { return full({4}, r); });
    const int me = world.held_ranks()[0];  // BUG: not "my rank" under sim
    if (me % 4 != 0) {
      grad = all_reduce(grad, mesh, "tp");  // REPORTED
    }
    grad = all_reduce(grad, mesh, "dp");  // REPORTED
    print_digest(world, {grad});
  });
}
