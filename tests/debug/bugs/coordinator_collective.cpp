// Logging the mean loss over dp, written inside the coordinator's print block. Only rank 0 issues
// the all_reduce; on a cluster it waits for peers that never call it, and the job hangs. Under sim
// every rank is "the coordinator" at once, so without the divergence check it simply works.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor w = distribute_tensor(randn({8, 8}, 0), mesh, {Replicate{}, Shard{1}});
    DTensor x = distribute_tensor(randn({4, 8}, 1), mesh, {Shard{0}, Replicate{}});
    DTensor loss = sum(matmul(x, w) * matmul(x, w));
    LocalTensor local_loss = loss.redistribute({Partial{}, Replicate{}}).to_local();
    if (world.is_coordinator()) {
      // BUG: a collective only the coordinator issues.
      LocalTensor mean = all_reduce(local_loss, mesh, "dp", ReduceOp::Avg);  // REPORTED
      fmt::print("mean loss {}\n", mean.shards().front().item<double>());
    }
    print_digest(world, {loss.to_local()});  // REPORTED (threads: the other ranks wait here)
  });
}
