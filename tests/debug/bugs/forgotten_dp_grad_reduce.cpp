// A column-parallel linear layer on (dp, tp), trained with a hand-written backward over the local
// pieces. Each dp rank computes the weight gradient from its own batch; it must be averaged over
// dp before the update. The all_reduce is missing, so the dp replicas of the weight drift apart.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor w = distribute_tensor(randn({16, 8}, 0), mesh, {Replicate{}, Shard{1}});
    DTensor x = distribute_tensor(randn({4, 16}, 1), mesh, {Shard{0}, Replicate{}});
    for (int step = 0; step < 2; ++step) {
      DTensor y = matmul(x, w);  // loss = sum(y * y) / 2, so dloss/dy = y
      LocalTensor dw = matmul(transpose(x.to_local(), 0, 1), y.to_local());
      // BUG: dw = all_reduce(dw, mesh, "dp", ReduceOp::Avg) is missing.
      DTensor grad = DTensor::from_local(dw, mesh, {Replicate{}, Shard{1}});  // REPORTED
      w = w - grad * 0.1;
    }
    print_digest(world, {w.to_local()});
  });
}
