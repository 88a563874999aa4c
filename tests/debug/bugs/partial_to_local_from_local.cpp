// A row-parallel matmul's output (Partial over tp) taken to local code to be scaled, then wrapped
// back as Replicate: to_local + from_local on a Partial drops the pending sum, each rank keeps its
// own partial as if it were the whole (pytorch#172932).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
    DTensor a = distribute_tensor(randn({4, 16}, 0), mesh, {Shard{1}});
    DTensor b = distribute_tensor(randn({16, 4}, 1), mesh, {Shard{0}});
    DTensor y = matmul(a, b);  // P(sum)
    LocalTensor scaled = y.to_local() * 0.5;
    // BUG: the placement must stay Partial (or all_reduce the pieces first).
    DTensor back = DTensor::from_local(scaled, mesh, {Replicate{}});  // REPORTED
    print_digest(world, {back.to_local()});
  });
}
