// tests/pipeline/runner_test.cpp: run_pipeline (Note [Pipeline runner]) against one device: a chain
// of tanh(x W_s) stages and a squared-error loss, every schedule, with pp alone and with dp beside
// it, under sim, threads and mpirun; the loss and every stage's weight gradient must equal the
// unsplit model's over the whole batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/pipeline/runner.h>
#include <spmd/pipeline/schedule.h>
#include <spmd/tensor/random.h>
#include <spmd/testing.h>
#include <spmd/world/local_ops.h>

namespace spmd::pipeline {
namespace {

constexpr int64_t kBatch = 2;  // rows per microbatch
constexpr int64_t kWidth = 3;

Tensor weight_of(int stage) {
  return randn({kWidth, kWidth}, 1000 + static_cast<uint64_t>(stage)) * 0.7;
}
Tensor input_of(int m) {
  return randn({kBatch, kWidth}, 2000 + static_cast<uint64_t>(m));
}
Tensor target_of(int m) {
  return randn({kBatch, kWidth}, 3000 + static_cast<uint64_t>(m));
}

// The reference: the unsplit model on one device, the loss the mean over microbatches.
struct Reference {
  double loss = 0;
  std::vector<Tensor> grads;
};
Reference reference(int stages, int microbatches) {
  std::vector<Tensor> w;
  for (int s = 0; s < stages; ++s) {
    w.push_back(weight_of(s));
    w.back().requires_grad_(true);
  }
  Tensor total;
  for (int m = 0; m < microbatches; ++m) {
    Tensor h = input_of(m);
    for (int s = 0; s < stages; ++s) h = tanh(matmul(h, w[static_cast<size_t>(s)]));
    const Tensor d = h - target_of(m);
    const Tensor l = sum(d * d) * (1.0 / microbatches);
    total = total.defined() ? total + l : l;
  }
  backward(total);
  Reference r;
  r.loss = total.item<double>();
  for (const Tensor& t : w) r.grads.push_back(t.grad());
  return r;
}

void check_schedule(const World& world, const DeviceMesh& mesh, const Schedule& schedule) {
  const int stages = schedule.stages();
  std::vector<LocalTensor> w(static_cast<size_t>(stages));
  PipelineModel model;
  for (int s = 0; s < stages; ++s) {
    const std::vector<int> ranks = stage_ranks(mesh, "pp", schedule.rank_of_stage(s));
    if (!ranks.empty()) {
      w[static_cast<size_t>(s)] = LocalTensor::from_fn(ranks, [&](int) { return weight_of(s); });
      w[static_cast<size_t>(s)].requires_grad_(true);
    }
    LocalTensor* param = &w[static_cast<size_t>(s)];
    model.stages.push_back(
        PipelineStage{[param](const LocalTensor& x) { return tanh(matmul(x, *param)); },
                      {param},
                      {kBatch, kWidth}});
  }
  model.input = [](int m, const std::vector<int>& ranks) {
    return LocalTensor::from_fn(ranks, [&](int) { return input_of(m); });
  };
  model.loss = [](const LocalTensor& y, int m) {
    const LocalTensor d = y - target_of(m);
    return sum(d * d);
  };
  const PipelineStep step = run_pipeline(model, schedule, mesh, "pp");
  const Reference ref = reference(stages, schedule.microbatches);
  const std::string label = fmt::format("{} on {}", schedule.name, world.backend_name());
  for (int r : step.loss.defined() ? step.loss.ranks() : std::vector<int>{}) {
    EXPECT_NEAR(step.loss.shard(r).item<double>(), ref.loss, 1e-5) << label << " rank " << r;
  }
  for (int s = 0; s < stages; ++s) {
    const LocalTensor& ws = w[static_cast<size_t>(s)];
    if (!ws.defined()) continue;
    for (int r : ws.ranks()) {
      ASSERT_TRUE(ws.grad().defined()) << label << " stage " << s << " rank " << r;
      EXPECT_TRUE(allclose(ws.grad().shard(r), ref.grads[static_cast<size_t>(s)], 1e-4, 1e-6))
          << label << " stage " << s << " rank " << r << ": " << ws.grad().shard(r) << " vs "
          << ref.grads[static_cast<size_t>(s)];
    }
  }
}

SPMD_TEST(PipelineRunner, EveryScheduleMatchesOneDevice) {
  const int n = world.size();
  for (int pp : {2, 4}) {
    if (n % pp != 0) continue;
    DeviceMesh mesh = init_device_mesh(world, {n / pp, pp}, {"dp", "pp"});
    for (const std::string& name : schedule_names()) {
      const int virtual_stages = name == "interleaved" ? 2 : 1;
      check_schedule(world, mesh, make_schedule(name, pp, 4, virtual_stages));
    }
  }
}

// A hand-made schedule that drops a backward is refused before anything runs, at the caller's
// line.
SPMD_TEST(PipelineRunner, DroppedBackwardIsAConfigError) {
  if (world.size() % 2 != 0) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "pp"});
  Schedule s = make_schedule("1f1b", 2, 2);
  auto& rank1 = s.actions[1];
  rank1.erase(std::find(rank1.begin(), rank1.end(), Action{ActionKind::Backward, 1, 1}));
  PipelineModel model;
  testing::expect_throws<ConfigError>([&] { run_pipeline(model, s, mesh, "pp"); },
                                      {"runner_test.cpp:"});
}

// A stage that cuts its input off the graph (a detach) would send the previous stage nothing to
// learn from: an Error naming the stage, not zeros.
SPMD_TEST(PipelineRunner, StageThatDetachesItsInputIsAnError) {
  if (world.size() % 2 != 0) GTEST_SKIP();
  // Under mpi the first stage's wait that can never complete leaves a request MPI cannot cancel,
  // which ends the job (Note [Exit notices]): that is the right outcome, but not a test's.
  if (world.backend_name() == "mpi") GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "pp"});
  const Schedule schedule = make_schedule("1f1b", 2, 2);
  std::vector<LocalTensor> w(2);
  PipelineModel model;
  for (int s = 0; s < 2; ++s) {
    const std::vector<int> ranks = stage_ranks(mesh, "pp", s);
    if (!ranks.empty()) {
      w[static_cast<size_t>(s)] = LocalTensor::from_fn(ranks, [&](int) { return weight_of(s); });
      w[static_cast<size_t>(s)].requires_grad_(true);
    }
    LocalTensor* param = &w[static_cast<size_t>(s)];
    model.stages.push_back(
        PipelineStage{[param](const LocalTensor& x) { return tanh(matmul(x.detach(), *param)); },
                      {param},
                      {kBatch, kWidth}});
  }
  model.input = [](int m, const std::vector<int>& ranks) {
    return LocalTensor::from_fn(ranks, [&](int) { return input_of(m); });
  };
  model.loss = [](const LocalTensor& y, int) { return sum(y * y); };
  // Only the last stage's ranks see it; the first stage's then wait for a gradient that never
  // comes (threads: reported as the other rank having finished).
  if (!stage_ranks(mesh, "pp", 1).empty()) {
    testing::expect_throws<Error>([&] { run_pipeline(model, schedule, mesh, "pp"); },
                                  {"does not depend on its input", "stage 1"});
    // Under sim the abandoned step left activations in the mailbox: reported (and dropped) when
    // the program ends, here at once.
    if (world.backend_name() == "sim") {
      testing::expect_throws<CommError>([&] { world.backend().finish_program(); },
                                        {"nobody received"});
    }
  } else {
    EXPECT_THROW(run_pipeline(model, schedule, mesh, "pp"), Error);
  }
}

}  // namespace
}  // namespace spmd::pipeline
