// A mixture-of-experts router in local code on (dp, tp) with sequence parallelism: the tokens are
// split over the batch on dp and over the sequence on tp, and the router is replicated on both.
// Its gradient is a pending sum over dp and over tp (every rank routed its own tokens); the
// optimizer step reduces it over dp only, so each tp rank's router steps with its own tokens'
// gradient and the router's copies diverge across tp: from then on the tp ranks send the same
// token to different experts.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
    LocalTensor router =
        distribute_tensor(randn({8, 4}, 0), mesh, replicate_placements(mesh)).to_local();
    LocalTensor x = distribute_tensor(randn({2, 16, 8}, 1), mesh, {Shard{0}, Shard{1}}).to_local();
    router.requires_grad_();
    LocalTensor probs = softmax(matmul(x, router), -1);
    backward(sum(probs * probs));
    LocalTensor grad = all_reduce(router.grad(), mesh, "dp", ReduceOp::Avg);
    // BUG: grad = all_reduce(grad, mesh, "tp") is missing.
    NoGradGuard no_grad;
    LocalTensor updated = router - grad * 0.1;  // REPORTED
    print_digest(world, {updated});
  });
}
