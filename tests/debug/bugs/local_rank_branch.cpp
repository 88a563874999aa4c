// The first tp rank of each group is meant to add the bias before the tp sum; the author put the
// all_reduce inside the branch too. On a cluster the other tp ranks never join it.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor partial = LocalTensor::from_fn(world, [](int r) { return full({4}, r); });
    LocalTensor bias = LocalTensor::replicate(world, ones({4}));
    if (mesh.local_rank("tp") == 0) {  // REPORTED (sim: the branch differs between ranks)
      partial = partial + bias;
      partial = all_reduce(partial, mesh, "tp");  // REPORTED (threads) BUG: inside the branch
    }
    print_digest(world, {partial});
  });
}
