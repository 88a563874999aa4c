// spmd/debug/dry_run.h: what a shape-only dry run (--spmd-tensors=meta) reports: memory per
// rank, the collectives per mesh dim, and an estimated step time (the cost model on the world's
// topology plus a compute roofline on a device), with the estimated timeline as a trace file.
//
//   DryRun dry(world, DeviceSpec::load("machines/h100_sxm.device.json"));  // records from here
//   ... one training step ...
//   DryRunReport r = dry.report({.parameters = params, .gradients = grads,
//                                .optimizer_state = opt.state()});
//   fmt::print("{}", r.table());                  // or r.json()
//   dry.write_timeline("timeline.json");          // the trace schema; opens in Perfetto
//
// Note [Dry-run estimates]
// Memory: parameters, gradients and optimizer state are the bytes of each rank's pieces of the
// given DTensors, exact per rank, grouped into classes of ranks with equal numbers. The peak is
// the most shape-only storage bytes alive at once since the DryRun began (tensor/meta.h): exact
// per rank when every rank's shards have the same shapes (one class), otherwise each class's
// shards counted once (an upper bound for any one rank); activations are the peak less the
// parameters, gradients and optimizer state.
// Time: the ops run in program order, one at a time, nothing overlapped. A collective costs the
// cost model's estimate on the topology (collectives/cost_model.h, recorded in the trace); a
// DTensor op costs max(flops / (peak flop/s of its dtype * efficiency), bytes / (memory
// bandwidth * efficiency)) on the rank with the largest pieces: flops are the op-table entry's
// (OpDef::flops: 2*M*N*K for matmuls and 4*B*H*Sq*Sk*D for attention, 2*B*H*Sq*Sk*D for its
// probabilities), 0 for ops without; bytes are the pieces read and written. The step time is the
// sum.
// Pipelines (Note [Pipeline runner]): when the report is given the step run_pipeline returned,
// the ops and collectives that ran inside a pipeline action (their pipeline context) are summed
// per action, averaged per kind (F, B, I, W) and per transfer, and the schedule is simulated with
// those costs (pipeline/timeline.h): the step time is that makespan, bubble included, plus what
// ran outside the actions (the optimizer, the dp gradient reduction). Memory: the activations
// each stage's forward leaves alive per microbatch and, per pp rank, the most it held at once
// as the schedule ran (run_pipeline measures them under --spmd-tensors=meta).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <optional>

#include <spmd/collectives/trace.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/pipeline/runner.h>
#include <spmd/world/world.h>

namespace spmd {

// A device for the compute roofline. Peak rates are dense (no sparsity).
struct DeviceSpec {
  std::string name = "H100 SXM5 80GB";
  double tflops_f64 = 67.0;               // FP64 tensor cores
  double tflops_f32 = 67.0;               // FP32 (TF32 tensor cores would give 494.7)
  double tflops_bf16 = 989.4;             // BF16 tensor cores
  double tflops_f16 = 989.4;              // FP16 tensor cores
  double tflops_int = 67.0;               // integer and bool elementwise work
  double memory_bandwidth_gbps = 3350.0;  // GB/s (1e9 bytes)
  double memory_gib = 80.0;               // device memory, for the report's headroom
  double efficiency = 0.6;                // the fraction of peak kernels reach

  // Peak flop/s of `dtype` (not scaled by efficiency).
  double peak_flops(DType dtype) const;
  // {"name": "...", "tflops": {"f64": 67, "f32": 67, "bf16": 989.4, "f16": 989.4, "int": 67},
  //  "memory_bandwidth_gbps": 3350, "memory_gib": 80, "efficiency": 0.6}; every key optional
  // (defaults above). ConfigError naming the key for bad values or malformed JSON.
  static DeviceSpec from_json(const std::string& text);
  static DeviceSpec load(const std::string& path);
  std::string to_json() const;
};

// The DTensors whose pieces the memory report counts.
struct MemoryParts {
  std::vector<const DTensor*> parameters;
  std::vector<const DTensor*> gradients;
  std::vector<const DTensor*> optimizer_state;
  // The step of run_pipeline, when the program pipelines (Note [Dry-run estimates]).
  const pipeline::PipelineStep* pipeline = nullptr;
};

struct DryRunReport {
  // Ranks with the same bytes in every column (Note [Dry-run estimates]).
  struct RankClass {
    int64_t ranks = 0;               // how many
    std::vector<int> example_ranks;  // the first few
    int64_t parameters = 0;
    int64_t gradients = 0;
    int64_t optimizer_state = 0;
    int64_t activations = 0;  // at the peak; -1: not known (real tensors)
    int64_t peak = 0;         // -1: not known
  };
  // One (mesh dim, collective) of the recorded step.
  struct CommRow {
    std::string dim_name;
    std::string op;
    int64_t calls = 0;
    int64_t bytes_per_rank = 0;  // input bytes of one participating rank, summed over calls
    double estimate_us = 0.0;
  };
  // The pipelined step (Note [Dry-run estimates]).
  struct Pipeline {
    std::string schedule;
    int ranks = 0;
    int microbatches = 0;
    int virtual_stages = 1;
    // Estimated per action of each kind (0: none ran), and per transfer between stages.
    double forward_us = 0.0;
    double backward_us = 0.0;
    double input_us = 0.0;
    double weight_us = 0.0;
    double transfer_us = 0.0;
    double makespan_us = 0.0;                    // the schedule simulated with those costs
    double bubble_fraction = 0.0;                // idle time over pp ranks x makespan
    double outside_us = 0.0;                     // ops and collectives outside any pipeline action
    std::vector<int64_t> activation_bytes;       // per stage, per microbatch
    std::vector<int64_t> peak_activation_bytes;  // per pp rank
    std::vector<int> peak_in_flight;             // per pp rank
  };
  int world_size = 0;
  std::string backend;
  bool shape_only = false;
  bool peak_exact = false;  // one memory class: the peak is per rank
  std::vector<RankClass> memory;
  std::vector<CommRow> comm;
  int64_t ops = 0;     // DTensor ops recorded
  double flops = 0.0;  // per rank (the largest pieces)
  double compute_us = 0.0;
  double comm_us = 0.0;
  double step_us = 0.0;
  std::optional<Pipeline> pipeline;
  DeviceSpec device;
  std::string topology_json;

  // Aligned text: the memory classes, the collectives per mesh dim, the step time.
  std::string table() const;
  std::string json() const;
};

// Records, from construction on, the DTensor ops (for the compute estimate) and the trace's
// collectives of `world`'s program. Under a world of more than 64 ranks it keeps the trace's
// events without participant lists (Trace::set_keep_participants) while alive.
class DryRun {
 public:
  explicit DryRun(const World& world, DeviceSpec device = {});
  ~DryRun();
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;

  DryRunReport report(const MemoryParts& parts) const;
  // The estimated timeline of the first held rank in the trace schema
  // (collectives/trace_export.h): collectives and compute ops ("cat": the mesh dim or "compute")
  // back to back with their estimated durations; otherData.kind is "estimated_timeline".
  void write_timeline(const std::string& path) const;

  // One recorded DTensor op (public for the implementation's helpers).
  struct ComputeOp {
    std::string op;
    Shape shape;  // the output's largest piece
    DType dtype = DType::F32;
    double flops = 0.0;
    double bytes = 0.0;
    double us = 0.0;
    uint64_t after_events = 0;  // trace events issued before it ran
    std::string file;
    uint32_t line = 0;
    // Note [Pipeline context]: the action it ran in (-1, -1, 0: none).
    int stage = -1;
    int microbatch = -1;
    char phase = 0;
  };

 private:
  // The pipeline's part of report(), which holds mutex_.
  std::optional<DryRunReport::Pipeline> pipeline_estimate(
      const pipeline::PipelineStep& step, const std::vector<TraceEvent>& events) const;

  World world_;
  DeviceSpec device_;
  uint64_t first_event_ = 0;
  bool kept_participants_ = true;
  int observer_ = -1;
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<ComputeOp>> ops_ = std::make_shared<std::vector<ComputeOp>>();
};

}  // namespace spmd
