// A row-parallel linear layer written with local code: x is split by columns and W by rows over
// tp, so each rank's product is a partial sum. from_local claims Replicate, as if the pieces were
// already summed; the result is wrong by a factor and differs between tp ranks.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor x = distribute_tensor(randn({4, 16}, 1), mesh, {Replicate{}, Shard{1}});
    DTensor w = distribute_tensor(randn({16, 8}, 2), mesh, {Replicate{}, Shard{0}});
    LocalTensor partial = matmul(x.to_local(), w.to_local());
    // BUG: the pieces are partial sums over tp: Partial(), not Replicate.
    DTensor y = DTensor::from_local(partial, mesh, {Replicate{}, Replicate{}});  // REPORTED
    DTensor z = relu(y);
    print_digest(world, {z.to_local()});
  });
}
