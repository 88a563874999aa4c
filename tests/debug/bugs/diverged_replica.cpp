// One rank's copy of a replicated weight is changed in place (a per-rank write through
// mutable_shard, as a misplaced "load the checkpoint on rank 0 only" would do). The next op is
// correct; check mode must name its input, whose replicas differ, instead of blaming the op.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor w = distribute_tensor(randn({8, 8}, 0), mesh, {Replicate{}, Shard{1}});
    LocalTensor pieces = w.to_local();
    for (int r : world.held_ranks()) {
      if (r == 1) pieces.mutable_shard(r).fill_(0.5);  // BUG: rank 1's replica only
    }
    w = DTensor(pieces, w.spec_ptr());
    DTensor x = distribute_tensor(randn({4, 8}, 1), mesh, {Shard{0}, Replicate{}});
    DTensor y = matmul(x, w);  // REPORTED
    print_digest(world, {y.to_local()});
  });
}
