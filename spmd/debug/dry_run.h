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
// the most shape-only storage bytes alive at once since the DryRun began or begin_step()
// (tensor/meta.h): exact per rank when every rank's shards have the same shapes (one class),
// otherwise each class's shards counted once (an upper bound for any one rank); activations are
// the peak less the parameters, gradients and optimizer state. With one class the report adds
// what the device holds beyond the tensors (DeviceMemory):
//   allocated = the allocator model's peak of blocks (Note [Allocator model]: each allocation
//               rounded to 512 B) + prefetch, where prefetch = the most bytes
//               MemoryParts::prefetch_gathers consecutive all-gathers on an overlap dim return
//               (FSDP2 gathers the next unit while the current one computes)
//   reserved  = the allocator model's peak of segments + prefetch rounded up to 2 MiB
//               (the model keeps a pool per stream: FSDP's reduced gradients are made on the
//               reduce-scatter stream, whose pool the report shows, Note [Allocation streams])
//   device    = reserved + cuda_context_mib + nccl_mib_per_communicator x communicators, where
//               communicators = the mesh dims the step's collectives ran on
// With a device file that has flash_attention, attention's backward keeps no S^2 buffer (Note
// [Fused attention accounting] in ops/ops.h).
// Time: each DTensor op costs max(flops / (peak flop/s of its dtype x fraction), bytes / (memory
// bandwidth x memory fraction)) on the rank with the largest pieces, with the fraction of its
// kernel class from the device file: attention (scaled_dot_product_attention, attention_probs
// and the ops of attention's backward), matmul (any other op with flops: OpDef::flops, 2*M*N*K
// for matmuls and 4*B*H*Sq*Sk*D for attention) or memory-bound (no flops); an op named in
// DryRunOptions::eager_ops costs its eager kernels' bytes, memory-bound (Note [Eager kernels]).
// With flash_attention, an attention op costs its flops alone (its S^2 tiles stay on chip) and a
// causal one half of them. A collective costs the cost model's estimate on the topology
// (collectives/cost_model.h). The step runs compute and communication as two streams in program
// order: a collective on an overlap dim (DryRunOptions::overlap_dims, the data-parallel dims) runs
// on the communication stream, an all_gather starting as early as the previous one was issued
// (FSDP's prefetch; its consumer, the next op, waits for it), a reduce_scatter or all_reduce when
// issued (the gradient reduction; only the step's end waits for it); any other collective waits for
// both streams and blocks the compute. The step is when both streams are done; the serial sum and
// the communication not hidden are reported beside it, and hfu = flops / (step x the peak of the
// dtype most flops ran in, FP8 GEMMs counting as BF16 as torchtitan's MFU does for Float8 runs);
// mfu is hfu with the flops of ops that ran again in backward (recomputing() in ops/autograd.h:
// activation checkpointing's second forward) left out, the model flops utilisation that torchtitan
// and Megatron-LM report. Pipelines (Note [Pipeline runner]): when the report is given the step
// run_pipeline returned, the ops and collectives that ran inside a pipeline action (their pipeline
// context) are summed per action, averaged per kind (F, B, I, W) and per transfer, and the schedule
// is simulated with those costs (pipeline/timeline.h): the step time is that makespan, bubble
// included, plus what ran outside the actions (the optimizer, the dp gradient reduction): per stage
// mesh (an op by the first rank holding its output, a collective by its first group's first rank),
// the busiest one, since the stages' meshes run theirs at the same time. Memory: the activations
// each stage's forward leaves alive per microbatch and, per pp rank, the most it held at once
// as the schedule ran (run_pipeline measures them under --spmd-tensors=meta).
//
// Note [Eager kernels]
// spmdsim runs rms_norm and rotary_embedding as one kernel each, and a dry run costs each op as
// one kernel: its inputs read and its output written once. A real run in eager PyTorch may run
// such an op as the several kernels of its decomposition, each a round trip through memory:
// at::rms_norm was a CompositeImplicitAutograd function until PyTorch 2.8 (an F32 copy of the
// input, pow, mean, rsqrt, two products, a cast back: 36 bytes per BF16 element forward, 92 in
// backward, against 4 and 12 fused), and Meta's reference RoPE, which torchtitan runs, casts to
// F32 and multiplies complex pairs (20 bytes per BF16 element each way, against 4). A run that
// published its figures with such kernels (torchtitan's Llama 3.1 benchmarks: eager, PyTorch of
// late 2024) is modeled by naming the ops in DryRunOptions::eager_ops (SPMD_EAGER_OPS): those ops,
// their backward entries and their recomputation then cost the bytes their entry's
// EagerKernels::bytes gives (ops/op.h) instead of one kernel's, still memory-bound. Only time
// changes: the decomposition's temporaries live inside the op, and memory keeps the fused op's
// accounting. The formulas sit beside the entries (spmd/ops/nn.cpp, spmd/ops/rope.cpp), with
// the kernel list; bench/peers/eager_kernels.py counts the bytes of the kernels PyTorch itself
// runs for the same decompositions under a dispatch mode, the reference the tests' closed forms
// were checked against.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <optional>

#include <spmd/collectives/trace.h>
#include <spmd/debug/allocator_model.h>
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
  double tflops_f8 = 1978.9;              // FP8 tensor cores (scaled_mm); a device without them
                                          // lists its BF16 rate (an emulated FP8 GEMM)
  double memory_bandwidth_gbps = 3350.0;  // GB/s (1e9 bytes)
  double memory_gib = 80.0;               // device memory, for the report's headroom
  double efficiency = 0.6;                // the fraction of peak kernels reach
  // The fraction of peak each class of kernel reaches (Note [Dry-run estimates]); <= 0: efficiency.
  double achievable_matmul = 0.0;     // of the dtype's peak flop/s
  double achievable_attention = 0.0;  // of the dtype's peak flop/s
  double achievable_memory = 0.0;     // of the memory bandwidth
  // A fused (flash) attention kernel exists: its backward keeps no S^2 buffer and a causal one
  // does half the work (Note [Fused attention accounting] in ops/ops.h).
  bool flash_attention = false;
  double cuda_context_mib = 0.0;           // the CUDA context and kernel images per process
  double nccl_mib_per_communicator = 0.0;  // NCCL's buffers per communicator a rank is in

  // Peak flop/s of `dtype` (not scaled by efficiency).
  double peak_flops(DType dtype) const;
  double matmul_fraction() const { return achievable_matmul > 0 ? achievable_matmul : efficiency; }
  double attention_fraction() const {
    return achievable_attention > 0 ? achievable_attention : efficiency;
  }
  double memory_fraction() const { return achievable_memory > 0 ? achievable_memory : efficiency; }
  // {"name": "...", "tflops": {"f64": 67, "f32": 67, "bf16": 989.4, "f16": 989.4, "int": 67,
  //  "f8": 1978.9},
  //  "memory_bandwidth_gbps": 3350, "memory_gib": 80, "efficiency": 0.6,
  //  "achievable": {"matmul": 0.7, "attention": 0.4, "memory": 0.8}, "flash_attention": true,
  //  "cuda_context_mib": 500, "nccl_mib_per_communicator": 500, "source": "..."}; every key
  // optional (defaults above; "source" is documentation). ConfigError naming the key for bad
  // values or malformed JSON.
  static DeviceSpec from_json(const std::string& text);
  static DeviceSpec load(const std::string& path);
  std::string to_json() const;
};

// How the dry run models the real run's software (Note [Dry-run estimates]).
struct DryRunOptions {
  // The caching allocator's expandable segments (PyTorch's
  // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; Note [Allocator model]).
  bool expandable_segments = false;
  // Mesh dims whose all_gather, reduce_scatter and all_reduce overlap compute: FSDP prefetches
  // its all-gathers and reduces gradients during the backward. Collectives on other dims block.
  std::vector<std::string> overlap_dims = {"dp", "fsdp", "dp_shard", "dp_replicate"};
  // Ops the modeled run computes as PyTorch eager's separate kernels (Note [Eager kernels]):
  // "rms_norm" (before PyTorch 2.8), "rotary_embedding" (Meta's reference code, torchtitan's).
  // Empty: every op is one kernel. The names are the ops' (OpDef::eager's `of`).
  std::vector<std::string> eager_ops;
  // The defaults, with SPMD_ALLOC_CONF=expandable_segments:True (PyTorch's syntax),
  // SPMD_OVERLAP_DIMS=dp,fsdp and SPMD_EAGER_OPS=rms_norm,rotary_embedding (comma lists; empty:
  // none) from the environment; ConfigError for another SPMD_ALLOC_CONF or an op without eager
  // kernels in SPMD_EAGER_OPS.
  static DryRunOptions from_env();
};

// The ops DryRunOptions::eager_ops may name: those whose entries describe their eager kernels.
std::vector<std::string> eager_op_names();

// The DTensors whose pieces the memory report counts.
struct MemoryParts {
  std::vector<const DTensor*> parameters;
  std::vector<const DTensor*> gradients;
  std::vector<const DTensor*> optimizer_state;
  // The step of run_pipeline, when the program pipelines (Note [Dry-run estimates]).
  const pipeline::PipelineStep* pipeline = nullptr;
  // FSDP: the all-gathers of one unit (a block's parameters). The unit after the one computing
  // is gathered ahead (FSDP2's prefetch), so the report adds the most bytes that many
  // consecutive all-gathers on an overlap dim return. 0: no prefetch term.
  int prefetch_gathers = 0;
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
    // What the forward saved: the bytes alive when the step's first backward began less those
    // alive when the step began (the DryRun's construction or begin_step); -1: not known.
    int64_t saved_by_forward = -1;
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
  // What the device holds at the peak beyond the tensors (Note [Dry-run estimates]): shape-only
  // runs whose ranks hold equal shards (peak_exact).
  struct DeviceMemory {
    int64_t tensors_peak = 0;  // the most tensor bytes alive at once (the classes' peak)
    int64_t prefetch = 0;      // FSDP's next unit, gathered ahead
    int64_t allocated = 0;     // the allocator model's peak of blocks handed out
    int64_t reserved = 0;      // its peak of segments, the prefetch added
    // Of reserved: FSDP2's reduce-scatter stream's pool, which the compute stream cannot reuse
    // (Note [Allocation streams] in tensor/meta.h).
    int64_t reduce_scatter_stream = 0;
    int64_t cuda_context = 0;  // the device file's
    int64_t nccl = 0;          // communicators x the device file's buffers per communicator
    int communicators = 0;     // the mesh dims this program's collectives ran on
    int64_t total = 0;         // reserved + CUDA context + NCCL
    int64_t ooms = 0;          // allocations that found no room under the device's memory
    bool expandable_segments = false;
  };
  int world_size = 0;
  std::string backend;
  // DryRunOptions::eager_ops: the ops costed as PyTorch eager's kernels (Note [Eager kernels]).
  std::vector<std::string> eager_ops;
  bool shape_only = false;
  bool peak_exact = false;  // one memory class: the peak is per rank
  std::vector<RankClass> memory;
  std::vector<CommRow> comm;
  int64_t ops = 0;     // DTensor ops recorded
  double flops = 0.0;  // per rank (the largest pieces)
  double compute_us = 0.0;
  double matmul_us = 0.0;     // of compute_us: matmuls
  double attention_us = 0.0;  // attention kernels
  double comm_us = 0.0;
  double serial_us = 0.0;        // compute + communication, nothing overlapped
  double exposed_comm_us = 0.0;  // communication the compute did not hide
  double step_us = 0.0;          // the estimate: overlapped (or the pipelined makespan)
  // Flops done per rank over the step time and the peak of the dtype most flops ran in (the
  // recomputed ops included: hardware flops utilisation).
  double hfu = 0.0;
  // The same without the flops of ops run again in backward by checkpoint_activations (model
  // flops utilisation; a causal fused attention counts the half it computes).
  double model_flops = 0.0;  // per rank: flops less the recomputed ops'
  double mfu = 0.0;
  std::optional<DeviceMemory> device_memory;
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
  explicit DryRun(const World& world, DeviceSpec device = {},
                  DryRunOptions options = DryRunOptions::from_env());
  ~DryRun();
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;

  // Records from here on: forgets the ops, collectives and memory peak recorded so far and
  // restarts the allocator model from the bytes alive now (call it at the start of the step to
  // report, after a first step has created the optimizer's state: the steady state).
  void begin_step();

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
    char kind = 'e';            // 'm': matmul, 'a': attention, 'e': memory-bound
    bool recompute = false;     // ran again in backward (checkpoint_activations)
    int first_rank = -1;        // the smallest rank holding the output (a stage's mesh)
    uint64_t after_events = 0;  // trace events issued before it ran
    std::string file;
    uint32_t line = 0;
    // Note [Pipeline context]: the action it ran in (-1, -1, 0: none).
    int stage = -1;
    int microbatch = -1;
    char phase = 0;
  };

 private:
  // Whether `e` ran on one of DryRunOptions::overlap_dims.
  bool on_overlap_dim(const TraceEvent& e) const;
  // The step with compute and communication as two streams (report() holds mutex_).
  double overlapped_step(const std::vector<TraceEvent>& events) const;
  DryRunReport::DeviceMemory device_memory(int64_t tensors_peak, int prefetch_gathers,
                                           const std::vector<TraceEvent>& events) const;
  // The pipeline's part of report(), which holds mutex_.
  std::optional<DryRunReport::Pipeline> pipeline_estimate(
      const pipeline::PipelineStep& step, const std::vector<TraceEvent>& events) const;

  World world_;
  DeviceSpec device_;
  DryRunOptions options_;
  std::unique_ptr<CachingAllocatorModel> allocator_;
  AllocatorConfig allocator_config_;
  MetaAllocationListener* previous_listener_ = nullptr;
  bool previous_fused_attention_ = false;
  uint64_t first_event_ = 0;
  int64_t step_start_bytes_ = 0;  // shape-only bytes alive when the recorded step began
  bool kept_participants_ = true;
  int observer_ = -1;
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<ComputeOp>> ops_ = std::make_shared<std::vector<ComputeOp>>();
};

}  // namespace spmd
