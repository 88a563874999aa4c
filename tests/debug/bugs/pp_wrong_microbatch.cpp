// A hand-written pipeline whose stages each wrap their work on a microbatch in a pipeline context
// (what spmd::pipeline's runner does for every action). Stage 0 walks its microbatches in a
// reordered list (meant for a different schedule), so stage 1, expecting microbatch 0, receives
// microbatch 1: the same shape, only wrong numbers without the context.
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
    // BUG: stage 0 uses another order than stage 1's 0, 1, 2, 3.
    const std::vector<int> order = {1, 0, 2, 3};
    if (!first.empty()) {
      for (int m : order) {
        const PipelineContextScope context(/*stage=*/0, m);
        LocalTensor x = LocalTensor::from_fn(first, [&](int) { return randn({2, 4}, m); });
        send(tanh(x), mesh, "pp", 1);  // REPORTED (the message that arrives)
      }
    }
    LocalTensor total;
    if (!second.empty()) {
      for (int m = 0; m < 4; ++m) {
        const PipelineContextScope context(/*stage=*/1, m);
        LocalTensor like = LocalTensor::from_fn(second, [](int) { return zeros({2, 4}); });
        LocalTensor h = recv(like, mesh, "pp", 0);  // REPORTED
        total = total.defined() ? total + sum(h) * (m + 1.0) : sum(h);
      }
    }
    print_digest(world, {on_every_rank(world, total)});
  });
}
