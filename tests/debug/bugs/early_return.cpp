// A rank leaves the step early (an "if this rank has no data, skip" written without thinking of
// the collectives below). The others wait in the gradient all_reduce for it.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor grad = LocalTensor::from_fn(world, [](int r) { return full({4}, r); });
    if (world.rank() == 3) return;        // REPORTED (sim: a branch that differs between ranks) BUG
    grad = all_reduce(grad, mesh, "tp");  // REPORTED (threads: the others wait here)
    print_digest(world, {grad});
  });
}
