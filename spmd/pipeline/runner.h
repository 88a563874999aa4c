// spmd/pipeline/runner.h: running a model cut into stages by a Schedule, over the "pp" dim of a
// mesh, with point-to-point transfers between the stages (Note [Pipeline runner]).
//
//   Schedule s = make_schedule("1f1b", mesh.size("pp"), /*microbatches=*/4);
//   PipelineModel model;
//   model.stages = {{.forward = stage0, .parameters = {&w0}, .input_shape = {b, d}}, ...};
//   model.input = [&](int m, const std::vector<int>& ranks) { return microbatch(m, ranks); };
//   model.loss = [&](const LocalTensor& out, int m) { return mse(out, target(m)); };
//   PipelineStep step = run_pipeline(model, s, mesh, "pp");   // gradients accumulated in w0...
//   step.loss;   // the mean of the microbatches' losses, on the last stage's ranks
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/pipeline/schedule.h>
#include <spmd/world/local_tensor.h>

namespace spmd::pipeline {

// Note [Pipeline runner]
// A model is a chain of stages, stage s's output stage s+1's input; stage s runs on the ranks
// whose coordinate along the pp dim is schedule.rank_of_stage(s) (all their dp, tp, ... ranks at
// once: every LocalTensor a stage sees holds those ranks; under threads and mpi, this process's
// rank when it is one of them). run_pipeline runs the schedule's actions:
//   F(s, m)  the stage's input (model.input for stage 0, else a recv from stage s-1 with tag m,
//            made a leaf), its forward, then either the loss over the microbatch count (last
//            stage) or an isend of the output to stage s+1 with tag m;
//   B(s, m)  backward from the loss, or from the output with the gradient received from stage
//            s+1; the input's gradient is sent to stage s-1; the parameters accumulate theirs;
//   I, W     the same backward split (Note [Partial backward]): I computes only the input's
//            gradient, keeping the graph, and sends it; W computes the parameters' (its graph
//            then released). W recomputes the input gradient's share of the graph: the figure of
//            work is ZB-H1's, not its memory.
// Under sim one program holds every rank, so the actions of all pp ranks run in one order: that
// of the simulated timeline (pipeline/timeline.h), in which every recv comes after its send
// (Note [Point-to-point]: lockstep). Under threads and mpi each process runs its own pp rank's
// list, in the schedule's order, blocking only in recvs. Each action runs inside
// PipelineContextScope(stage, microbatch), so every transfer carries the microbatch it belongs
// to (a stage that receives microbatch i+1 where i was due is a CollectiveMismatchError naming
// both lines) and every collective in the trace says which action issued it; each action is also
// a compute span of the trace (the schedule as it ran: trace summary, Perfetto tracks).
// Before any transfer, every process creates the pp dim's communicator (mpi: MPI_Comm_split over
// every process). The step ends by waiting for every send; a stage whose backward never ran
// (a hand-made schedule validate() lets through cannot have one) is an Error, and so is a stage
// whose output does not depend on its input: no gradient would go back to the stage before.

struct PipelineStage {
  // The stage's computation on one microbatch (LocalTensors over the stage's ranks).
  std::function<LocalTensor(const LocalTensor& input)> forward;
  // Its leaves: they accumulate the gradients of every microbatch.
  std::vector<LocalTensor*> parameters;
  // The shape and dtype of the stage's input (what the previous stage sends); unused for stage 0.
  Shape input_shape;
  DType input_dtype = DType::F32;
};

struct PipelineModel {
  // One per stage: schedule.stages() of them (ranks x virtual stages).
  std::vector<PipelineStage> stages;
  // Microbatch m's input to stage 0, on `ranks` (the first stage's held ranks).
  std::function<LocalTensor(int microbatch, const std::vector<int>& ranks)> input;
  // The last stage's loss on microbatch m: one element per rank.
  std::function<LocalTensor(const LocalTensor& output, int microbatch)> loss;
};

struct PipelineStep {
  // The mean over the microbatches of model.loss, on the last stage's held ranks (undefined on a
  // process that holds none of them).
  LocalTensor loss;
  // The actions this process ran, in the order it ran them.
  std::vector<Action> ran;
  // The schedule it ran.
  Schedule schedule;
  // Dry runs (--spmd-tensors=meta, Note [Dry-run estimates]): per stage, the bytes one
  // microbatch's forward leaves alive for its backward on each of the stage's ranks (the most over
  // the microbatches), and per pp rank the most such bytes it held at once (the in-flight
  // microbatches' activations, as the schedule ran) and how many (stage, microbatch) pairs that
  // was. Empty with real tensors. Measured with the process's shape-only storage, so under sim
  // (one process) with every rank of a stage holding equal shards.
  std::vector<int64_t> activation_bytes;
  std::vector<int64_t> peak_activation_bytes;
  std::vector<int> peak_in_flight;
};

// The held ranks of `mesh` whose coordinate along `pp_dim` is `pp_rank`, ascending.
std::vector<int> stage_ranks(const DeviceMesh& mesh, MeshDim pp_dim, int pp_rank);

// Runs one step of `model` by `schedule` (validated first) over `mesh`'s `pp_dim`, whose size
// must be schedule.ranks. ConfigError for a model that does not fit the schedule (stage count,
// missing functions); the errors of the stages' own code and of the transfers as they come.
PipelineStep run_pipeline(const PipelineModel& model, const Schedule& schedule,
                          const DeviceMesh& mesh, MeshDim pp_dim,
                          SourceLocation loc = SourceLocation::current());

}  // namespace spmd::pipeline
