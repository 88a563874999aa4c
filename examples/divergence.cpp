// examples/divergence.cpp: two rank-dependent bugs that hang a real job, caught before they reach
// a cluster.
//
//   ./divergence                          # sim: DivergenceError at the rank-dependent branch
//   ./divergence --spmd-backend=threads   # one thread per rank: CollectiveMismatchError naming
//                                         # both source lines, within a second
//   ./divergence --fixed                  # the bugs off: prints `digest:` under every backend
//
// A data-parallel step: each rank averages its microbatch losses and its gradient over the dp
// group. Two bugs, each of a kind that costs days on a cluster:
//  1. the last rank skips the loss all_reduce (a "the last rank does not log" shortcut), and
//  2. rank 2's data loader gives it one microbatch more, so its loss vector is longer.
// On a cluster the all_reduce of the last rank's gradient meets its peers' loss all_reduce: NCCL
// hangs, or silently reduces the wrong bytes.
//
// Under sim every rank runs in this process and the `if` on a PerRank value cannot take one
// branch for some ranks and another for the rest, so it raises DivergenceError at the branch,
// naming each rank's answer (Note [Divergence checks], world/per_rank.h). Under threads every rank
// runs on its own thread, takes its own branch for real, and the threads backend compares the
// calls that meet in the dp group before running any of them (Note [Threads rendezvous],
// backends/threads/backend.h): the report lists every rank's call with its file:line, so both
// bugs show, the skipped all_reduce's line and the gradient all_reduce the last rank reached.
#include <cstring>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

void step(World& world, bool with_bugs) {
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  const PerRank<int64_t> rank = mesh.local_rank("dp");
  const int64_t last = mesh.size("dp") - 1;

  // Small multiples of 1/2, so every sum is exact in any order and the backends agree bit for bit.
  LocalTensor grad = LocalTensor::from_fn(world, [](int r) {
    return arange(32).reshape({4, 8}) * (0.5 * (r + 1));
  });
  LocalTensor losses = LocalTensor::from_fn(world, [&](int r) {
    const int64_t microbatches = with_bugs && r == 2 ? 2 : 1;  // bug 2
    return full({microbatches}, 0.5 * (r + 1));
  });

  LocalTensor loss = losses;
  if (!with_bugs || rank != last) {  // bug 1: the last rank skips the line below
    loss = all_reduce(losses, mesh, "dp", ReduceOp::Avg);  // the loss all_reduce
  }
  LocalTensor avg_grad = all_reduce(grad, mesh, "dp", ReduceOp::Avg);  // the gradient all_reduce

  if (world.is_coordinator() && loss.shard(0).is_meta()) {
    fmt::print("loss {} and gradient {} (rank 0, shape-only: a dry run has no values)\n",
               shape_str(loss.shard(0).shape()), shape_str(avg_grad.shard(0).shape()));
  } else if (world.is_coordinator()) {
    fmt::print("loss {} and gradient[1, 0] {} (rank 0) over {} ranks, backend {}\n",
               loss.shard(0).to_vector<float>()[0], avg_grad.shard(0).to_vector<float>()[8],
               world.size(), world.backend_name());
  }
  print_digest(world, {loss, avg_grad});
}

}  // namespace

int main(int argc, char** argv) {
  bool with_bugs = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fixed") == 0) with_bugs = false;
  }
  return launch(argc, argv, [&](World& world) { step(world, with_bugs); });
}
