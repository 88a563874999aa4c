// A hand-written two-stage pipeline in local code whose first stage skips the last microbatch's
// send (an off-by-one in a loop bound). Stage 1's recv waits for it: on a cluster, forever.
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
    communicator(mesh, "pp");  // every process creates the pp communicator
    const std::vector<int> first = pipeline::stage_ranks(mesh, "pp", 0);
    const std::vector<int> second = pipeline::stage_ranks(mesh, "pp", 1);
    constexpr int kMicrobatches = 4;
    LocalTensor total;
    for (int m = 0; m < kMicrobatches; ++m) {
      if (!first.empty()) {
        LocalTensor x = LocalTensor::from_fn(first, [&](int) { return randn({2, 4}, m); });
        // BUG: `m + 1 < kMicrobatches` meant "not past the end", but drops the last send.
        if (m + 1 < kMicrobatches) send(tanh(x), mesh, "pp", /*dst=*/1, /*tag=*/m);
      }
      if (!second.empty()) {
        LocalTensor like = LocalTensor::from_fn(second, [](int) { return zeros({2, 4}); });
        LocalTensor h = recv(like, mesh, "pp", /*src=*/0, /*tag=*/m);  // REPORTED
        total = total.defined() ? total + sum(h) : sum(h);
      }
    }
    print_digest(world, {on_every_rank(world, total)});
  });
}
