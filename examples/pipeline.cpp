// examples/pipeline.cpp: pipeline parallelism. Stages along a pp mesh dim each own one layer;
// microbatches flow stage to stage through permute (send/recv), GPipe-style (forward only).
//
//   ./pipeline                                    # sim: 8 ranks, mesh (pp=4, dp=2)
//   ./pipeline --spmd-backend=threads             # one thread per rank
//   mpirun -n 8 ./pipeline --spmd-backend=mpi     # one process per rank, the same digest
//
// Stage s applies x -> tanh(x W_s). At tick t stage s works on microbatch t - s (when that is a
// microbatch; otherwise it idles: the pipeline bubble), then every stage hands its output to the
// next one with one permute over pp. Each dp rank of a stage takes half of every microbatch.
//
// Per-stage control flow, one program for every backend. A stage's code is a function of the rank
// it runs for: stage_of(rank) picks the layer, the microbatch and whether to idle. Such code runs
// through LocalTensor::from_fn and LocalTensor::map, which call it once per rank the World holds:
// - under threads (and mpi, nccl) a World holds one rank, so each rank thread runs only its own
//   stage's branch, exactly like a hand-written `if (stage == 0) ... else ...` program;
// - under sim the World holds every rank, so the same calls run every stage's branch in turn,
//   one lockstep tick at a time.
// The collectives are called by every rank alike (permute at every tick, all_reduce for the
// verdict): they are the points where the stages meet. Branching directly on world.held_ranks()
// (say, loading weights only for "my" stage) would also work under threads and mpi, but under sim
// there is no single "my" stage; from_fn/map make the per-rank form the natural one for both.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

constexpr int64_t kMicrobatches = 4;
constexpr int64_t kMicrobatchRows = 4;  // split over dp
constexpr int64_t kHidden = 8;
constexpr double kTolerance = 1e-5;

// Stage s's weight, the same values wherever it is made.
Tensor stage_weight(int64_t stage) {
  return randn({kHidden, kHidden}, /*seed=*/100 + static_cast<uint64_t>(stage)) *
         (1.0 / std::sqrt(static_cast<double>(kHidden)));
}

// Microbatch m (all its rows).
Tensor microbatch(int64_t m) {
  return randn_block({kMicrobatches, kMicrobatchRows, kHidden}, /*seed=*/7, {m, 0, 0},
                     {1, kMicrobatchRows, kHidden})
      .reshape({kMicrobatchRows, kHidden});
}

int pipeline_example(World& world) {
  if (world.size() % 2 != 0 || world.size() < 4) {
    throw_error<ConfigError>("pipeline needs an even world size of at least 4, got {}",
                             world.size());
  }
  const int64_t stages = world.size() / 2;
  const DeviceMesh mesh = init_device_mesh(world, {stages, 2}, {"pp", "dp"});
  const PerRank<std::vector<int64_t>> coordinate = mesh.coordinate();
  auto stage_of = [&](int rank) { return coordinate.at(rank)[0]; };
  auto dp_of = [&](int rank) { return coordinate.at(rank)[1]; };
  const int64_t rows = kMicrobatchRows / 2;
  const int64_t ticks = kMicrobatches + stages - 1;

  if (world.is_coordinator()) {
    fmt::print("pipeline: {} stages x {} microbatches, {} ranks, backend {}\n\n", stages,
               kMicrobatches, world.size(), world.backend_name());
    fmt::print("{}\n", mesh.to_grid());
    fmt::print("schedule (microbatch per stage and tick, . = idle):\n{:>6}", "tick");
    for (int64_t s = 0; s < stages; ++s) fmt::print("  stage{}", s);
    fmt::print("\n");
    for (int64_t t = 0; t < ticks; ++t) {
      fmt::print("{:>6}", t);
      for (int64_t s = 0; s < stages; ++s) {
        const int64_t m = t - s;
        fmt::print("{:>8}", m >= 0 && m < kMicrobatches ? fmt::format("m{}", m) : ".");
      }
      fmt::print("\n");
    }
    fmt::print("bubble: {} of {} stage-ticks idle\n\n", stages * ticks - stages * kMicrobatches,
               stages * ticks);
  }

  // Each rank holds its own stage's layer.
  const LocalTensor weight =
      LocalTensor::from_fn(world, [&](int rank) { return stage_weight(stage_of(rank)); });
  // Stage s sends to stage s + 1; the last stage sends nothing.
  std::vector<int> next_stage(static_cast<std::size_t>(stages), -1);
  for (int64_t s = 0; s + 1 < stages; ++s)
    next_stage[static_cast<std::size_t>(s)] = static_cast<int>(s + 1);

  LocalTensor incoming = LocalTensor::from_fn(world, [&](int) { return zeros({rows, kHidden}); });
  std::vector<LocalTensor> outputs;  // the output of every tick, for the last stage's results
  for (int64_t t = 0; t < ticks; ++t) {
    const LocalTensor out = incoming.map([&](int rank, const Tensor& in) {
      const int64_t stage = stage_of(rank);
      const int64_t m = t - stage;
      if (m < 0 || m >= kMicrobatches) return zeros({rows, kHidden});  // bubble
      const Tensor input = stage == 0 ? microbatch(m).narrow(0, dp_of(rank) * rows, rows) : in;
      return tanh(matmul(input, weight.shard(rank)));
    });
    outputs.push_back(out);
    incoming = permute(out, mesh, "pp", next_stage);
  }
  const std::string collectives = trace().summary_table();

  // The last stage's output of microbatch m left it at tick m + stages - 1.
  const LocalTensor result = outputs.back().map([&](int rank, const Tensor&) {
    if (stage_of(rank) != stages - 1) return zeros({0, kHidden});
    std::vector<Tensor> pieces;
    for (int64_t m = 0; m < kMicrobatches; ++m) {
      pieces.push_back(outputs[static_cast<std::size_t>(m + stages - 1)].shard(rank));
    }
    return cat(pieces, 0);
  });

  // Check: every microbatch through every layer on full tensors, compared on the last stage's
  // ranks; the largest error over the world so every process knows the verdict.
  // A dry run (--spmd-tensors=meta) reduces the same errors but has no values to compare.
  const bool dry_run = meta_tensors();
  const LocalTensor error = result.map([&](int rank, const Tensor& got) {
    if (stage_of(rank) != stages - 1 || got.is_meta()) return scalar_tensor(0.0);
    std::vector<Tensor> expected;
    for (int64_t m = 0; m < kMicrobatches; ++m) {
      Tensor x = microbatch(m);
      for (int64_t s = 0; s < stages; ++s) x = tanh(matmul(x, stage_weight(s)));
      expected.push_back(x.narrow(0, dp_of(rank) * rows, rows));
    }
    return scalar_tensor(max_abs_diff(got, cat(expected, 0)));
  });
  const DeviceMesh everyone = mesh.flatten("all");
  const Tensor reduced =
      all_reduce(error, everyone, "all", ReduceOp::Max).shard(world.held_ranks().front());
  const double worst = dry_run ? std::nan("") : reduced.item<double>();
  const bool pass = dry_run || worst <= kTolerance;
  if (world.is_coordinator() && dry_run) {
    fmt::print("collectives:\n{}\n", collectives);
    fmt::print("check: skipped (--spmd-tensors=meta: a dry run has no values)\n");
  } else if (world.is_coordinator()) {
    fmt::print("collectives:\n{}\n", collectives);
    fmt::print(
        "check: {} ({} microbatches through {} stages; max error {:.3g} against full "
        "tensors)\n",
        pass ? "PASS" : "FAIL", kMicrobatches, stages, worst);
  }
  print_digest(world, {result});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, pipeline_example);
}
