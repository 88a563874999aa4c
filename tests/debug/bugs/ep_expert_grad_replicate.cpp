// Expert parallelism in local code on (dp=2, ep=4): each ep rank holds its expert (the weights
// split by expert over ep, replicated over dp), and the tokens every rank routed to it arrive from
// its own dp group only. The expert's gradient is therefore a pending sum over dp, but the
// to_local call claims Shard(0) over ep and Replicate over dp: each dp replica of an expert would
// step with its own half of the batch, and the replicas drift apart (the experts' gradient reduced
// over the wrong group: it must be reduced over dp, never over ep; the fix is
// grad_placements {Partial{}, Shard{0}}).
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "ep"});
    const int64_t experts = mesh.size("ep");
    DTensor w = distribute_tensor(randn({experts, 8, 4}, 0), mesh, {Replicate{}, Shard{0}});
    w.requires_grad_();
    // The tokens that reached each rank's expert (after the dispatch), different on every rank.
    DTensor tokens = distribute_tensor(randn({2 * experts * 3, 8}, 1), mesh, {Shard{0}, Shard{0}});
    // BUG: the claim should be {Partial{}, Shard{0}}: dp ranks hold different tokens.
    LocalTensor expert = w.to_local(Placements{Replicate{}, Shard{0}});  // REPORTED
    LocalTensor y = matmul(tokens.to_local(), select(expert, 0, 0));     // REPORTED
    DTensor out = DTensor::from_local(y, mesh, {Shard{0}, Shard{0}});
    backward(sum(out * out));
    print_digest(world, {w.grad().to_local()});
  });
}
