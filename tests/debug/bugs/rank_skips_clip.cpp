// One rank skips gradient clipping (a rank-local condition: its own loss looked fine), so its
// optimizer step meets the other ranks' clipping collectives. With --spmd-debug=check the debug
// checks' own gathers must not pair the two either: the report is the collective mismatch, naming
// the clipping line and the step line.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    DTensor w = distribute_tensor(randn({8, 4}, 0), mesh, {Shard{0}});
    w.requires_grad_();
    DTensor x = distribute_tensor(randn({16, 8}, 1), mesh, {Replicate{}});
    backward(sum(matmul(x, w)));
    AdamW opt({&w}, {.lr = 0.01});
    // BUG: the last rank decides alone to skip the clipping.
    if (mesh.local_rank("dp") != world.size() - 1) {  // REPORTED
      clip_grad_norm({&w}, 1.0);                      // REPORTED
    }
    opt.step();  // REPORTED
    print_digest(world, {w.to_local()});
  });
}
