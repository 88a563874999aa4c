// Sequence-parallel attention in local code on (dp, tp): the key projection's weight is replicated
// on both dims and applied to activations sharded over the batch (dp) and the sequence (tp). Its
// gradient is pending a sum over both; grad_placements say Partial over dp but Replicate over tp,
// so the tp reduction never happens and each tp rank keeps the gradient of its own sequence shard
// (torchtitan#4054's class; the fix is grad_placements {Partial{}, Partial{}}).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    DTensor wk = distribute_tensor(randn({8, 8}, 0), mesh, {Replicate{}, Replicate{}});
    wk.requires_grad_();
    DTensor x = distribute_tensor(randn({2, 16, 8}, 1), mesh, {Shard{0}, Shard{1}});
    // BUG: tp must be Partial too.
    LocalTensor wk_local = wk.to_local(Placements{Partial{}, Replicate{}});  // REPORTED
    LocalTensor k = matmul(x.to_local(), wk_local);                          // REPORTED
    DTensor keys = DTensor::from_local(k, mesh, {Shard{0}, Shard{1}});
    backward(sum(keys * keys));
    print_digest(world, {wk.grad().to_local()});
  });
}
