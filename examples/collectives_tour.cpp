// examples/collectives_tour.cpp: one SPMD program, several collectives, over a 2-D (dp, tp) mesh.
//
//   ./collectives_tour                                   # sim: 8 ranks in this process
//   mpirun -n 8 ./collectives_tour --spmd-backend=mpi    # one rank per process
//
// Both runs print the same lines (rank 0's results, which the coordinator holds under every
// backend) and end with the same `digest:` line, a hash of every rank's results. The data are
// small integers, so every sum is exact in any reduction order and the backends agree bit for bit.
#include <spmd/spmd.h>

using namespace spmd;

namespace {

void tour(World& world) {
  if (world.size() % 2 != 0) {
    throw_error<ConfigError>("collectives_tour needs an even world size, got {}", world.size());
  }
  const int64_t tp = world.size() / 2;
  DeviceMesh mesh = init_device_mesh(world, {2, tp}, {"dp", "tp"});
  auto show = [&](const char* what, const LocalTensor& t) {
    if (world.is_coordinator()) fmt::print("{} (rank 0):\n{}\n\n", what, t.shard(0));
  };
  if (world.is_coordinator()) {
    fmt::print("{} over {} ranks, backend {}\n{}\n\n", mesh, world.size(), world.backend_name(),
               mesh.to_grid());
  }

  // Rank r holds [[10r, 10r+1], [10r+2, 10r+3]].
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return (arange(4) + 10.0 * r).reshape({2, 2});
  });
  show("x", x);

  // Tensor parallel: partial sums of a row-parallel matmul meet in an all_reduce over tp.
  LocalTensor summed = all_reduce(x, mesh, "tp");
  show("all_reduce(x, tp)", summed);

  // Data parallel: each dp replica's shards side by side, and the average of the replicas.
  LocalTensor gathered = all_gather(x, mesh, "dp", /*gather_dim=*/1);
  show("all_gather(x, dp, gather_dim=1)", gathered);
  LocalTensor averaged = all_reduce(x, mesh, "dp", ReduceOp::Avg);
  show("all_reduce(x, dp, avg)", averaged);

  // Sequence parallel: rows [tp, 3] reduced and scattered, one row back per tp rank, then the
  // rows gathered again.
  LocalTensor rows = LocalTensor::from_fn(world, [&](int r) {
    return full({tp, 3}, r % 3) + arange(3);
  });
  LocalTensor mine = reduce_scatter(rows, mesh, "tp", ReduceOp::Sum, /*scatter_dim=*/0);
  show("reduce_scatter(rows, tp)", mine);
  LocalTensor again = all_gather(mine, mesh, "tp");
  show("all_gather(that, tp)", again);

  // Expert parallel: each tp rank sends row j of its [tp, 2] block to tp rank j.
  LocalTensor tokens = LocalTensor::from_fn(world, [&](int r) {
    return (arange(2 * tp) + 100.0 * r).reshape({tp, 2});
  });
  LocalTensor routed = all_to_all(tokens, mesh, "tp");
  show("all_to_all(tokens, tp)", routed);

  // Pipeline parallel: stage i hands its activations to stage i+1 along tp; the last gets none.
  std::vector<int> next(static_cast<size_t>(tp), -1);
  for (int64_t i = 0; i + 1 < tp; ++i) next[static_cast<size_t>(i)] = static_cast<int>(i + 1);
  LocalTensor handed = permute(x, mesh, "tp", next);
  show("permute(x, tp, i -> i+1)", handed);

  // Rooted collectives: tp rank 1's shard to everyone, and the dp maximum to dp rank 0.
  LocalTensor from_one = broadcast(x, mesh, "tp", /*src=*/1);
  show("broadcast(x, tp, src=1)", from_one);
  LocalTensor peak = reduce(x, mesh, "dp", ReduceOp::Max, /*dst=*/0);
  show("reduce(x, dp, max, dst=0)", peak);

  barrier(mesh);
  print_digest(world, {summed, gathered, averaged, mine, again, routed, handed, from_one, peak});
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, tour);
}
