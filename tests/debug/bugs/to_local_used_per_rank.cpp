// A replicated weight taken into local code with to_local() and multiplied by each rank's own
// batch shard: the weight's gradient is each rank's term of a sum over dp, but to_local's default
// grad_placements (the DTensor's own, Replicate) claim it arrives identical on every rank, so
// w.grad() is a "Replicate" DTensor whose pieces differ and each replica steps differently
// (pytorch/pytorch#2387's class; the fix is to_local(Placements{Partial{}})).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
    DTensor w = distribute_tensor(randn({8, 4}, 0), mesh, {Replicate{}});
    w.requires_grad_();
    DTensor x = distribute_tensor(randn({16, 8}, 1), mesh, {Shard{0}});
    // BUG: the gradient of the weight is a pending dp sum; grad_placements {Partial{}} is missing.
    LocalTensor w_local = w.to_local();             // REPORTED
    LocalTensor y = matmul(x.to_local(), w_local);  // REPORTED
    DTensor out = DTensor::from_local(y, mesh, {Shard{0}});
    backward(sum(out * out));
    SGD opt({&w}, {.lr = 0.01});
    opt.step();
    print_digest(world, {w.to_local()});
  });
}
