// A hand-edited 1F1B schedule (a cool-down loop one short) that never runs the last microbatch's
// backward on the last stage: that microbatch's gradients would be missing from every stage's
// weights. run_pipeline validates the schedule before anything runs.
#include <spmd/spmd.h>

#include <algorithm>

using namespace spmd;
using namespace spmd::pipeline;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "pp"});
    Schedule schedule = make_schedule("1f1b", 2, 4);
    // BUG: the last stage's cool-down drops B(1, 3).
    std::vector<Action>& last = schedule.actions[1];
    last.erase(std::find(last.begin(), last.end(), Action{ActionKind::Backward, 1, 3}));
    std::vector<LocalTensor> w(2);
    PipelineModel model;
    for (int s = 0; s < 2; ++s) {
      const std::vector<int> ranks = stage_ranks(mesh, "pp", s);
      if (!ranks.empty()) {
        w[s] = LocalTensor::from_fn(ranks, [&](int) { return randn({4, 4}, 10 + s); });
        w[s].requires_grad_(true);
      }
      LocalTensor* param = &w[s];
      model.stages.push_back(
          {[param](const LocalTensor& x) { return tanh(matmul(x, *param)); }, {param}, {2, 4}});
    }
    model.input = [](int m, const std::vector<int>& ranks) {
      return LocalTensor::from_fn(ranks, [&](int) { return randn({2, 4}, 100 + m); });
    };
    model.loss = [](const LocalTensor& y, int) { return sum(y * y); };
    run_pipeline(model, schedule, mesh, "pp");  // REPORTED
    LocalTensor norms = LocalTensor::from_fn(world, [&](int r) {
      for (const LocalTensor& t : w) {
        if (t.defined() && t.grad().defined() && t.ranks().front() <= r && r <= t.ranks().back())
          return sum(t.grad().shard(r) * t.grad().shard(r));
      }
      return zeros({});
    });
    print_digest(world, {norms});
  });
}
