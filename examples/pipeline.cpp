// examples/pipeline.cpp: pipeline parallelism with spmd::pipeline. A chain of stages, each one
// layer tanh(x W_s), trained one step by a schedule (GPipe, 1F1B, interleaved 1F1B, zero bubble)
// over the pp dim of a (pp, dp) mesh, and checked against the same step on one device.
//
//   ./pipeline                                     # sim: 8 ranks, mesh (pp=4, dp=2), 1F1B
//   ./pipeline --schedule zb --microbatches 8      # any schedule of make_schedule
//   ./pipeline --spmd-backend=threads              # one thread per rank, the same digest
//   mpirun -n 8 ./pipeline --spmd-backend=mpi      # one process per rank, the same digest
//   ./pipeline --spmd-tensors=meta                 # a dry run: the in-flight activations per pp
//                                                  # rank and the pipelined step time
//
// The model is a PipelineModel (pipeline/runner.h): a forward function per stage over its weight,
// the microbatches' inputs and a loss. run_pipeline runs the schedule's actions: under sim every
// pp rank's in the order of the simulated timeline, under threads and mpi each rank its own list;
// activations and input gradients travel by send/recv tagged with the microbatch (Note
// [Point-to-point]). Each dp rank of a stage takes half of every microbatch's rows, so after the
// step each weight's gradient is summed over dp, as data parallelism does. The check compares
// every stage's gradient and the loss with the unsplit model's on full tensors.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

constexpr int64_t kMicrobatchRows = 4;  // split over dp
constexpr int64_t kHidden = 8;
constexpr double kTolerance = 1e-5;

constexpr const char* kUsage =
    "pipeline [--schedule gpipe|1f1b|interleaved|zb] [--microbatches N]   (and the --spmd-* "
    "flags of launch())";

struct Config {
  std::string schedule = "1f1b";
  int microbatches = 4;
};

Config parse_flags(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw_error<ConfigError>("pipeline: {} needs a value\n{}", flag, kUsage);
    const std::string value = argv[++i];
    if (flag == "--schedule") {
      c.schedule = value;
    } else if (flag == "--microbatches") {
      int v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size() || v <= 0 || v > 64) {
        throw_error<ConfigError>("pipeline: --microbatches needs an integer in 1..64, got '{}'",
                                 value);
      }
      c.microbatches = v;
    } else {
      throw_error<ConfigError>("pipeline: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  return c;
}

// Stage s's weight, the same values wherever it is made.
Tensor stage_weight(int64_t stage) {
  return randn({kHidden, kHidden}, /*seed=*/100 + static_cast<uint64_t>(stage)) *
         (1.0 / std::sqrt(static_cast<double>(kHidden)));
}
// Microbatch m's input and target (all its rows).
Tensor microbatch(int64_t m) {
  return randn({kMicrobatchRows, kHidden}, /*seed=*/1000 + static_cast<uint64_t>(m));
}
Tensor target(int64_t m) {
  return randn({kMicrobatchRows, kHidden}, /*seed=*/2000 + static_cast<uint64_t>(m));
}

int pipeline_example(World& world, const Config& config) {
  if (world.size() % 2 != 0) {
    throw_error<ConfigError>("pipeline needs an even world size, got {}", world.size());
  }
  const int64_t dp = world.size() >= 4 ? 2 : 1;
  const int pp = static_cast<int>(world.size() / dp);
  const int virtual_stages = config.schedule == "interleaved" ? 2 : 1;
  const pipeline::Schedule schedule =
      pipeline::make_schedule(config.schedule, pp, config.microbatches, virtual_stages);
  const int stages = schedule.stages();
  const DeviceMesh mesh = init_device_mesh(world, {pp, dp}, {"pp", "dp"});
  const PerRank<int64_t> dp_rank = mesh.local_rank("dp");
  const int64_t rows = kMicrobatchRows / dp;
  const bool dry_run = meta_tensors();
  if (world.is_coordinator()) {
    fmt::print(
        "pipeline: {} stages ({} pp ranks x {} per rank), {} microbatches, {} ranks, "
        "backend {}\n\n{}\n",
        stages, pp, virtual_stages, config.microbatches, world.size(), world.backend_name(),
        mesh.to_grid());
    fmt::print("{}\n", pipeline::picture(pipeline::simulate(schedule)));
  }

  // Each stage's weight on the ranks that run it (under threads and mpi: this rank's stages).
  std::vector<LocalTensor> weights(static_cast<size_t>(stages));
  pipeline::PipelineModel model;
  for (int s = 0; s < stages; ++s) {
    const std::vector<int> ranks = pipeline::stage_ranks(mesh, "pp", schedule.rank_of_stage(s));
    LocalTensor& w = weights[static_cast<size_t>(s)];
    if (!ranks.empty()) {
      w = LocalTensor::from_fn(ranks, [&](int) { return stage_weight(s); });
      w.requires_grad_(true);
    }
    model.stages.push_back(
        {[&w](const LocalTensor& x) { return tanh(matmul(x, w)); }, {&w}, {rows, kHidden}});
  }
  // Each dp rank takes its rows of every microbatch.
  auto rows_of = [&](const Tensor& full, int rank) {
    return full.narrow(0, dp_rank.at(rank) * rows, rows);
  };
  model.input = [&](int m, const std::vector<int>& ranks) {
    return LocalTensor::from_fn(ranks, [&](int r) { return rows_of(microbatch(m), r); });
  };
  model.loss = [&](const LocalTensor& y, int m) {
    const LocalTensor d =
        y - LocalTensor::from_fn(y.ranks(), [&](int r) { return rows_of(target(m), r); });
    return sum(d * d);
  };

  std::optional<DryRun> dry;
  if (dry_run) dry.emplace(world);
  const pipeline::PipelineStep step = pipeline::run_pipeline(model, schedule, mesh, "pp");
  // Data parallelism: each weight's gradient summed over its stage's dp ranks.
  std::vector<LocalTensor> grads(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const LocalTensor& w = weights[static_cast<size_t>(s)];
    if (w.defined()) grads[static_cast<size_t>(s)] = all_reduce(w.grad(), mesh, "dp");
  }
  if (dry_run && world.is_coordinator()) {
    fmt::print("{}\n", dry->report({.pipeline = &step}).table());
  }

  // Check: the loss and every stage's gradient against the unsplit model on full tensors (the
  // loss over the dp halves is the full microbatch's).
  std::vector<Tensor> w_ref;
  for (int s = 0; s < stages; ++s) {
    w_ref.push_back(stage_weight(s));
    w_ref.back().requires_grad_(true);
  }
  Tensor total;
  if (!dry_run) {
    for (int m = 0; m < config.microbatches; ++m) {
      Tensor h = microbatch(m);
      for (const Tensor& w : w_ref) h = tanh(matmul(h, w));
      const Tensor d = h - target(m);
      const Tensor l = sum(d * d) * (1.0 / config.microbatches);
      total = total.defined() ? total + l : l;
    }
    backward(total);
  }
  // Every rank's result: its stages' gradients, in stage order, flattened.
  const LocalTensor mine = LocalTensor::from_fn(world, [&](int rank) {
    std::vector<Tensor> parts;
    for (int s = 0; s < stages; ++s) {
      const LocalTensor& g = grads[static_cast<size_t>(s)];
      if (!g.defined()) continue;
      for (int r : g.ranks()) {
        if (r == rank) parts.push_back(g.shard(r).reshape({-1}));
      }
    }
    return cat(parts, 0);
  });
  const LocalTensor error = LocalTensor::from_fn(world, [&](int rank) {
    if (dry_run) return scalar_tensor(0.0);
    double worst = 0.0;
    for (int s = 0; s < stages; ++s) {
      const LocalTensor& g = grads[static_cast<size_t>(s)];
      if (!g.defined()) continue;
      for (int r : g.ranks()) {
        if (r == rank) worst = std::max(worst, max_abs_diff(g.shard(r), w_ref[s].grad()));
      }
    }
    return scalar_tensor(worst);
  });
  const DeviceMesh everyone = mesh.flatten("all");
  const Tensor reduced =
      all_reduce(error, everyone, "all", ReduceOp::Max).shard(world.held_ranks().front());
  const double worst = dry_run ? std::nan("") : reduced.item<double>();
  const bool pass = dry_run || worst <= kTolerance;
  if (world.is_coordinator()) {
    if (dry_run) {
      fmt::print("check: skipped (--spmd-tensors=meta: a dry run has no values)\n");
    } else {
      fmt::print(
          "check: {} (every stage's weight gradient after {} microbatches against one device; "
          "max error {:.3g})\n",
          pass ? "PASS" : "FAIL", config.microbatches, worst);
    }
  }
  print_digest(world, {mine});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [&](World& world) { return pipeline_example(world, parse_flags(argc, argv)); });
}
