// Stage 0 sends two tensors per microbatch, the activation (tag 0) and the attention mask
// (tag 1), both [2, 4]; stage 1 receives them in the other order. NCCL pairs sends and recvs in
// FIFO order and ignores tags: on GPUs the mask becomes the activation, silently.
#include <spmd/spmd.h>

using namespace spmd;

// Every rank's part of the result (zeros on the ranks of the other stage): print_digest is a
// collective every rank makes.
LocalTensor on_every_rank(const World& world, const LocalTensor& part) {
  return LocalTensor::from_fn(world, [&](int r) {
    for (int held : part.defined() ? part.ranks() : std::vector<int>{}) {
      if (held == r) return part.shard(r);
    }
    return zeros({});
  });
}

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "pp"});
    communicator(mesh, "pp");
    const std::vector<int> first = pipeline::stage_ranks(mesh, "pp", 0);
    const std::vector<int> second = pipeline::stage_ranks(mesh, "pp", 1);
    constexpr int64_t kActivation = 0;
    constexpr int64_t kMask = 1;
    if (!first.empty()) {
      LocalTensor h = LocalTensor::from_fn(first, [](int) { return randn({2, 4}, 1); });
      LocalTensor mask = LocalTensor::from_fn(first, [](int) { return ones({2, 4}); });
      send(h, mesh, "pp", 1, kActivation);  // REPORTED (the message paired with the recv)
      send(mask, mesh, "pp", 1, kMask);
    }
    LocalTensor product;
    if (!second.empty()) {
      LocalTensor like = LocalTensor::from_fn(second, [](int) { return zeros({2, 4}); });
      // BUG: the mask is received first.
      LocalTensor mask = recv(like, mesh, "pp", 0, kMask);  // REPORTED
      LocalTensor h = recv(like, mesh, "pp", 0, kActivation);
      product = sum(h * mask);
    }
    print_digest(world, {on_every_rank(world, product)});
  });
}
