// examples/llama.cpp: a small Llama 3 (RMSNorm, rotary embeddings with Llama 3.1 scaling,
// grouped-query attention, SwiGLU or a mixture of experts) trained on 8 simulated ranks over a
// mesh of dp, ep, cp and tp dims; every step's loss is checked against the same model trained on
// one device.
//
//   ./llama                                     # sim, mesh (dp=2, tp=4)
//   ./llama --cp 2 --tp 4 --dp 1                # context parallel: the sequence split over cp
//   ./llama --experts 8 --ep 4 --dp 2 --tp 1    # mixture of experts, experts split over ep
//   ./llama --spmd-backend=threads              # one thread per rank, the same digest
//   mpirun -n 8 ./llama --spmd-backend=mpi      # one process per rank, the same digest
//   ./llama --model 8b --spmd-tensors=meta      # a dry run at Llama 3.1 8B's shapes
//
// The model and its parallel layout are examples/llama_model.h's. Tokens are the bytes of
// examples/data/gpt_corpus.txt (vocabulary 256); AdamW with gradient clipping.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <spmd/spmd.h>

#include "llama_model.h"

using namespace spmd;
using namespace llama_model;

namespace {

constexpr const char* kUsage =
    "llama [--dp N] [--ep N] [--cp N] [--tp N] [--fsdp] [--layers N] [--d-model N] [--heads N]\n"
    "      [--kv-heads N] [--ffn N] [--seq N] [--vocab N] [--batch N] [--steps N] [--lr X]\n"
    "      [--experts N] [--top-k N] [--capacity-factor X] [--aux-coef X] [--shared-expert]\n"
    "      [--cp-method ring|allgather|sdpa] [--no-zigzag] [--no-rope-scaling]\n"
    "      [--dtype f32|f64|bf16] [--model toy|8b|70b|405b] [--no-check]\n"
    "      [--data FILE] [--seed N]   (and the --spmd-* flags of launch())";

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
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-check") {
      c.check = false;
    } else if (flag == "--fsdp") {
      c.fsdp = true;
    } else if (flag == "--shared-expert") {
      c.shared_expert = true;
    } else if (flag == "--no-rope-scaling") {
      c.rope_scaling = false;
    } else if (flag == "--no-zigzag") {
      c.zigzag = false;
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
    } else if (flag == "--ep") {
      c.ep = parse_int(flag, value);
    } else if (flag == "--cp") {
      c.cp = parse_int(flag, value);
    } else if (flag == "--tp") {
      c.tp = parse_int(flag, value);
    } else if (flag == "--layers") {
      c.layers = parse_int(flag, value);
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
    } else if (flag == "--cp-method") {
      if (value != "ring" && value != "allgather" && value != "sdpa") {
        throw_error<ConfigError>("llama: --cp-method takes ring, allgather or sdpa, got '{}'",
                                 value);
      }
      c.cp_method = value;
    } else if (flag == "--dtype") {
      if (value == "f32") {
        c.dtype = DType::F32;
      } else if (value == "f64") {
        c.dtype = DType::F64;
      } else if (value == "bf16") {
        c.dtype = DType::BF16;
      } else {
        throw_error<ConfigError>("llama: --dtype takes f32, f64 or bf16, got '{}'", value);
      }
    } else {
      throw_error<ConfigError>("llama: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"--dp", c.dp},
                                {"--ep", c.ep},
                                {"--cp", c.cp},
                                {"--tp", c.tp},
                                {"--layers", c.layers},
                                {"--heads", c.heads},
                                {"--kv-heads", c.kv_heads},
                                {"--batch", c.batch},
                                {"--seq", c.seq},
                                {"--steps", c.steps}}) {
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
  if (c.ep > 1 && c.experts == 0) {
    throw_error<ConfigError>("llama: --ep {} needs experts to split (--experts N)", c.ep);
  }
  if (c.experts > 0 && (c.experts % c.ep != 0 || c.top_k < 1 || c.top_k > c.experts)) {
    throw_error<ConfigError>(
        "llama: --experts {} must split over --ep {}, and --top-k {} must be in 1..{}", c.experts,
        c.ep, c.top_k, c.experts);
  }
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
  if (c.batch % (c.dp * c.ep) != 0) {
    throw_error<ConfigError>("llama: --batch {} must split over --dp {} x --ep {}", c.batch, c.dp,
                             c.ep);
  }
  return c;
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

double value_of(const Tensor& t) {
  return t.is_meta() ? std::nan("") : t.to(DType::F64).item<double>();
}

// Trains c.steps steps; returns each step's loss.
template <class T, class P>
std::vector<double> train(const Config& c, const std::string& text, const P& par, Model<T>& model,
                          const ModelLayout* layout, DryRun* dry = nullptr) {
  std::vector<T*> params = model.params();
  AdamW<T> opt(params, AdamWOptions{.lr = c.lr, .weight_decay = 0.1});
  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    const Tensor batch = batch_tokens(c, text, step);
    Tensor ids = batch.narrow(1, 0, c.seq).contiguous();
    Tensor next = batch.narrow(1, 1, c.seq).contiguous();
    T loss;
    if constexpr (std::is_same_v<T, Tensor>) {
      loss = forward(c, par, model, ids, next);
    } else {
      if (!par.order.empty()) {
        // The sequence in the run's (zigzag) order.
        const Tensor order = from_vector(par.order, {c.seq});
        ids = index_select(ids, 1, order);
        next = index_select(next, 1, order);
      }
      loss = forward(c, par, model, distribute_tensor(ids, layout->mesh, layout->tokens()),
                     distribute_tensor(next, layout->mesh, layout->tokens()));
    }
    if constexpr (std::is_same_v<T, Tensor>) {
      losses.push_back(value_of(loss));
    } else {
      losses.push_back(value_of(loss.full_tensor()));
    }
    backward(loss);
    std::vector<T> grads;
    for (T* p : params) grads.push_back(p->grad());
    clip_grad_norm(params, c.clip);
    opt.step();
    if constexpr (std::is_same_v<T, DTensor>) {
      if (dry != nullptr && step + 1 == c.steps) {
        // The memory of the last step: parameters, gradients, AdamW's two moments.
        MemoryParts parts;
        for (size_t i = 0; i < params.size(); ++i) {
          parts.parameters.push_back(params[i]);
          parts.gradients.push_back(&grads[i]);
          parts.optimizer_state.push_back(&opt.exp_avg(i));
          parts.optimizer_state.push_back(&opt.exp_avg_sq(i));
        }
        const DryRunReport report = dry->report(parts);
        if (layout->mesh.world().is_coordinator()) {
          fmt::print("\n== dry-run report\n{}", report.table());
        }
      }
    }
  }
  return losses;
}

void section(const World& world, const std::string& title) {
  if (world.is_coordinator()) fmt::print("\n== {}\n", title);
}

int llama(World& world, Config c) {
  const int64_t ranks = c.dp * c.ep * c.cp * c.tp;
  if (ranks != world.size()) {
    throw_error<ConfigError>(
        "llama: the mesh --dp {} x --ep {} x --cp {} x --tp {} has {} ranks, but the world has {}",
        c.dp, c.ep, c.cp, c.tp, ranks, world.size());
  }
  // Mesh dims of size 1 are left out, except dp (the batch) and ep with experts (the MoE layer's
  // dim); tp innermost (the most traffic), as torchtitan orders them.
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (const auto& [name, size] :
       {std::pair<std::string, int64_t>{"dp", c.dp}, {"ep", c.ep}, {"cp", c.cp}, {"tp", c.tp}}) {
    if (size > 1 || name == "dp" || (name == "ep" && c.experts > 0)) {
      sizes.push_back(size);
      names.push_back(name);
    }
  }
  const DeviceMesh mesh = init_device_mesh(world, sizes, names);
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
    if (c.cp > 1) {
      fmt::print("       context parallel over cp = {}: {} attention, sequence in {} order\n", c.cp,
                 c.cp_method, order.empty() ? "contiguous" : "zigzag (head-tail)");
    }
    fmt::print("       key/value heads {} over tp\n",
               layout.kv_replicated ? "replicated (fewer than tp)" : "split");
    fmt::print("\n== mesh {}{}\n{}", mesh.layout(), c.fsdp ? ", FSDP over dp" : "",
               world.size() <= 64 ? mesh.to_grid() : std::string("(grid not drawn)\n"));
  }

  Model<DTensor> model = init_model<DTensor>(c, &layout);
  // Each sequence index's position (zigzag over cp), split over cp like the sequence.
  std::vector<int64_t> positions = order;
  if (positions.empty()) {
    for (int64_t i = 0; i < c.seq; ++i) positions.push_back(i);
  }
  Placements seq_placements = replicate_placements(mesh);
  if (layout.has("cp")) seq_placements = placed_on(mesh, "cp", Shard{0});
  const Parallel par{&layout,
                     distribute_tensor(from_vector(positions, {c.seq}), mesh, seq_placements),
                     c.cp_method, order};
  trace().clear();
  std::vector<double> losses;
  if (dry_run) {
    const char* device_file = std::getenv("SPMD_DEVICE");
    DryRun dry(world, device_file != nullptr ? DeviceSpec::load(device_file) : DeviceSpec{});
    losses = train(c, text, par, model, &layout, &dry);
  } else {
    losses = train(c, text, par, model, &layout);
  }
  section(world, "collectives of the training steps (this process's trace)");
  if (coordinator) fmt::print("{}", trace().summary_table());

  std::vector<double> single;
  if (c.check) {
    Model<Tensor> one = init_model<Tensor>(c, nullptr);
    std::vector<int64_t> in_order(static_cast<size_t>(c.seq));
    for (int64_t i = 0; i < c.seq; ++i) in_order[static_cast<size_t>(i)] = i;
    single = train(c, text, Single{from_vector(in_order, {c.seq})}, one, nullptr);
  }
  const double tolerance = c.dtype == DType::F64 ? 1e-9 : c.dtype == DType::F32 ? 1e-4 : 5e-2;
  section(world, "loss per step");
  if (coordinator) {
    fmt::print("{:>4}  {:>16}{}\n", "step", "mesh",
               c.check ? fmt::format("  {:>16}  {:>10}", "one device", "|diff|") : "");
  }
  double worst = 0.0;
  for (int64_t s = 0; s < c.steps; ++s) {
    const double loss = losses[static_cast<size_t>(s)];
    std::string line = fmt::format("{:>4}  {:>16.10f}", s, loss);
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
          "{:.0e})\n",
          pass ? "PASS" : "FAIL", worst, tolerance);
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
