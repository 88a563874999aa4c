// spmd/debug/dry_run.cpp: the dry-run recorder, its report and its estimated timeline.
#include <spmd/debug/dry_run.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/ops/ops.h>
#include <spmd/pipeline/timeline.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/topology.h>

namespace spmd {
namespace {

constexpr int kParticipantListLimit = 64;

// A JSON value for a message: scalars as written (long ones cut), containers by their type and
// size (dumping one would recurse as deep as it nests).
std::string shown(const nlohmann::json& v) {
  if (v.is_structured()) return fmt::format("an {} of {} items", v.type_name(), v.size());
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 80) + "..." : text;
}

// `prefix` names the enclosing object in messages ("tflops.").
double positive(const nlohmann::json& j, const char* key, double fallback,
                const char* prefix = "") {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || v.get<double>() <= 0) {
    throw_error<ConfigError>("DeviceSpec: '{}{}' must be a positive number, got {}", prefix, key,
                             shown(v));
  }
  return v.get<double>();
}

// The largest piece a rank holds of `t` (the slowest rank's work).
const Tensor& largest_piece(const DTensor& t) {
  const std::vector<Tensor>& pieces = t.local().class_shards();
  return *std::max_element(pieces.begin(), pieces.end(),
                           [](const Tensor& a, const Tensor& b) { return a.numel() < b.numel(); });
}

// How many ranks split the op's work: the product of the mesh dims the output is Shard or
// Partial on (Replicate dims repeat the work on every rank).
double work_split(const DTensor& out) {
  double split = 1.0;
  const std::vector<int64_t> shape = out.mesh().shape();
  for (size_t i = 0; i < out.placements().size(); ++i) {
    if (!is_replicate(out.placements()[i])) split *= static_cast<double>(shape[i]);
  }
  return split;
}

// Global flops of the op (Note [Dry-run estimates]): its entry's count on the full shapes.
double global_flops(const OpEvent& e) {
  if (e.def->flops == nullptr) return 0.0;
  std::vector<InputMeta> inputs;
  inputs.reserve(e.inputs.size());
  for (const DTensor* in : e.inputs) inputs.push_back(InputMeta{&in->shape(), in->dtype()});
  return e.def->flops(inputs, OpMeta{e.output.shape(), e.output.dtype()});
}

std::string bytes_text(int64_t bytes) {
  if (bytes < 0) return "n/a";
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string time_text(double us) {
  if (us >= 1e6) return fmt::format("{:.3f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

// "0-3,...": the class's first ranks, with "..." when it has more.
std::string example_ranks_text(const DryRunReport::RankClass& c) {
  const bool more = c.ranks > static_cast<int64_t>(c.example_ranks.size());
  return ranks_compact(c.example_ranks) + (more ? ",..." : "");
}

// Per held rank (by position), the bytes of its pieces of `tensors`.
std::vector<int64_t> bytes_per_rank(const std::vector<const DTensor*>& tensors, size_t ranks,
                                    const std::vector<int>& held) {
  std::vector<int64_t> out(ranks, 0);
  for (const DTensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    const LocalTensor& local = t->local();
    if (local.ranks() == held) {
      for (size_t i = 0; i < ranks; ++i) out[i] += static_cast<int64_t>(local.shard_at(i).nbytes());
    } else {
      for (size_t i = 0; i < ranks; ++i) {
        if (local.holds(held[i])) out[i] += static_cast<int64_t>(local.shard(held[i]).nbytes());
      }
    }
  }
  return out;
}

}  // namespace

double DeviceSpec::peak_flops(DType dtype) const {
  switch (dtype) {
    case DType::F64:
      return tflops_f64 * 1e12;
    case DType::F32:
      return tflops_f32 * 1e12;
    case DType::BF16:
      return tflops_bf16 * 1e12;
    case DType::F16:
      return tflops_f16 * 1e12;
    case DType::F8E4M3FN:
    case DType::F8E5M2:
      return tflops_f8 * 1e12;
    default:
      return tflops_int * 1e12;
  }
}

DeviceSpec DeviceSpec::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error<ConfigError>("DeviceSpec: malformed JSON: {}", e.what());
  }
  if (!j.is_object()) {
    throw_error<ConfigError>("DeviceSpec: expected a JSON object, got {}", shown(j));
  }
  DeviceSpec d;
  for (const auto& [key, value] : j.items()) {
    if (key != "name" && key != "tflops" && key != "memory_bandwidth_gbps" && key != "memory_gib" &&
        key != "efficiency" && key != "achievable" && key != "flash_attention" &&
        key != "cuda_context_mib" && key != "nccl_mib_per_communicator" && key != "source") {
      throw_error<ConfigError>(
          "DeviceSpec: unknown key '{}' (expected name, tflops, memory_bandwidth_gbps, "
          "memory_gib, efficiency, achievable, flash_attention, cuda_context_mib, "
          "nccl_mib_per_communicator, source)",
          key);
    }
  }
  if (j.contains("name")) {
    if (!j.at("name").is_string()) {
      throw_error<ConfigError>("DeviceSpec: 'name' must be a string, got {}", shown(j.at("name")));
    }
    d.name = j.at("name").get<std::string>();
  }
  if (j.contains("tflops")) {
    const auto& t = j.at("tflops");
    if (!t.is_object()) {
      throw_error<ConfigError>("DeviceSpec: 'tflops' must be an object of dtype: TFLOP/s, got {}",
                               shown(t));
    }
    for (const auto& [key, value] : t.items()) {
      if (key != "f64" && key != "f32" && key != "bf16" && key != "f16" && key != "int" &&
          key != "f8") {
        throw_error<ConfigError>(
            "DeviceSpec: unknown dtype 'tflops.{}' (expected f64, f32, bf16, f16, int, f8)", key);
      }
    }
    d.tflops_f64 = positive(t, "f64", d.tflops_f64, "tflops.");
    d.tflops_f32 = positive(t, "f32", d.tflops_f32, "tflops.");
    d.tflops_bf16 = positive(t, "bf16", d.tflops_bf16, "tflops.");
    d.tflops_f16 = positive(t, "f16", d.tflops_f16, "tflops.");
    d.tflops_int = positive(t, "int", d.tflops_int, "tflops.");
    d.tflops_f8 = positive(t, "f8", d.tflops_f8, "tflops.");
  }
  d.memory_bandwidth_gbps = positive(j, "memory_bandwidth_gbps", d.memory_bandwidth_gbps);
  d.memory_gib = positive(j, "memory_gib", d.memory_gib);
  d.efficiency = positive(j, "efficiency", d.efficiency);
  if (d.efficiency > 1.0) {
    throw_error<ConfigError>("DeviceSpec: 'efficiency' must be in (0, 1], got {}", d.efficiency);
  }
  if (j.contains("achievable")) {
    const auto& a = j.at("achievable");
    if (!a.is_object()) {
      throw_error<ConfigError>(
          "DeviceSpec: 'achievable' must be an object of kernel class: fraction of peak, got {}",
          shown(a));
    }
    for (const auto& [key, value] : a.items()) {
      if (key != "matmul" && key != "attention" && key != "memory") {
        throw_error<ConfigError>(
            "DeviceSpec: unknown kernel class 'achievable.{}' (expected matmul, attention, memory)",
            key);
      }
    }
    d.achievable_matmul = positive(a, "matmul", 0.0, "achievable.");
    d.achievable_attention = positive(a, "attention", 0.0, "achievable.");
    d.achievable_memory = positive(a, "memory", 0.0, "achievable.");
    for (const char* key : {"matmul", "attention", "memory"}) {
      if (a.contains(key) && a.at(key).get<double>() > 1.0) {
        throw_error<ConfigError>("DeviceSpec: 'achievable.{}' must be in (0, 1], got {}", key,
                                 a.at(key).get<double>());
      }
    }
  }
  if (j.contains("flash_attention")) {
    if (!j.at("flash_attention").is_boolean()) {
      throw_error<ConfigError>("DeviceSpec: 'flash_attention' must be true or false, got {}",
                               shown(j.at("flash_attention")));
    }
    d.flash_attention = j.at("flash_attention").get<bool>();
  }
  for (const auto& [key, field] :
       {std::pair{"cuda_context_mib", &d.cuda_context_mib},
        std::pair{"nccl_mib_per_communicator", &d.nccl_mib_per_communicator}}) {
    if (!j.contains(key)) continue;
    const auto& v = j.at(key);
    if (!v.is_number() || v.get<double>() < 0) {
      throw_error<ConfigError>("DeviceSpec: '{}' must be a number >= 0, got {}", key, shown(v));
    }
    *field = v.get<double>();
  }
  if (j.contains("source") && !j.at("source").is_string()) {
    throw_error<ConfigError>("DeviceSpec: 'source' must be a string, got {}",
                             shown(j.at("source")));
  }
  return d;
}

DeviceSpec DeviceSpec::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error<ConfigError>("DeviceSpec: cannot read the device file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return from_json(text.str());
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{} (in {})", e.what(), path));
  }
}

std::string DeviceSpec::to_json() const {
  nlohmann::json j = {{"name", name},
                      {"tflops",
                       {{"f64", tflops_f64},
                        {"f32", tflops_f32},
                        {"bf16", tflops_bf16},
                        {"f16", tflops_f16},
                        {"int", tflops_int},
                        {"f8", tflops_f8}}},
                      {"memory_bandwidth_gbps", memory_bandwidth_gbps},
                      {"memory_gib", memory_gib},
                      {"efficiency", efficiency},
                      {"achievable",
                       {{"matmul", matmul_fraction()},
                        {"attention", attention_fraction()},
                        {"memory", memory_fraction()}}},
                      {"flash_attention", flash_attention},
                      {"cuda_context_mib", cuda_context_mib},
                      {"nccl_mib_per_communicator", nccl_mib_per_communicator}};
  return j.dump(2);
}

std::vector<std::string> eager_op_names() {
  std::vector<std::string> names;
  for (const OpDef* def : all_ops()) {
    if (def->eager != nullptr &&
        std::find(names.begin(), names.end(), def->eager->of) == names.end()) {
      names.emplace_back(def->eager->of);
    }
  }
  return names;
}

namespace {

// The eager kernels an entry describes for `op` (OpDef::eager's `of`), or null.
const EagerKernels* eager_kernels_of(std::string_view op) {
  for (const OpDef* def : all_ops()) {
    if (def->eager != nullptr && def->eager->of == op) return def->eager;
  }
  return nullptr;
}

// The items of a comma list, empty ones left out.
std::vector<std::string> comma_list(const char* text) {
  std::vector<std::string> items;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// ConfigError naming `where` and the op when `ops` names one without eager kernels.
void check_eager_ops(const std::vector<std::string>& ops, std::string_view where) {
  for (const std::string& op : ops) {
    if (eager_kernels_of(op) == nullptr) {
      throw_error<ConfigError>(
          "{}: '{}' is not an op whose eager kernels spmdsim describes (Note [Eager kernels]); "
          "expected a comma list of {}",
          where, op, fmt::join(eager_op_names(), ", "));
    }
  }
}

}  // namespace

DryRunOptions DryRunOptions::from_env() {
  DryRunOptions o;
  if (const char* dims = std::getenv("SPMD_OVERLAP_DIMS")) o.overlap_dims = comma_list(dims);
  if (const char* ops = std::getenv("SPMD_EAGER_OPS")) {
    o.eager_ops = comma_list(ops);
    check_eager_ops(o.eager_ops, "SPMD_EAGER_OPS");
  }
  const char* conf = std::getenv("SPMD_ALLOC_CONF");
  if (conf == nullptr || *conf == '\0') return o;
  const std::string text(conf);
  if (text == "expandable_segments:True") {
    o.expandable_segments = true;
  } else if (text != "expandable_segments:False") {
    throw_error<ConfigError>(
        "SPMD_ALLOC_CONF: expected expandable_segments:True or expandable_segments:False "
        "(PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax), got '{}'",
        text);
  }
  return o;
}

// ---- the recorder -------------------------------------------------------------------------------

DryRun::DryRun(const World& world, DeviceSpec device, DryRunOptions options)
    : world_(world), device_(std::move(device)), options_(std::move(options)) {
  check_eager_ops(options_.eager_ops, "DryRunOptions::eager_ops");
  Trace& t = trace();
  first_event_ = t.first_event_id() + t.num_events();
  kept_participants_ = t.keeps_participants();
  if (world.size() > kParticipantListLimit) t.set_keep_participants(false);
  reset_meta_peak_bytes();
  step_start_bytes_ = meta_live_bytes();
  // Note [Dry-run estimates]: the allocator model starts with what is alive already (the
  // parameters) as one block, and sees every allocation from here on.
  // Its capacity leaves out the CUDA context; NCCL's buffers are known only after the step.
  AllocatorConfig config;
  config.expandable_segments = options_.expandable_segments;
  config.capacity = std::max<int64_t>(
      0,
      static_cast<int64_t>((device_.memory_gib * 1024.0 - device_.cuda_context_mib) * 1024 * 1024));
  allocator_ = std::make_unique<CachingAllocatorModel>(config);
  if (meta_tensors() && meta_live_bytes() > 0) allocator_->seed(meta_live_bytes());
  previous_listener_ = set_meta_allocation_listener(allocator_.get());
  allocator_config_ = config;
  previous_fused_attention_ = fused_attention_accounting();
  if (device_.flash_attention) set_fused_attention_accounting(true);
  observer_ = add_op_observer([device = device_, eager_ops = options_.eager_ops, mutex = mutex_,
                               ops = ops_](const OpEvent& e) {
    if (e.def == nullptr || e.def == &value_event_def() || e.op == "from_local" ||
        e.op == "redistribute")
      return;
    ComputeOp op;
    op.op = std::string(e.op);
    const Tensor& out = largest_piece(e.output);
    op.shape = out.shape();
    op.dtype = e.output.dtype();
    op.flops = global_flops(e) / work_split(e.output);
    op.bytes = static_cast<double>(out.nbytes());
    for (const DTensor* in : e.inputs) op.bytes += static_cast<double>(largest_piece(*in).nbytes());
    // Note [Dry-run estimates]: the kernel class, and a causal fused attention's half.
    const AttentionKernel kernel = attention_kernel();
    const bool sdpa = e.def == &spmd::op::scaled_dot_product_attention;
    if (sdpa || e.def == &spmd::op::attention_probs || kernel.active) {
      op.kind = 'a';
      const bool causal = sdpa ? !e.args.ints.empty() && e.args.ints[0] != 0 : kernel.causal;
      if (device.flash_attention && causal) op.flops *= 0.5;
    } else if (op.flops > 0.0) {
      op.kind = 'm';
      // An FP8 GEMM (scaled_mm, float8_mm: a bf16 output) runs at the float8 rate.
      if (e.def == &spmd::op::scaled_mm || e.def == &spmd::op::float8_mm) {
        op.dtype = DType::F8E4M3FN;
      }
    }
    // Note [Eager kernels]: an op the modeled run computes as separate kernels moves their bytes.
    if (e.def->eager != nullptr &&
        std::find(eager_ops.begin(), eager_ops.end(), e.def->eager->of) != eager_ops.end()) {
      std::vector<InputMeta> inputs;
      inputs.reserve(e.inputs.size());
      for (const DTensor* in : e.inputs) {
        inputs.push_back(InputMeta{&largest_piece(*in).shape(), in->dtype()});
      }
      op.bytes = e.def->eager->bytes(inputs, e.args, OpMeta{op.shape, op.dtype});
      op.kind = 'e';
    }
    const double fraction = op.kind == 'a'   ? device.attention_fraction()
                            : op.kind == 'm' ? device.matmul_fraction()
                                             : device.efficiency;
    // A fused attention kernel keeps its S^2 tiles on chip: its flops alone bound it.
    const double bytes = op.kind == 'a' && device.flash_attention ? 0.0 : op.bytes;
    op.us = std::max(op.flops / (device.peak_flops(op.dtype) * fraction),
                     bytes / (device.memory_bandwidth_gbps * 1e9 * device.memory_fraction())) *
            1e6;
    op.recompute = recomputing();
    Trace& t = trace();
    op.after_events = t.first_event_id() + t.num_events();
    if (const std::vector<int>& held = e.output.local().ranks(); !held.empty()) {
      op.first_rank = held.front();
    }
    op.file = e.location.file_name();
    op.line = e.location.line();
    const PipelineContext context = pipeline_context();
    op.stage = context.stage;
    op.microbatch = context.microbatch;
    op.phase = context.phase;
    std::lock_guard lock(*mutex);
    ops->push_back(std::move(op));
  });
}

void DryRun::begin_step() {
  Trace& t = trace();
  first_event_ = t.first_event_id() + t.num_events();
  reset_meta_peak_bytes();
  step_start_bytes_ = meta_live_bytes();
  auto fresh = std::make_unique<CachingAllocatorModel>(allocator_config_);
  if (meta_tensors() && meta_live_bytes() > 0) fresh->seed(meta_live_bytes());
  set_meta_allocation_listener(fresh.get());
  allocator_ = std::move(fresh);
  std::lock_guard lock(*mutex_);
  ops_->clear();
}

DryRun::~DryRun() {
  remove_op_observer(observer_);
  set_meta_allocation_listener(previous_listener_);
  set_fused_attention_accounting(previous_fused_attention_);
  trace().set_keep_participants(kept_participants_);
}

DryRunReport DryRun::report(const MemoryParts& parts) const {
  DryRunReport r;
  r.world_size = world_.size();
  r.backend = world_.backend_name();
  r.eager_ops = options_.eager_ops;
  r.device = device_;
  r.topology_json = world_.topology().to_json();
  // Memory classes.
  const std::vector<int>& held = world_.held_ranks();
  const size_t n = held.size();
  const std::vector<int64_t> params = bytes_per_rank(parts.parameters, n, held);
  const std::vector<int64_t> grads = bytes_per_rank(parts.gradients, n, held);
  const std::vector<int64_t> state = bytes_per_rank(parts.optimizer_state, n, held);
  std::map<std::tuple<int64_t, int64_t, int64_t>, size_t> classes;
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = classes.try_emplace({params[i], grads[i], state[i]}, r.memory.size());
    if (inserted) {
      DryRunReport::RankClass c;
      c.parameters = params[i];
      c.gradients = grads[i];
      c.optimizer_state = state[i];
      r.memory.push_back(c);
    }
    DryRunReport::RankClass& c = r.memory[it->second];
    ++c.ranks;
    if (c.example_ranks.size() < 4) c.example_ranks.push_back(held[i]);
  }
  r.shape_only = meta_tensors();
  // Note [Dry-run estimates]: the peak is per rank when every rank holds the same shards.
  r.peak_exact = r.shape_only && r.memory.size() == 1;
  for (const auto* group : {&parts.parameters, &parts.gradients, &parts.optimizer_state}) {
    for (const DTensor* t : *group) {
      if (t != nullptr && t->defined() && t->local().num_classes() > 1) r.peak_exact = false;
    }
  }
  for (DryRunReport::RankClass& c : r.memory) {
    if (!r.shape_only) {
      c.peak = c.activations = -1;
      continue;
    }
    c.peak = meta_peak_bytes();
    c.activations = std::max<int64_t>(0, c.peak - c.parameters - c.gradients - c.optimizer_state);
    if (const int64_t at_backward = meta_bytes_at_backward(); at_backward >= 0) {
      c.saved_by_forward = std::max<int64_t>(0, at_backward - step_start_bytes_);
    }
  }
  // Collectives, in first-seen (dim, op) order.
  const std::vector<TraceEvent> events = trace().events();
  const uint64_t first_held = trace().first_event_id();
  std::map<std::pair<std::string, std::string>, size_t> rows;
  for (size_t i = 0; i < events.size(); ++i) {
    if (first_held + i < first_event_) continue;
    const TraceEvent& e = events[i];
    const std::string op(collective_name(e.kind));
    auto [it, inserted] = rows.try_emplace({e.dim_name, op}, r.comm.size());
    if (inserted) r.comm.push_back(DryRunReport::CommRow{e.dim_name, op});
    DryRunReport::CommRow& row = r.comm[it->second];
    ++row.calls;
    row.bytes_per_rank += e.bytes;
    row.estimate_us += e.estimate_us;
    r.comm_us += e.estimate_us;
  }
  std::lock_guard lock(*mutex_);
  r.ops = static_cast<int64_t>(ops_->size());
  std::map<DType, double> flops_by_dtype;
  for (const ComputeOp& op : *ops_) {
    r.flops += op.flops;
    if (!op.recompute) r.model_flops += op.flops;
    r.compute_us += op.us;
    if (op.kind == 'm') r.matmul_us += op.us;
    if (op.kind == 'a') r.attention_us += op.us;
    // FP8 GEMMs count against the BF16 peak, as torchtitan's MFU does for Float8 runs.
    flops_by_dtype[is_float8(op.dtype) ? DType::BF16 : op.dtype] += op.flops;
  }
  r.serial_us = r.compute_us + r.comm_us;
  r.step_us = overlapped_step(events);
  r.exposed_comm_us = std::max(0.0, r.step_us - r.compute_us);
  if (parts.pipeline != nullptr) r.pipeline = pipeline_estimate(*parts.pipeline, events);
  if (r.pipeline) {
    r.step_us = r.pipeline->makespan_us + r.pipeline->outside_us;
    r.exposed_comm_us = 0.0;
  }
  DType main_dtype = DType::F32;
  double most = -1.0;
  for (const auto& [dtype, f] : flops_by_dtype) {
    if (f > most) std::tie(main_dtype, most) = std::tie(dtype, f);
  }
  if (r.step_us > 0.0) r.hfu = r.flops / (r.step_us * 1e-6 * device_.peak_flops(main_dtype));
  if (r.flops > 0.0) r.mfu = r.hfu * r.model_flops / r.flops;
  if (r.shape_only && r.peak_exact && !r.memory.empty()) {
    r.device_memory = device_memory(r.memory.front().peak, parts.prefetch_gathers, events);
  }
  return r;
}

bool DryRun::on_overlap_dim(const TraceEvent& e) const {
  const std::vector<std::string>& dims = options_.overlap_dims;
  return std::find(dims.begin(), dims.end(), e.dim_name) != dims.end();
}

// Note [Dry-run estimates]: compute and communication as two streams.
double DryRun::overlapped_step(const std::vector<TraceEvent>& events) const {
  const uint64_t first_held = trace().first_event_id();
  double compute = 0.0;      // when the compute stream is free
  double comm = 0.0;         // when the communication stream is free
  double last_gather = 0.0;  // when the last overlapped all_gather was issued
  size_t next = 0;
  auto collectives_before = [&](uint64_t id_limit) {
    for (; next < events.size() && first_held + next < id_limit; ++next) {
      if (first_held + next < first_event_) continue;
      const TraceEvent& e = events[next];
      if (e.kind == CollectiveKind::Recv) continue;  // costed at its send
      const bool gather = e.kind == CollectiveKind::AllGather;
      const bool reduce =
          e.kind == CollectiveKind::ReduceScatter || e.kind == CollectiveKind::AllReduce;
      if (on_overlap_dim(e) && gather) {
        // Prefetched: it may start when the previous one was issued; its user waits for it.
        const double start = std::max(comm, last_gather);
        last_gather = compute;
        comm = start + e.estimate_us;
        compute = std::max(compute, comm);
      } else if (on_overlap_dim(e) && reduce) {
        // A gradient reduction: nothing in the step waits for it but the step's end.
        comm = std::max(comm, compute) + e.estimate_us;
      } else {
        const double start = std::max(comm, compute);
        compute = comm = start + e.estimate_us;
      }
    }
  };
  for (const ComputeOp& op : *ops_) {
    collectives_before(op.after_events);
    compute += op.us;
  }
  collectives_before(UINT64_MAX);
  return std::max(compute, comm);
}

DryRunReport::DeviceMemory DryRun::device_memory(int64_t tensors_peak, int prefetch_gathers,
                                                 const std::vector<TraceEvent>& events) const {
  DryRunReport::DeviceMemory m;
  m.tensors_peak = tensors_peak;
  m.expandable_segments = options_.expandable_segments;
  const CachingAllocatorModel::Stats stats = allocator_->stats();
  const uint64_t first_held = trace().first_event_id();
  std::vector<std::string> dims;
  std::vector<int64_t> gathered;  // output bytes of the overlapped all-gathers, in order
  for (size_t i = 0; i < events.size(); ++i) {
    if (first_held + i < first_event_) continue;
    const TraceEvent& e = events[i];
    if (std::find(dims.begin(), dims.end(), e.dim_name) == dims.end()) dims.push_back(e.dim_name);
    if (on_overlap_dim(e) && e.kind == CollectiveKind::AllGather) {
      gathered.push_back(e.bytes * (e.family ? e.family->group_size() : 1));
    }
  }
  // The most bytes `prefetch_gathers` consecutive all-gathers return: the next unit's.
  if (prefetch_gathers > 0) {
    const size_t window = static_cast<size_t>(prefetch_gathers);
    int64_t sum = 0;
    for (size_t i = 0; i < gathered.size(); ++i) {
      sum += gathered[i];
      if (i >= window) sum -= gathered[i - window];
      m.prefetch = std::max(m.prefetch, sum);
    }
  }
  m.allocated = stats.peak_allocated + m.prefetch;
  m.reserved = stats.peak_reserved + (m.prefetch + CachingAllocatorModel::kRoundLarge - 1) /
                                         CachingAllocatorModel::kRoundLarge *
                                         CachingAllocatorModel::kRoundLarge;
  m.reduce_scatter_stream =
      stats.stream_reserved_at_peak[static_cast<size_t>(MetaStream::reduce_scatter)];
  m.ooms = stats.ooms;
  m.communicators = static_cast<int>(dims.size());
  constexpr double kMiB = 1024.0 * 1024.0;
  m.cuda_context = static_cast<int64_t>(device_.cuda_context_mib * kMiB);
  m.nccl = static_cast<int64_t>(device_.nccl_mib_per_communicator * kMiB * m.communicators);
  m.total = m.reserved + m.cuda_context + m.nccl;
  return m;
}

std::optional<DryRunReport::Pipeline> DryRun::pipeline_estimate(
    const pipeline::PipelineStep& step, const std::vector<TraceEvent>& events) const {
  const pipeline::Schedule& s = step.schedule;
  if (s.ranks == 0) return std::nullopt;
  DryRunReport::Pipeline p;
  p.schedule = s.name;
  p.ranks = s.ranks;
  p.microbatches = s.microbatches;
  p.virtual_stages = s.virtual_stages;
  p.activation_bytes = step.activation_bytes;
  p.peak_activation_bytes = step.peak_activation_bytes;
  p.peak_in_flight = step.peak_in_flight;
  // The estimate of every action, by (phase, stage, microbatch), and of every transfer.
  std::map<std::tuple<char, int, int>, double> actions;
  double transfers = 0.0;
  int64_t transfer_count = 0;
  std::map<int, double> outside;  // by stage mesh (its first rank)
  const uint64_t first_held = trace().first_event_id();
  for (size_t i = 0; i < events.size(); ++i) {
    if (first_held + i < first_event_) continue;
    const TraceEvent& e = events[i];
    if (e.kind == CollectiveKind::Send) {
      transfers += e.estimate_us;
      ++transfer_count;
    } else if (e.kind == CollectiveKind::Recv) {
      // Counted once, at the send.
    } else if (e.phase != 0) {
      actions[{e.phase, e.stage, e.microbatch}] += e.estimate_us;
    } else {
      std::vector<int> first_group;
      if (e.family) first_group = e.family->group(0);
      outside[first_group.empty() ? -1 : first_group.front()] += e.estimate_us;
    }
  }
  // report() holds mutex_.
  for (const ComputeOp& op : *ops_) {
    if (op.phase != 0) {
      actions[{op.phase, op.stage, op.microbatch}] += op.us;
    } else {
      outside[op.first_rank] += op.us;
    }
  }
  auto mean_of = [&](char phase) {
    double sum = 0.0;
    int64_t count = 0;
    for (const auto& [key, us] : actions) {
      if (std::get<0>(key) != phase) continue;
      sum += us;
      ++count;
    }
    return count == 0 ? 0.0 : sum / static_cast<double>(count);
  };
  p.forward_us = mean_of('F');
  p.backward_us = mean_of('B');
  p.input_us = mean_of('I');
  p.weight_us = mean_of('W');
  p.transfer_us = transfer_count == 0 ? 0.0 : transfers / static_cast<double>(transfer_count);
  const pipeline::Timeline t = pipeline::simulate(
      s, pipeline::Costs{p.forward_us, p.backward_us, p.input_us, p.weight_us, p.transfer_us});
  p.makespan_us = t.makespan;
  p.bubble_fraction = t.bubble_fraction;
  for (const auto& [first_rank, us] : outside) p.outside_us = std::max(p.outside_us, us);
  return p;
}

void DryRun::write_timeline(const std::string& path) const {
  const std::vector<TraceEvent> events = trace().events();
  const uint64_t first_held = trace().first_event_id();
  const int rank = world_.held_ranks().front();
  std::vector<TraceRecord> records;
  double now = 0.0;
  size_t next_event = 0;
  auto add_collectives_before = [&](uint64_t id_limit) {
    for (; next_event < events.size() && first_held + next_event < id_limit; ++next_event) {
      if (first_held + next_event < first_event_) continue;
      const TraceEvent& e = events[next_event];
      TraceRecord rec;
      rec.rank = rank;
      rec.op = std::string(collective_name(e.kind));
      rec.dim_name = e.dim_name;
      rec.detail = e.detail;
      if (e.family) {
        if (auto where = e.family->locate(rank)) rec.group_ranks = e.family->group(where->group);
      }
      rec.shape = e.shape;
      rec.dtype = fmt::format("{}", e.dtype);
      rec.bytes = e.bytes;
      rec.file = e.file;
      rec.line = e.line;
      rec.function = e.function;
      rec.estimate_us = e.estimate_us;
      rec.start_us = now;
      now += e.estimate_us;
      rec.end_us = now;
      records.push_back(std::move(rec));
    }
  };
  std::vector<ComputeOp> ops;
  {
    std::lock_guard lock(*mutex_);
    ops = *ops_;
  }
  for (const ComputeOp& op : ops) {
    add_collectives_before(op.after_events);
    TraceRecord rec;
    rec.rank = rank;
    rec.op = op.op;
    rec.dim_name = "compute";
    rec.detail = fmt::format("flops={:.4g} bytes={:.4g}", op.flops, op.bytes);
    rec.group_ranks = {rank};
    rec.shape = op.shape;
    rec.dtype = fmt::format("{}", op.dtype);
    rec.bytes = static_cast<int64_t>(op.bytes);
    rec.file = op.file;
    rec.line = op.line;
    rec.estimate_us = op.us;
    rec.start_us = now;
    now += op.us;
    rec.end_us = now;
    records.push_back(std::move(rec));
  }
  add_collectives_before(UINT64_MAX);
  TraceFileInfo info;
  info.kind = "estimated_timeline";
  info.ranks = {rank};
  info.world_size = world_.size();
  info.backend = world_.backend_name();
  write_trace_file(path, records, info);
}

// ---- the report's text --------------------------------------------------------------------------

namespace {

// The pipeline's part of the table (Note [Dry-run estimates]).
std::string pipeline_table(const DryRunReport::Pipeline& p) {
  std::string out = fmt::format(
      "\npipeline: {}, {} pp ranks x {} microbatches ({} stage{} per rank)\n", p.schedule, p.ranks,
      p.microbatches, p.virtual_stages, p.virtual_stages == 1 ? "" : "s");
  if (!p.peak_activation_bytes.empty()) {
    out += fmt::format("{:>8}  {:>10}  {:>17}  {:>24}\n", "pp rank", "in flight",
                       "activations held", "per microbatch per stage");
    for (size_t r = 0; r < p.peak_activation_bytes.size(); ++r) {
      std::string per_stage;
      for (size_t s = r; s < p.activation_bytes.size(); s += p.peak_activation_bytes.size()) {
        if (!per_stage.empty()) per_stage += ", ";
        per_stage += bytes_text(p.activation_bytes[s]);
      }
      out += fmt::format("{:>8}  {:>10}  {:>17}  {:>24}\n", r, p.peak_in_flight[r],
                         bytes_text(p.peak_activation_bytes[r]), per_stage);
    }
  }
  out += fmt::format("  per action: F {}, B {}, I {}, W {}; transfer {}\n", time_text(p.forward_us),
                     time_text(p.backward_us), time_text(p.input_us), time_text(p.weight_us),
                     time_text(p.transfer_us));
  if (p.forward_us + p.backward_us + p.input_us + p.weight_us <= 0.0) {
    out +=
        "  pipelined: no compute estimate (the stages ran no DTensor ops; LocalTensor ops are not "
        "costed), so the makespan is the transfers' alone: " +
        time_text(p.makespan_us) + "\n";
    return out;
  }
  out += fmt::format("  pipelined: makespan {}, bubble {:.1f}% (idle over pp ranks x makespan)\n",
                     time_text(p.makespan_us), 100.0 * p.bubble_fraction);
  return out;
}

}  // namespace

std::string DryRunReport::table() const {
  std::string out = fmt::format("dry run: {} ranks, backend {}, {} tensors\n", world_size, backend,
                                shape_only ? "shape-only (--spmd-tensors=meta)" : "real");
  out += "\nmemory per rank (classes of ranks with equal bytes)\n";
  out +=
      fmt::format("{:>8}  {:<18}  {:>11}  {:>11}  {:>11}  {:>12}  {:>11}  {:>9}\n", "ranks", "e.g.",
                  "parameters", "gradients", "optimizer", "activations*", "peak", "of device");
  for (const RankClass& c : memory) {
    const std::string share =
        c.peak < 0 ? std::string("n/a")
                   : fmt::format("{:.0f}%", 100.0 * static_cast<double>(c.peak) /
                                                (device.memory_gib * 1024.0 * 1024 * 1024));
    out += fmt::format("{:>8}  {:<18}  {:>11}  {:>11}  {:>11}  {:>12}  {:>11}  {:>9}\n", c.ranks,
                       example_ranks_text(c), bytes_text(c.parameters), bytes_text(c.gradients),
                       bytes_text(c.optimizer_state), bytes_text(c.activations), bytes_text(c.peak),
                       share);
  }
  if (shape_only) out += "(*) activations and temporaries alive at the peak\n";
  if (shape_only && !peak_exact) {
    out += "(peak: each distinct shard counted once, an upper bound for one rank)\n";
  }
  out += "\ncollectives per mesh dim (one rank's input bytes, cost model on the topology)\n";
  out += fmt::format("{:<10}  {:<16}  {:>7}  {:>12}  {:>12}\n", "mesh dim", "collective", "calls",
                     "bytes/rank", "estimate");
  for (const CommRow& row : comm) {
    out += fmt::format("{:<10}  {:<16}  {:>7}  {:>12}  {:>12}\n", row.dim_name, row.op, row.calls,
                       bytes_text(row.bytes_per_rank), time_text(row.estimate_us));
  }
  if (device_memory) {
    const DeviceMemory& m = *device_memory;
    out += fmt::format(
        "\ndevice memory per rank at the peak (Note [Dry-run estimates]; caching allocator{})\n",
        m.expandable_segments ? " with expandable segments" : "");
    auto line = [&](const char* what, int64_t bytes, const std::string& why) {
      out += fmt::format("  {:<26} {:>11}  {}\n", what, bytes_text(bytes), why);
    };
    if (!memory.empty() && memory.front().saved_by_forward >= 0) {
      line("saved by the forward", memory.front().saved_by_forward,
           "alive when backward began, beyond what the step began with");
    }
    line("tensors", m.tensors_peak, "the most bytes alive at once");
    if (m.prefetch > 0) line("+ FSDP prefetch", m.prefetch, "the next unit's gathered parameters");
    line("allocated", m.allocated, "blocks rounded to 512 B (max_memory_allocated)");
    line("reserved", m.reserved, "the allocator's segments (max_memory_reserved)");
    if (m.reduce_scatter_stream > 0) {
      line("  of which gradients' pool", m.reduce_scatter_stream,
           "FSDP's reduce-scatter stream: the compute stream cannot reuse it");
    }
    line("+ CUDA context", m.cuda_context, "the device file's");
    line("+ NCCL buffers", m.nccl,
         fmt::format("{} communicator{}", m.communicators, m.communicators == 1 ? "" : "s"));
    line("= device", m.total,
         fmt::format(
             "{:.0f}% of {:.0f} GiB{}",
             100.0 * static_cast<double>(m.total) / (device.memory_gib * 1024.0 * 1024 * 1024),
             device.memory_gib,
             m.ooms > 0 ? fmt::format("; {} allocations found no room: out of memory", m.ooms)
                        : std::string()));
  }
  if (pipeline) out += pipeline_table(*pipeline);
  out += fmt::format(
      "\nestimated step time on {} (matmul {:.0f}%, attention {:.0f}% of peak; memory-bound ops "
      "{:.0f}% of bandwidth):\n"
      "  compute        {:>12}  ({} DTensor ops, {:.3g} TFLOP per rank; matmul {}, attention "
      "{})\n"
      "  communication  {:>12}  ({} not hidden by compute)\n"
      "  step           {:>12}  (nothing overlapped: {}; {:.1f}% of peak flop/s, MFU {:.1f}%)\n",
      device.name, device.matmul_fraction() * 100.0, device.attention_fraction() * 100.0,
      device.memory_fraction() * 100.0, time_text(compute_us), ops, flops / 1e12,
      time_text(matmul_us), time_text(attention_us), time_text(comm_us), time_text(exposed_comm_us),
      time_text(step_us), time_text(serial_us), 100.0 * hfu, 100.0 * mfu);
  if (!eager_ops.empty()) {
    out += "  as PyTorch eager's separate kernels (Note [Eager kernels]):\n";
    for (const std::string& name : eager_ops) {
      const EagerKernels* kernels = eager_kernels_of(name);
      out += fmt::format("    {:<18} {}\n", name,
                         kernels != nullptr ? kernels->source : "(no entry describes its kernels)");
    }
  }
  if (pipeline) {
    out += fmt::format(
        "  (the step: the pipelined makespan {} and {} outside the pipeline's actions; the\n"
        "  compute and communication above are summed over every stage)\n",
        time_text(pipeline->makespan_us), time_text(pipeline->outside_us));
  }
  return out;
}

std::string DryRunReport::json() const {
  nlohmann::json mem = nlohmann::json::array();
  for (const RankClass& c : memory) {
    mem.push_back({{"ranks", c.ranks},
                   {"example_ranks", c.example_ranks},
                   {"parameters", c.parameters},
                   {"gradients", c.gradients},
                   {"optimizer_state", c.optimizer_state},
                   {"activations", c.activations},
                   {"saved_by_forward", c.saved_by_forward},
                   {"peak", c.peak}});
  }
  nlohmann::json comm_rows = nlohmann::json::array();
  for (const CommRow& row : comm) {
    comm_rows.push_back({{"mesh_dim", row.dim_name},
                         {"collective", row.op},
                         {"calls", row.calls},
                         {"bytes_per_rank", row.bytes_per_rank},
                         {"estimate_us", row.estimate_us}});
  }
  nlohmann::json j = {{"world_size", world_size},
                      {"backend", backend},
                      {"eager_ops", eager_ops},
                      {"shape_only", shape_only},
                      {"peak_exact", peak_exact},
                      {"memory", mem},
                      {"collectives", comm_rows},
                      {"step",
                       {{"ops", ops},
                        {"flops_per_rank", flops},
                        {"compute_us", compute_us},
                        {"matmul_us", matmul_us},
                        {"attention_us", attention_us},
                        {"comm_us", comm_us},
                        {"exposed_comm_us", exposed_comm_us},
                        {"serial_us", serial_us},
                        {"step_us", step_us},
                        {"hfu", hfu},
                        {"model_flops_per_rank", model_flops},
                        {"mfu", mfu}}},
                      {"device", nlohmann::json::parse(device.to_json())},
                      {"topology", nlohmann::json::parse(topology_json)}};
  if (device_memory) {
    const DeviceMemory& m = *device_memory;
    j["device_memory"] = {{"tensors_peak", m.tensors_peak},
                          {"prefetch", m.prefetch},
                          {"allocated", m.allocated},
                          {"reserved", m.reserved},
                          {"reduce_scatter_stream", m.reduce_scatter_stream},
                          {"cuda_context", m.cuda_context},
                          {"nccl", m.nccl},
                          {"communicators", m.communicators},
                          {"total", m.total},
                          {"ooms", m.ooms},
                          {"expandable_segments", m.expandable_segments}};
  }
  if (pipeline) {
    const Pipeline& p = *pipeline;
    j["pipeline"] = {{"schedule", p.schedule},
                     {"ranks", p.ranks},
                     {"microbatches", p.microbatches},
                     {"virtual_stages", p.virtual_stages},
                     {"forward_us", p.forward_us},
                     {"backward_us", p.backward_us},
                     {"input_us", p.input_us},
                     {"weight_us", p.weight_us},
                     {"transfer_us", p.transfer_us},
                     {"makespan_us", p.makespan_us},
                     {"bubble_fraction", p.bubble_fraction},
                     {"outside_us", p.outside_us},
                     {"activation_bytes", p.activation_bytes},
                     {"peak_activation_bytes", p.peak_activation_bytes},
                     {"peak_in_flight", p.peak_in_flight}};
  }
  return j.dump(2) + "\n";
}

}  // namespace spmd
