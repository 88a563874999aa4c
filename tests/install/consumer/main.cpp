// A minimal program against the installed spmdsim: the umbrella header, a tensor op, a mesh and
// a collective under the sim backend. Prints "consumer ok" on success.
#include <spmd/spmd.h>

#include <cstdio>

int main() {
  using namespace spmd;
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  Tensor total = all_reduce(x, mesh, "tp").shard(3);
  // Ranks 2 and 3 form the tp group of rank 3: 2 + 3 = 5.
  if (total.to_vector<float>() != std::vector<float>{5, 5}) return 1;
  std::printf("consumer ok (spmdsim %s)\n", SPMD_VERSION_STRING);
  return 0;
}
