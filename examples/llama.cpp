// examples/llama.cpp: a small Llama 3 (RMSNorm, rotary embeddings with Llama 3.1 scaling,
// grouped-query attention, SwiGLU or a mixture of experts) trained on 8 simulated ranks over a
// mesh of pp, dp, ep, cp and tp dims; every step's loss is checked against the same model trained
// on one device.
//
//   ./llama                                     # sim, mesh (dp=2, tp=4)
//   ./llama --cp 2 --tp 4 --dp 1                # context parallel: the sequence split over cp
//   ./llama --experts 8 --ep 4 --dp 2 --tp 1    # mixture of experts, experts split over ep
//   ./llama --pp 2 --schedule 1f1b              # pipeline parallel: mesh (pp=2, dp=2, tp=2)
//   ./llama --pp 4 --dp 1 --tp 2 --schedule interleaved   # 8 stages of one block
//   ./llama --spmd-backend=threads              # one thread per rank, the same digest
//   mpirun -n 8 ./llama --spmd-backend=mpi      # one process per rank, the same digest
//   ./llama --model 8b --spmd-tensors=meta      # a dry run at Llama 3.1 8B's shapes
//   ./llama --steps 2 --save ckpt && ./llama --steps 2 --load ckpt --dp 4 --tp 2
//                                               # two steps, then two more on another mesh
//   ./llama --accumulate 2                      # each step's batch as 2 microbatches, one
//                                               # gradient reduction a step (no_sync)
//
// The model and its parallel layout are examples/llama_model.h's. Tokens are the bytes of
// examples/data/gpt_corpus.txt (vocabulary 256); AdamW with gradient clipping. Without --tp, tp
// is what the world leaves after the other dims.
//
// --accumulate N splits each step's batch into N microbatches, each one's loss divided by N, and
// runs the backwards of all but the last under no_sync (Note [No sync] in spmd/dtensor/dtensor.h):
// the gradients add up unreduced and are reduced once per step. The dense model's losses equal
// those without --accumulate (its mean over the batch is the mean of the microbatches' means);
// with experts the load-balancing loss and the capacity are per microbatch. Without --pp.
//
// Pipeline parallelism (--pp N --schedule gpipe|1f1b|interleaved|zb --microbatches M
// --virtual-stages V, V = 2 by default for interleaved), as examples/gpt.cpp has it: the model is
// cut into N x V stages, the embeddings in the first, the final norm, the output layer and the
// loss in the last, the blocks split evenly (--layers defaults to one per stage); each stage runs
// the model's own code on its mesh of the other dims, run_pipeline (pipeline/runner.h) moves the
// activations between stages, and the gradient reduction, the clipping and AdamW follow once per
// step. With experts, each stage's load-balancing losses travel with its activation to the loss.
// The single-device check runs the same microbatches (Note [Llama pipeline]).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <spmd/pipeline/runner.h>
#include <spmd/spmd.h>

#include "llama_model.h"

using namespace spmd;
using namespace llama_model;

namespace {

constexpr const char* kUsage =
    "llama [--dp N] [--ep N] [--cp N] [--tp N] [--fsdp] [--layers N] [--d-model N] [--heads N]\n"
    "      [--pp N] [--schedule gpipe|1f1b|interleaved|zb] [--microbatches N]\n"
    "      [--virtual-stages N] [--kv-heads N] [--ffn N] [--seq N] [--vocab N] [--batch N] "
    "[--steps N] [--lr X]\n"
    "      [--experts N] [--top-k N] [--capacity-factor X] [--aux-coef X] [--shared-expert]\n"
    "      [--cp-method ring|allgather|sdpa] [--no-zigzag] [--no-rope-scaling]\n"
    "      [--dtype f32|f64|bf16] [--master-dtype f32|f64] [--model toy|8b|70b|405b] [--no-check]\n"
    "      [--recompute] [--selective-recompute] [--selective-recompute-policy matmuls|alternate]\n"
    "      [--loss-dtype f32|f64|bf16] [--float8] [--float8-global-scales]\n"
    "      [--float8-all-gather]\n"
    "      [--data FILE] [--seed N] [--save DIR] [--load DIR] [--accumulate N]\n"
    "      (and the --spmd-* flags of launch())";

// --dtype and --master-dtype: f32, f64 or bf16.
DType float_dtype(const std::string& flag, const std::string& value) {
  if (value == "f32") return DType::F32;
  if (value == "f64") return DType::F64;
  if (value == "bf16") return DType::BF16;
  throw_error<ConfigError>("llama: {} takes f32, f64 or bf16, got '{}'", flag, value);
}

int64_t parse_int(const std::string& flag, const std::string& value) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 0) {
    throw_error<ConfigError>("llama: {} needs a non-negative integer, got '{}'\n{}", flag, value,
                             kUsage);
  }
  return v;
}

double parse_real(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size() && std::isfinite(v) && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw_error<ConfigError>("llama: {} needs a non-negative number, got '{}'\n{}", flag, value,
                           kUsage);
}

// Llama 3.1's published shapes (Meta's params.json), for dry runs.
void set_model(Config& c, const std::string& name) {
  struct Shape3 {
    int64_t layers, d, heads, kv, ffn;
  };
  Shape3 s{};
  if (name == "8b") {
    s = {32, 4096, 32, 8, 14336};
  } else if (name == "70b") {
    s = {80, 8192, 64, 8, 28672};
  } else if (name == "405b") {
    s = {126, 16384, 128, 8, 53248};
  } else if (name != "toy") {
    throw_error<ConfigError>("llama: --model takes toy, 8b, 70b or 405b, got '{}'", name);
  }
  c.model = name;
  if (name == "toy") return;
  c.layers = s.layers;
  c.d_model = s.d;
  c.heads = s.heads;
  c.kv_heads = s.kv;
  c.ffn = s.ffn;
  c.vocab = 128256;
  c.seq = 8192;
  c.dtype = DType::BF16;
  c.steps = 1;
}

Config parse_flags(int argc, char** argv) {
  Config c;
  c.data = SPMD_LLAMA_DATA;
  std::vector<std::pair<std::string, std::string>> later;
  bool layers_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-check") {
      c.check = false;
    } else if (flag == "--fsdp") {
      c.fsdp = true;
    } else if (flag == "--recompute") {
      c.recompute = true;
    } else if (flag == "--selective-recompute") {
      c.recompute = true;
      c.selective = true;
    } else if (flag == "--shared-expert") {
      c.shared_expert = true;
    } else if (flag == "--no-rope-scaling") {
      c.rope_scaling = false;
    } else if (flag == "--no-zigzag") {
      c.zigzag = false;
    } else if (flag == "--float8") {
      c.float8 = true;
    } else if (flag == "--float8-global-scales") {
      c.float8 = true;
      c.float8_global = true;
    } else if (flag == "--float8-all-gather") {
      c.float8 = true;
      c.float8_all_gather = true;
    } else if (flag == "-h" || flag == "--help") {
      throw_error<ConfigError>("{}", kUsage);
    } else {
      if (i + 1 >= argc) throw_error<ConfigError>("llama: {} needs a value\n{}", flag, kUsage);
      const std::string value = argv[++i];
      if (flag == "--model") {
        set_model(c, value);
      } else {
        later.emplace_back(flag, value);
      }
    }
  }
  // Explicit shapes override a --model's.
  for (const auto& [flag, value] : later) {
    if (flag == "--dp") {
      c.dp = parse_int(flag, value);
    } else if (flag == "--pp") {
      c.pp = parse_int(flag, value);
    } else if (flag == "--schedule") {
      c.schedule = value;
    } else if (flag == "--microbatches") {
      c.microbatches = parse_int(flag, value);
    } else if (flag == "--virtual-stages") {
      c.virtual_stages = parse_int(flag, value);
    } else if (flag == "--ep") {
      c.ep = parse_int(flag, value);
    } else if (flag == "--cp") {
      c.cp = parse_int(flag, value);
    } else if (flag == "--tp") {
      c.tp = parse_int(flag, value);
      if (c.tp == 0) throw_error<ConfigError>("llama: --tp must be at least 1");
    } else if (flag == "--layers") {
      c.layers = parse_int(flag, value);
      layers_given = true;
    } else if (flag == "--d-model") {
      c.d_model = parse_int(flag, value);
    } else if (flag == "--heads") {
      c.heads = parse_int(flag, value);
    } else if (flag == "--kv-heads") {
      c.kv_heads = parse_int(flag, value);
    } else if (flag == "--ffn") {
      c.ffn = parse_int(flag, value);
    } else if (flag == "--seq") {
      c.seq = parse_int(flag, value);
    } else if (flag == "--vocab") {
      c.vocab = parse_int(flag, value);
    } else if (flag == "--batch") {
      c.batch = parse_int(flag, value);
    } else if (flag == "--steps") {
      c.steps = parse_int(flag, value);
    } else if (flag == "--experts") {
      c.experts = parse_int(flag, value);
    } else if (flag == "--top-k") {
      c.top_k = parse_int(flag, value);
    } else if (flag == "--seed") {
      c.seed = static_cast<uint64_t>(parse_int(flag, value));
    } else if (flag == "--lr") {
      c.lr = parse_real(flag, value);
    } else if (flag == "--capacity-factor") {
      c.capacity_factor = parse_real(flag, value);
    } else if (flag == "--aux-coef") {
      c.aux_coef = parse_real(flag, value);
    } else if (flag == "--data") {
      c.data = value;
    } else if (flag == "--save") {
      c.save = value;
    } else if (flag == "--load") {
      c.load = value;
    } else if (flag == "--accumulate") {
      c.accumulate = parse_int(flag, value);
    } else if (flag == "--loss-dtype") {
      c.loss_dtype = float_dtype(flag, value);
    } else if (flag == "--selective-recompute-policy") {
      if (value != "matmuls" && value != "alternate") {
        throw_error<ConfigError>(
            "llama: --selective-recompute-policy takes matmuls or alternate, got '{}'", value);
      }
      c.recompute = c.selective = true;
      c.alternate_matmuls = value == "alternate";
    } else if (flag == "--cp-method") {
      if (value != "ring" && value != "allgather" && value != "sdpa") {
        throw_error<ConfigError>("llama: --cp-method takes ring, allgather or sdpa, got '{}'",
                                 value);
      }
      c.cp_method = value;
    } else if (flag == "--dtype") {
      c.dtype = float_dtype(flag, value);
    } else if (flag == "--master-dtype") {
      c.master_dtype = float_dtype(flag, value);
    } else {
      throw_error<ConfigError>("llama: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"--pp", c.pp},
                                {"--dp", c.dp},
                                {"--ep", c.ep},
                                {"--cp", c.cp},
                                {"--microbatches", c.microbatches},
                                {"--layers", c.layers},
                                {"--heads", c.heads},
                                {"--kv-heads", c.kv_heads},
                                {"--batch", c.batch},
                                {"--seq", c.seq},
                                {"--steps", c.steps},
                                {"--accumulate", c.accumulate}}) {
    if (v < 1) throw_error<ConfigError>("llama: {} must be at least 1", name);
  }
  if (c.d_model % c.heads != 0 || c.head_dim() % 2 != 0) {
    throw_error<ConfigError>(
        "llama: --d-model {} must be --heads {} times an even head size (rotary embeddings rotate "
        "pairs)",
        c.d_model, c.heads);
  }
  if (c.heads % c.kv_heads != 0) {
    throw_error<ConfigError>(
        "llama: --kv-heads {} must divide --heads {} (grouped-query attention)", c.kv_heads,
        c.heads);
  }
  if (c.recompute && c.experts > 0) {
    throw_error<ConfigError>(
        "llama: --recompute runs with dense blocks only (an MoE block's load-balancing loss is a "
        "second output of the block); drop --experts or --recompute");
  }
  if (c.float8_all_gather && !c.fsdp) {
    throw_error<ConfigError>(
        "llama: --float8-all-gather gathers the FSDP weights in float8: it needs --fsdp");
  }
  if (c.ep > 1 && c.experts == 0) {
    throw_error<ConfigError>("llama: --ep {} needs experts to split (--experts N)", c.ep);
  }
  if (c.experts > 0 && (c.experts % c.ep != 0 || c.top_k < 1 || c.top_k > c.experts)) {
    throw_error<ConfigError>(
        "llama: --experts {} must split over --ep {}, and --top-k {} must be in 1..{}", c.experts,
        c.ep, c.top_k, c.experts);
  }
  if (c.batch % (c.dp * c.ep) != 0) {
    throw_error<ConfigError>("llama: --batch {} must split over --dp {} x --ep {}", c.batch, c.dp,
                             c.ep);
  }
  if (c.batch % c.accumulate != 0 || (c.batch / c.accumulate) % (c.dp * c.ep) != 0) {
    throw_error<ConfigError>(
        "llama: --batch {} must split into --accumulate {} microbatches whose rows split over "
        "--dp {} x --ep {}",
        c.batch, c.accumulate, c.dp, c.ep);
  }
  if (c.accumulate > 1 && c.pp > 1) {
    throw_error<ConfigError>(
        "llama: --accumulate runs without --pp (a pipeline splits each batch into --microbatches "
        "already)");
  }
  if (c.virtual_stages == 0) c.virtual_stages = c.schedule == "interleaved" ? 2 : 1;
  // Without --layers (or a --model's), a pipeline gets one block per stage (at least 2).
  if (!layers_given && c.model == "toy" && c.pp > 1) {
    c.layers = std::max(c.layers, c.pp * c.virtual_stages);
  }
  return c;
}

// The checks that need tp, once the world has set it.
void check_tp(const Config& c) {
  if (c.heads % c.tp != 0 || c.ffn % c.tp != 0 || c.vocab % c.tp != 0) {
    throw_error<ConfigError>(
        "llama: --tp {} must divide --heads {}, --ffn {} and --vocab {} (tensor parallelism)", c.tp,
        c.heads, c.ffn, c.vocab);
  }
  if (c.seq % (c.cp * c.tp) != 0) {
    throw_error<ConfigError>(
        "llama: --seq {} must split over --cp {} x --tp {} (context and sequence parallelism)",
        c.seq, c.cp, c.tp);
  }
  if (c.cp > 1 && c.zigzag && c.cp_method != "sdpa" && c.seq % (2 * c.cp * c.tp) != 0) {
    throw_error<ConfigError>(
        "llama: --seq {} must split into 2 x --cp {} chunks of a multiple of --tp {} (zigzag "
        "order; or --no-zigzag)",
        c.seq, c.cp, c.tp);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error<ConfigError>("llama: cannot read the training text '{}' (--data)", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Step `step`'s batch: B windows of S + 1 bytes (token = byte mod vocab), [B, S + 1] I64.
Tensor batch_tokens(const Config& c, const std::string& text, int64_t step) {
  const int64_t span = c.seq + 1;
  if (meta_tensors()) return zeros({c.batch, span}, DType::I64);
  const int64_t n = static_cast<int64_t>(text.size());
  if (n <= span) {
    throw_error<ConfigError>("llama: the text has {} bytes, fewer than --seq + 1 = {}", n, span);
  }
  std::vector<int64_t> tokens;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t start = ((step * c.batch + b) * 7919) % (n - span);
    for (int64_t i = 0; i < span; ++i) {
      tokens.push_back(static_cast<unsigned char>(text[static_cast<size_t>(start + i)]) % c.vocab);
    }
  }
  return from_vector(tokens, {c.batch, span});
}

// Step `step`'s input tokens and their next tokens [B, S], in the sequence order `order` (empty: in
// order).
std::pair<Tensor, Tensor> step_tokens(const Config& c, const std::string& text, int64_t step,
                                      const std::vector<int64_t>& order) {
  const Tensor batch = batch_tokens(c, text, step);
  Tensor ids = batch.narrow(1, 0, c.seq).contiguous();
  Tensor next = batch.narrow(1, 1, c.seq).contiguous();
  if (!order.empty()) {
    const Tensor in_order = from_vector(order, {c.seq});
    ids = index_select(ids, 1, in_order);
    next = index_select(next, 1, in_order);
  }
  return {ids, next};
}

double value_of(const Tensor& t) {
  return t.is_meta() ? std::nan("") : t.to(DType::F64).item<double>();
}

AdamWOptions adamw_options(const Config& c) {
  return AdamWOptions{.lr = c.lr, .weight_decay = 0.1};
}

// The model and AdamW's state as checkpoint entries (spmd/nn/checkpoint.h): --save and --load.
template <class T>
checkpoint::StateDict training_state(Model<T>& model, AdamW<T>& opt) {
  checkpoint::StateDict state = opt.state_dict("optim.");
  const std::vector<T*> params = model.params();
  for (size_t i = 0; i < params.size(); ++i) state[fmt::format("param.{}", i)] = params[i];
  return state;
}

// Trains c.steps steps; returns each step's loss. With --load the model and AdamW's state come
// from that checkpoint and the steps follow the loaded one (*first: its number); with --save the
// mesh run writes both after the last step.
template <class T, class P>
std::vector<double> train(const Config& c, const std::string& text, const P& par, Model<T>& model,
                          const ModelLayout* layout, DryRun* dry = nullptr,
                          int64_t* first = nullptr) {
  std::vector<T*> params = model.params();
  AdamW<T> opt(params, adamw_options(c));
  std::vector<double> losses;
  if (!c.load.empty()) checkpoint::load(training_state(model, opt), c.load);
  const int64_t start = opt.steps();
  if (first != nullptr) *first = start;
  // --accumulate: microbatch m's rows of the batch, and its share of the step's loss.
  Config mc = c;
  mc.batch = c.batch / c.accumulate;
  const double scale = 1.0 / static_cast<double>(c.accumulate);
  auto rows = [&](const Tensor& t, int64_t m) {
    return c.accumulate == 1 ? t : t.narrow(0, m * mc.batch, mc.batch).contiguous();
  };
  for (int64_t step = start; step < start + c.steps; ++step) {
    // The dry run reports the last step, in the steady state the earlier ones left.
    if (dry != nullptr && step > start && step + 1 == start + c.steps) dry->begin_step();
    if constexpr (std::is_same_v<P, Parallel>) precompute_float8_amaxes(par, model);
    double value = 0.0;
    for (int64_t m = 0; m < c.accumulate; ++m) {
      T loss;
      if constexpr (std::is_same_v<T, Tensor>) {
        const auto [ids, next] = step_tokens(c, text, step, {});
        loss = forward(mc, par, model, rows(ids, m), rows(next, m));
        if (c.accumulate > 1) loss = loss * scale;
        value += value_of(loss);
      } else {
        // The sequence in the run's (zigzag) order.
        const auto [ids, next] = step_tokens(c, text, step, par.order);
        loss =
            forward(mc, par, model, distribute_tensor(rows(ids, m), layout->mesh, layout->tokens()),
                    distribute_tensor(rows(next, m), layout->mesh, layout->tokens()));
        if (c.accumulate > 1) loss = loss * scale;
        value += value_of(loss.full_tensor());
      }
      if (m + 1 < c.accumulate) {
        // Note [No sync]: this microbatch's gradients wait unreduced for the last one's.
        const auto guard = no_sync();
        backward(loss);
      } else {
        backward(loss);
      }
    }
    losses.push_back(value);
    std::vector<T> grads;
    for (T* p : params) grads.push_back(p->grad());
    clip_grad_norm(params, c.clip);
    opt.step();
    if constexpr (std::is_same_v<T, DTensor>) {
      if (dry != nullptr && step + 1 == start + c.steps) {
        // The memory of the last step: parameters, gradients, AdamW's two moments.
        MemoryParts parts;
        for (size_t i = 0; i < params.size(); ++i) {
          parts.parameters.push_back(params[i]);
          parts.gradients.push_back(&grads[i]);
          parts.optimizer_state.push_back(&opt.exp_avg(i));
          parts.optimizer_state.push_back(&opt.exp_avg_sq(i));
        }
        // FSDP gathers a block's parameters ahead of its compute (the prefetch window).
        if (layout->fsdp)
          parts.prefetch_gathers = static_cast<int>(model.blocks[0].params().size());
        const DryRunReport report = dry->report(parts);
        if (layout->mesh.world().is_coordinator()) {
          fmt::print("\n== dry-run report\n{}", report.table());
          if (const char* path = std::getenv("SPMD_DRY_RUN_REPORT")) {
            std::ofstream(fmt::format("{}.json", path)) << report.json();
            dry->write_timeline(fmt::format("{}.timeline.json", path));
          }
        }
      }
    }
  }
  if constexpr (std::is_same_v<T, DTensor>) {
    if (!c.save.empty()) checkpoint::save(layout->mesh.world(), training_state(model, opt), c.save);
  }
  return losses;
}

// ---- pipeline parallelism -----------------------------------------------------------------------

// The configuration of one microbatch: c.batch / c.microbatches rows.
Config microbatch_config(const Config& c) {
  Config mc = c;
  mc.batch = c.batch / c.microbatches;
  return mc;
}

// Microbatch m's rows of a step's [B, S] tokens.
Tensor microbatch_rows(const Config& c, const Tensor& tokens, int64_t m) {
  const int64_t rows = c.batch / c.microbatches;
  return tokens.narrow(0, m * rows, rows).contiguous();
}

// train() as the pipeline runs it, on one device: each step's batch split into c.microbatches
// microbatches, each one's loss divided by their count and its gradients accumulated, then one
// clipping and one AdamW step. Returns each step's loss (the sum of the scaled losses).
std::vector<double> train_microbatched(const Config& c, const std::string& text,
                                       Model<Tensor>& model, const Single& one) {
  const Config mc = microbatch_config(c);
  std::vector<Tensor*> params = model.params();
  AdamW<Tensor> opt(params, adamw_options(c));
  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto [ids, next] = step_tokens(c, text, step, {});
    Tensor total;
    for (int64_t m = 0; m < c.microbatches; ++m) {
      const Tensor loss =
          forward(mc, one, model, microbatch_rows(c, ids, m), microbatch_rows(c, next, m)) *
          (1.0 / static_cast<double>(c.microbatches));
      backward(loss);
      const Tensor value = loss.detach();
      total = total.defined() ? total + value : value;
    }
    losses.push_back(value_of(total));
    clip_grad_norm(params, c.clip);
    opt.step();
  }
  return losses;
}

// The parallel run's view of the layout: its rotary positions (each sequence index's position,
// zigzag over cp), split over cp like the sequence.
Parallel make_parallel(const Config& c, const ModelLayout& layout,
                       const std::vector<int64_t>& order) {
  std::vector<int64_t> positions = order;
  if (positions.empty()) {
    for (int64_t i = 0; i < c.seq; ++i) positions.push_back(i);
  }
  Placements seq_placements = replicate_placements(layout.mesh);
  if (layout.has("cp")) seq_placements = placed_on(layout.mesh, "cp", Shard{0});
  Parallel par{&layout,
               distribute_tensor(from_vector(positions, {c.seq}), layout.mesh, seq_placements),
               c.cp_method, order, policy_of(c)};
  if (!c.float8_global) {
    for (const char* dim : {"dp", "cp"}) {
      if (layout.has(dim)) par.float8_options.rank_local_dims.emplace_back(dim);
    }
  }
  par.float8_all_gather = c.float8_all_gather;
  if (c.float8_all_gather)
    par.float8_amaxes = std::make_shared<std::map<const DTensor*, DTensor>>();
  return par;
}

// Note [Llama pipeline]
// With --pp above 1 the mesh is (pp, dp, ...) and the model is cut as the GPT is (examples/gpt.cpp,
// Note [GPT pipeline]): pp x virtual stages, stage 0 holding the embeddings, the last one the
// final norm, the output layer and the loss, the blocks split evenly in order. Stage s runs on pp
// rank s % pp, whose ranks form the stage mesh: every dim but pp, a root mesh of its own, with
// its own layout and rotary positions. A stage's forward takes the runner's LocalTensor into a
// DTensor (the tokens, or the activation in its layout), runs the model's own pieces (embed,
// block, logits_of; the last stage also next_token_loss, the microbatch's targets named by the
// runner) and hands the result back. It sees its parameters through LocalTensor leaves, one per
// parameter and step, made DTensors whose gradient is Partial on every mesh dim where the
// parameter is replicated: the microbatches' gradients add up locally and one redistribution per
// parameter reduces them after the pipeline. The leaves are typed (to_local: R where replicated,
// Note [SPMD types]), so from_local lays each gradient out exactly as claimed: one that arrives
// replicated (the embedding's over cp, computed whole on every cp rank from replicated tokens) is
// split into shares of the sum, where untyped pieces would keep it whole on every rank and the
// reduction would count it cp times. The gradient norm adds every stage's squares (an all_reduce
// over pp), and one AdamW step follows, as on one device, whose reference run splits each batch
// into the same microbatches (train_microbatched).
// With experts every block adds its load-balancing loss, and the loss on the last stage needs all
// of them. A stage's output is its activation's local shard with the load-balancing losses so far
// appended as one element (their sum, replicated over the stage mesh: stage_output); the next
// stage takes them apart (stage_input) and adds its own blocks'. The sum rides in the activation,
// so its gradient (aux_coef over the microbatch count) comes back with the activation's and reaches
// every stage's routers by the ordinary backward, under every schedule (zero bubble's I and W
// included), and the sum is taken in the order one device takes it.

// The local shape of a tensor of global shape `shape` placed by `placements` on `mesh` (even
// splits, which the flags' checks ensure).
Shape local_shape(const DeviceMesh& mesh, const Placements& placements, Shape shape) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (const auto* s = std::get_if<Shard>(&placements[static_cast<size_t>(d)])) {
      shape[static_cast<size_t>(s->dim)] /= mesh.size(d);
    }
  }
  return shape;
}

// A stage's output as the runner sends it: x's local shard, and with `aux` (the load-balancing
// losses so far) their sum replicated over the stage mesh, appended as one element.
LocalTensor stage_output(const DTensor& x, const DTensor& aux) {
  if (!aux.defined()) return x.to_local();
  // The sum is the same on every rank (SPMD type I: its gradient arrives the same too); in one
  // tensor with x's shards it varies as they do, and its gradient stays each rank's own, which
  // the next stage makes the same on every rank (from_local's Replicate).
  std::map<std::string, SpmdType> varying;
  for (int d = 0; d < aux.mesh().ndim(); ++d) varying[aux.mesh().dim_name(d)] = SpmdType::V;
  const LocalTensor sum =
      reinterpret(aux.redistribute(replicate_placements(aux.mesh())).to_local(), varying);
  return cat({flatten(x.to_local()), reshape(sum, {1})});
}

// What stage_output sent, taken apart: x (global shape `shape`, `placements` on `mesh`) and, with
// experts, the load-balancing losses so far (undefined without).
std::pair<DTensor, DTensor> stage_input(const LocalTensor& input, const DeviceMesh& mesh,
                                        const Placements& placements, const Shape& shape,
                                        bool with_aux) {
  if (!with_aux) return {DTensor::from_local(input, mesh, placements, shape), DTensor()};
  const Shape local = local_shape(mesh, placements, shape);
  const int64_t n = shape_numel(local);
  return {DTensor::from_local(reshape(narrow(input, 0, 0, n), local), mesh, placements, shape),
          DTensor::from_local(reshape(narrow(input, 0, n, 1), {}), mesh, replicate_placements(mesh),
                              Shape{})};
}

struct PipelineSetup {
  pipeline::Schedule schedule;
  int64_t blocks_per_stage = 0;
  // Per pp rank: the stage mesh, its layout and the parallel run's view of it (which points to
  // the layout: each has its own place).
  std::vector<DeviceMesh> meshes;
  std::vector<std::unique_ptr<ModelLayout>> layouts;
  std::vector<Parallel> pars;

  int stages() const { return schedule.stages(); }
  // The stage holding layer `layer` (-1: the embeddings; the layer count: the head).
  int stage_of(int64_t layer) const {
    if (layer < 0) return 0;
    return static_cast<int>(std::min<int64_t>(layer / blocks_per_stage, stages() - 1));
  }
  size_t rank_of(int stage) const { return static_cast<size_t>(schedule.rank_of_stage(stage)); }
};

PipelineSetup make_pipeline(const Config& c, const DeviceMesh& mesh,
                            const std::vector<int64_t>& order) {
  PipelineSetup setup;
  setup.schedule =
      pipeline::make_schedule(c.schedule, static_cast<int>(c.pp), static_cast<int>(c.microbatches),
                              static_cast<int>(c.virtual_stages));
  const int64_t stages = setup.stages();
  if (c.layers % stages != 0) {
    throw_error<ConfigError>(
        "llama: --layers {} does not split into {} pipeline stages (--pp {} x {} virtual stages): "
        "every stage needs the same number of blocks; try --layers {}",
        c.layers, stages, c.pp, c.virtual_stages, stages * std::max<int64_t>(1, c.layers / stages));
  }
  setup.blocks_per_stage = c.layers / stages;
  if (c.batch % c.microbatches != 0 || (c.batch / c.microbatches) % (c.dp * c.ep) != 0) {
    throw_error<ConfigError>(
        "llama: --batch {} must split into --microbatches {} of a multiple of --dp {} x --ep {} = "
        "{} rows each",
        c.batch, c.microbatches, c.dp, c.ep, c.dp * c.ep);
  }
  std::vector<std::string> names;
  for (int d = 1; d < mesh.ndim(); ++d) names.push_back(mesh.dim_name(d));
  {
    // Rank ids are values, also in a dry run (--spmd-tensors=meta).
    const MetaTensorsScope real(false);
    const Tensor table = mesh.rank_table();
    for (int64_t p = 0; p < c.pp; ++p) {
      setup.meshes.push_back(
          DeviceMesh::from_ranks(mesh.world(), table.select(0, p).contiguous(), names));
    }
  }
  // Under mpi creating a communicator is collective over every process: all of them create every
  // stage mesh's, in the same order, before any stage communicates; the debug checks' too.
  for (const DeviceMesh& m : setup.meshes) {
    for (int d = 0; d < m.ndim(); ++d) (void)communicator(m, d);
    create_debug_communicators(m);
    setup.layouts.push_back(
        std::make_unique<ModelLayout>(ModelLayout{m, c.fsdp, c.kv_heads % c.tp != 0}));
    setup.pars.push_back(make_parallel(c, *setup.layouts.back(), order));
    setup.pars.back().reshard_after_forward = false;  // FSDP2 in a pipeline (torchtitan)
  }
  return setup;
}

// A stage's view of parameter p: the gradient Partial wherever p is replicated (Note [Llama
// pipeline]).
Placements grad_placements(const DTensor& p) {
  Placements out = p.placements();
  for (int d = 0; d < p.mesh().ndim(); ++d) {
    Placement& q = out[static_cast<size_t>(d)];
    if (std::holds_alternative<Replicate>(q)) q = Partial{};
  }
  return out;
}

// Trains c.steps steps by the pipeline; returns each step's loss (on every process).
std::vector<double> train_pipeline(World& world, const Config& c, const std::string& text,
                                   const DeviceMesh& mesh, const PipelineSetup& setup,
                                   const std::vector<int64_t>& order, Model<DTensor>& model,
                                   pipeline::PipelineStep* last_step = nullptr) {
  const Config mc = microbatch_config(c);
  const pipeline::Schedule& schedule = setup.schedule;
  const int last = setup.stages() - 1;
  const bool with_aux = c.experts > 0;
  const std::vector<int64_t> layer_of = param_layers(model);
  std::vector<DTensor*> params = model.params();
  std::vector<std::vector<size_t>> own(static_cast<size_t>(setup.stages()));
  for (size_t i = 0; i < params.size(); ++i) {
    own[static_cast<size_t>(setup.stage_of(layer_of[i]))].push_back(i);
  }
  const Shape activation_shape{mc.batch, c.seq, c.d_model};
  AdamW<DTensor> opt(params, adamw_options(c));
  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto [ids, next] = step_tokens(c, text, step, order);
    std::vector<LocalTensor> leaves(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i]->participates()) continue;
      leaves[i] = params[i]->detach().to_local();
      leaves[i].requires_grad_();
    }
    pipeline::PipelineModel pm;
    for (int s = 0; s <= last; ++s) {
      const size_t p = setup.rank_of(s);
      const ModelLayout& layout = *setup.layouts[p];
      pipeline::PipelineStage stage;
      for (size_t i : own[static_cast<size_t>(s)]) {
        if (leaves[i].defined()) stage.parameters.push_back(&leaves[i]);
      }
      const Shape local = local_shape(layout.mesh, layout.activations(), activation_shape);
      stage.input_shape = with_aux ? Shape{shape_numel(local) + 1} : local;
      stage.input_dtype = c.dtype;
      stage.forward = [&, s, p](const LocalTensor& input) {
        const ModelLayout& on = *setup.layouts[p];
        const Parallel& par = setup.pars[p];
        Model<DTensor> m = model;
        const std::vector<DTensor*> views = m.params();
        for (size_t i : own[static_cast<size_t>(s)]) {
          const DTensor& w = *params[i];
          *views[i] = DTensor::from_local(leaves[i], w.mesh(), w.placements(), w.shape(),
                                          grad_placements(w));
        }
        DTensor x, aux;
        if (s == 0) {
          x = embed(par, m,
                    DTensor::from_local(input, on.mesh, on.tokens(), Shape{mc.batch, c.seq}));
        } else {
          std::tie(x, aux) =
              stage_input(input, on.mesh, on.activations(), activation_shape, with_aux);
        }
        const int64_t first = s * setup.blocks_per_stage;
        for (int64_t l = first; l < first + setup.blocks_per_stage; ++l) {
          x = block(mc, par, m.blocks[static_cast<size_t>(l)], x, aux);
        }
        if (s != last) return stage_output(x.redistribute(on.activations()), aux);
        // The runner names the microbatch it runs (Note [Pipeline context]): its targets.
        const int mb = pipeline_context().microbatch;
        const DTensor targets =
            distribute_tensor(microbatch_rows(c, next, mb), on.mesh, on.tokens());
        const DTensor loss = next_token_loss(mc, logits_of(mc, par, m, x), targets, aux);
        return loss.redistribute(replicate_placements(on.mesh)).to_local();
      };
      pm.stages.push_back(std::move(stage));
    }
    pm.input = [&](int mb, const std::vector<int>&) {
      const ModelLayout& first = *setup.layouts.front();
      return distribute_tensor(microbatch_rows(c, ids, mb), first.mesh, first.tokens()).local();
    };
    // The last stage's forward ends in the loss (with experts, the load-balancing losses of every
    // stage join it there).
    pm.loss = [](const LocalTensor& loss, int) { return loss; };
    const pipeline::PipelineStep ran = pipeline::run_pipeline(pm, schedule, mesh, "pp");
    if (last_step != nullptr) *last_step = ran;
    // A dry run (--spmd-tensors=meta) issues every op and collective below on shapes; the norm
    // and the loss have no values.
    const bool shapes_only = meta_tensors();

    // Every gradient reduced, then the norm over every stage's squares.
    std::vector<DTensor> grads(params.size());
    std::vector<DTensor> squares(setup.meshes.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!leaves[i].defined() || !leaves[i].grad().defined()) continue;
      const DTensor& p = *params[i];
      grads[i] = DTensor::from_local(leaves[i].grad(), p.mesh(), grad_placements(p), p.shape())
                     .redistribute(p.placements());
      const DTensor g64 = to(grads[i], DType::F64);
      const DTensor sq = sum(g64 * g64);
      const DTensor partial = sq.redistribute(Placements(sq.placements().size(), Partial{}));
      DTensor& acc = squares[setup.rank_of(setup.stage_of(layer_of[i]))];
      acc = acc.defined() ? acc + partial : partial;
    }
    std::vector<LocalTensor> per_mesh;
    for (const DTensor& sq : squares) {
      per_mesh.push_back(sq.defined() ? sq.redistribute(replicate_placements(sq.mesh())).to_local()
                                      : LocalTensor());
    }
    const LocalTensor mine = LocalTensor::from_fn(world, [&](int r) {
      for (size_t q = 0; q < per_mesh.size(); ++q) {
        if (per_mesh[q].defined() && setup.meshes[q].contains(r)) return per_mesh[q].shard(r);
      }
      return scalar_tensor(0.0, DType::F64);
    });
    const int held = world.held_ranks().front();
    const Tensor norm_squared = all_reduce(mine, mesh, "pp").shard(held);
    const double norm = shapes_only ? 0.0 : std::sqrt(norm_squared.item<double>());
    const double coefficient = shapes_only ? 0.5 : c.clip / (norm + 1e-6);
    // clip_grad_norm's scaling; backward of a leaf stores the gradient it is given, for AdamW.
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      backward(*params[i], coefficient < 1.0 ? grads[i] * coefficient : grads[i]);
    }
    opt.step();

    // The loss, on the last stage's ranks, to every process.
    const LocalTensor loss = LocalTensor::from_fn(world, [&](int r) {
      return ran.loss.defined() && ran.loss.holds(r) ? ran.loss.shard(r).to(DType::F64)
                                                     : scalar_tensor(0.0, DType::F64);
    });
    const Tensor total = all_reduce(loss, mesh, "pp").shard(held);
    losses.push_back(shapes_only ? std::nan("") : total.item<double>());
  }
  return losses;
}

// ---- the program --------------------------------------------------------------------------------

void section(const World& world, const std::string& title) {
  if (world.is_coordinator()) fmt::print("\n== {}\n", title);
}

int llama(World& world, Config c) {
  const int64_t others = c.pp * c.dp * c.ep * c.cp;
  if (c.tp == 0) {
    if (world.size() % others != 0) {
      throw_error<ConfigError>(
          "llama: --pp {} x --dp {} x --ep {} x --cp {} = {} does not divide the world's {} ranks "
          "(tp takes what they leave; or give --tp)",
          c.pp, c.dp, c.ep, c.cp, others, world.size());
    }
    c.tp = world.size() / others;
  }
  const int64_t ranks = others * c.tp;
  if (ranks != world.size()) {
    throw_error<ConfigError>(
        "llama: the mesh --pp {} x --dp {} x --ep {} x --cp {} x --tp {} has {} ranks, but the "
        "world has {}",
        c.pp, c.dp, c.ep, c.cp, c.tp, ranks, world.size());
  }
  check_tp(c);
  // Mesh dims of size 1 are left out, except dp (the batch) and ep with experts (the MoE layer's
  // dim); tp innermost (the most traffic), pp outermost (the least: one activation per
  // microbatch and stage), as torchtitan orders them.
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (const auto& [name, size] : {std::pair<std::string, int64_t>{"pp", c.pp},
                                   {"dp", c.dp},
                                   {"ep", c.ep},
                                   {"cp", c.cp},
                                   {"tp", c.tp}}) {
    if (size > 1 || name == "dp" || (name == "ep" && c.experts > 0)) {
      sizes.push_back(size);
      names.push_back(name);
    }
  }
  const DeviceMesh mesh = init_device_mesh(world, sizes, names);
  const bool pipelined = c.pp > 1;
  const bool dry_run = meta_tensors();
  if (dry_run) c.check = false;
  // Capacity drops choices per rank (Note [Expert parallelism]): one device, seeing every token
  // together, drops others; the single-device check would compare different models.
  const bool dropping = c.experts > 0 && c.capacity_factor > 0.0;
  if (dropping) c.check = false;
  const std::string text = dry_run ? std::string() : read_text(c.data);
  const bool coordinator = world.is_coordinator();
  ModelLayout layout{mesh, c.fsdp, c.kv_heads % c.tp != 0};
  // The sequence's order over cp: zigzag (head-tail) for ring and all-gather attention.
  std::vector<int64_t> order;
  if (c.cp > 1 && c.zigzag && c.cp_method != "sdpa") order = zigzag_order(c.seq, c.cp);
  std::optional<PipelineSetup> setup;
  if (pipelined) setup = make_pipeline(c, mesh, order);
  if (coordinator) {
    fmt::print(
        "llama: {} layers, d_model {}, {} heads ({} key/value heads), ffn {}, sequence {}, "
        "vocabulary {}, batch {}, {}\n",
        c.layers, c.d_model, c.heads, c.kv_heads, c.ffn, c.seq, c.vocab, c.batch, c.dtype);
    if (c.experts > 0) {
      fmt::print("       mixture of experts: {} experts, top-{}, capacity factor {}{}\n", c.experts,
                 c.top_k, c.capacity_factor, c.shared_expert ? ", one shared expert" : "");
    }
    fmt::print("       rotary theta {}{}; {} steps of AdamW (lr {}), {} ranks, backend {}\n",
               c.rope_theta, c.rope_scaling ? " with Llama 3.1 scaling" : "", c.steps, c.lr,
               world.size(), world.backend_name());
    if (c.accumulate > 1) {
      fmt::print(
          "       gradient accumulation: {} microbatches of {} rows a step, all but the last "
          "backward under no_sync\n",
          c.accumulate, c.batch / c.accumulate);
    }
    if (c.cp > 1) {
      fmt::print("       context parallel over cp = {}: {} attention, sequence in {} order\n", c.cp,
                 c.cp_method, order.empty() ? "contiguous" : "zigzag (head-tail)");
    }
    fmt::print("       key/value heads {} over tp\n",
               layout.kv_replicated ? "replicated (fewer than tp)" : "split");
    if (pipelined) {
      fmt::print(
          "       pipeline: schedule {}, {} microbatches of {} rows, {} stages ({} pp ranks x {} "
          "virtual), blocks per stage: {}\n",
          c.schedule, c.microbatches, c.batch / c.microbatches, setup->stages(), c.pp,
          c.virtual_stages, setup->blocks_per_stage);
    }
    fmt::print("\n== mesh {}{}\n{}", mesh.layout(), c.fsdp ? ", FSDP over dp" : "",
               world.size() <= 64 ? mesh.to_grid() : std::string("(grid not drawn)\n"));
  }

  Model<DTensor> model =
      pipelined ? init_model<DTensor>(
                      c,
                      [&](int64_t layer) {
                        return setup->layouts[setup->rank_of(setup->stage_of(layer))].get();
                      })
                : init_model<DTensor>(c, &layout);
  std::optional<Parallel> par;
  if (!pipelined) par = make_parallel(c, layout, order);
  if ((!c.save.empty() || !c.load.empty()) && (pipelined || dry_run)) {
    throw_error<ConfigError>(
        "llama: --save and --load run without --pp and outside a dry run (a pipeline's stages "
        "hold their own parameters; a dry run has no values)");
  }
  trace().clear();
  std::vector<double> losses;
  int64_t first_step = 0;  // the first step's number: the loaded one with --load
  if (pipelined && dry_run) {
    // The last step's in-flight activations per pp rank and its pipelined time join the report
    // (Note [Dry-run estimates]).
    const char* device_file = std::getenv("SPMD_DEVICE");
    DryRun dry(world, device_file != nullptr ? DeviceSpec::load(device_file) : DeviceSpec{});
    pipeline::PipelineStep step;
    losses = train_pipeline(world, c, text, mesh, *setup, order, model, &step);
    MemoryParts parts;
    for (DTensor* p : model.params()) parts.parameters.push_back(p);
    parts.pipeline = &step;
    const DryRunReport report = dry.report(parts);
    if (coordinator) fmt::print("\n== dry-run report\n{}", report.table());
    if (const char* path = std::getenv("SPMD_DRY_RUN_REPORT"); path != nullptr && coordinator) {
      std::ofstream(fmt::format("{}.json", path)) << report.json();
    }
  } else if (pipelined) {
    losses = train_pipeline(world, c, text, mesh, *setup, order, model);
  } else if (dry_run) {
    const char* device_file = std::getenv("SPMD_DEVICE");
    DryRun dry(world, device_file != nullptr ? DeviceSpec::load(device_file) : DeviceSpec{});
    losses = train(c, text, *par, model, &layout, &dry);
  } else {
    losses = train(c, text, *par, model, &layout, nullptr, &first_step);
  }
  section(world, "collectives of the training steps (this process's trace)");
  if (coordinator) fmt::print("{}", trace().summary_table());

  std::vector<double> single;
  if (c.check) {
    Model<Tensor> one = init_model<Tensor>(c, nullptr);
    std::vector<int64_t> in_order(static_cast<size_t>(c.seq));
    for (int64_t i = 0; i < c.seq; ++i) in_order[static_cast<size_t>(i)] = i;
    const Single plain{from_vector(in_order, {c.seq}), policy_of(c).param_dtype};
    single =
        pipelined ? train_microbatched(c, text, one, plain) : train(c, text, plain, one, nullptr);
  }
  double tolerance = c.dtype == DType::F64 ? 1e-9 : c.dtype == DType::F32 ? 1e-4 : 5e-2;
  // --float8 scales activations and gradients rank by rank over dp and cp (torchao's), one device
  // over the whole batch: the casts differ by float8 roundings, the losses by about 1e-3 of
  // themselves. --float8-global-scales casts as one device does.
  const bool rank_scales = c.float8 && !c.float8_global && (c.dp > 1 || c.cp > 1);
  if (rank_scales) tolerance = std::max(tolerance, 1e-2);
  section(world, "loss per step");
  if (coordinator) {
    fmt::print("{:>4}  {:>16}{}\n", "step", "mesh",
               c.check ? fmt::format("  {:>16}  {:>10}", "one device", "|diff|") : "");
  }
  double worst = 0.0;
  for (int64_t s = 0; s < c.steps; ++s) {
    const double loss = losses[static_cast<size_t>(s)];
    std::string line = fmt::format("{:>4}  {:>16.10f}", first_step + s, loss);
    if (c.check) {
      const double diff = std::abs(loss - single[static_cast<size_t>(s)]);
      worst = std::max(worst, diff);
      line += fmt::format("  {:>16.10f}  {:>10.3g}", single[static_cast<size_t>(s)], diff);
    }
    if (coordinator) fmt::print("{}\n", line);
  }
  const bool falls = losses.back() < losses.front() || c.steps == 1;
  const bool pass = dry_run || (falls && (!c.check || worst <= tolerance));
  if (coordinator && dry_run) {
    fmt::print(
        "\ndry run (--spmd-tensors=meta): shapes checked and every collective issued; no values\n");
  } else if (coordinator) {
    fmt::print("\nloss falls: {} ({:.4f} -> {:.4f})\n", falls ? "yes" : "NO", losses.front(),
               losses.back());
    if (c.check) {
      fmt::print(
          "check: {} (every step's loss against one device: max |diff| {:.3g}, tolerance "
          "{:.0e}{})\n",
          pass ? "PASS" : "FAIL", worst, tolerance,
          rank_scales ? ": float8 scales per dp/cp rank, one device's over the batch" : "");
    } else {
      fmt::print("check: {} (the loss falls; single-device check off{})\n", pass ? "PASS" : "FAIL",
                 dropping ? ": capacity drops tokens per rank" : "");
    }
  }
  std::vector<LocalTensor> digest_of{LocalTensor::replicate(world, from_vector(losses))};
  for (DTensor* p : model.params()) digest_of.push_back(p->local());
  print_digest(world, digest_of);
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) { return llama(world, parse_flags(argc, argv)); });
}
