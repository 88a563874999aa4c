// examples/gpt.cpp: a small GPT trained on 8 simulated ranks, twice: tensor + sequence parallel
// on a (dp=2, tp=4) mesh, and FSDP x TP on the same mesh; every step's loss is checked against
// the same model trained on one device.
//
//   ./gpt                                     # sim: 8 ranks in this process, mesh (dp=2, tp=4)
//   ./gpt --spmd-backend=threads              # one thread per rank, the same digest
//   mpirun -n 8 ./gpt --spmd-backend=mpi      # one process per rank, the same digest
//   ./gpt --layers 4 --d-model 128 --heads 8 --seq 64 --steps 20 --dtype f32
//
// The model is GPT-2's shape at toy size: byte tokens (vocabulary 256) from
// examples/data/gpt_corpus.txt, learned position embeddings, pre-norm blocks (layer_norm, causal
// multi-head attention, a GELU MLP), a final norm and an output layer, dropout after the
// embeddings and each sublayer, cross-entropy on the next byte, AdamW with gradient clipping. It
// is written once, as a template over the tensor type: Tensor for the single-device run, DTensor
// for the parallel ones, where the parallel styles of nn/parallel.h add the redistributions:
//
//   tokens [B, S]         S(0) over dp (data parallel), Replicate over tp
//   embedding             the table [V, d] split by rows over tp (vocabulary parallel): P(sum),
//                         reduce_scatter into the sequence-parallel layout S(1) over tp
//   norms, dropout, adds  sequence parallel: [B, S, d] sharded S(0) over dp, S(1) over tp
//   attention, MLP        q, k, v and the first MLP weight column-wise over tp (S(1)): the
//                         sequence is gathered once per sublayer (all_gather), heads split over
//                         tp; the output projections row-wise (S(0)): reduce_scatter back
//   output layer          column-wise over the vocabulary: logits S(2) over tp, and the
//                         cross-entropy is Megatron's vocabulary-parallel one: never gathered
//   FSDP x TP             every parameter also split over dp (its first dim free of tp), gathered
//                         before each use; its gradient is reduce-scattered back by autograd
//
// The weights come from mesh-invariant random DTensors and dropout draws mesh-invariant masks,
// so all three runs start from the same model and drop the same activations: their losses agree
// to rounding (F64: 1e-9, F32: 1e-5). Flags set the model's shape (--layers, --d-model, --heads,
// --seq, --vocab, --batch, --dtype f32|f64|bf16) and nothing is allocated before the run; the
// single-device check (--check, on by default) needs the full model in one process.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spmd/spmd.h>

#include "gpt_model.h"

using namespace spmd;
using namespace gpt_model;

namespace {

// ---- flags --------------------------------------------------------------------------------------

constexpr const char* kUsage =
    "gpt [--layers N] [--d-model N] [--heads N] [--seq N] [--vocab N] [--batch N] [--steps N]\n"
    "    [--tp N] [--lr X] [--dropout P] [--clip X] [--dtype f32|f64|bf16] [--mode sp|fsdp|both]\n"
    "    [--no-check] [--data FILE] [--seed N]   (and the --spmd-* flags of launch())";

int64_t parse_int(const std::string& flag, const std::string& value) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v <= 0) {
    throw_error<ConfigError>("gpt: {} needs a positive integer, got '{}'\n{}", flag, value, kUsage);
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
  throw_error<ConfigError>("gpt: {} needs a non-negative number, got '{}'\n{}", flag, value,
                           kUsage);
}

Config parse_flags(int argc, char** argv) {
  Config c;
  c.data = SPMD_GPT_DATA;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-check") {
      c.check = false;
      continue;
    }
    if (flag == "-h" || flag == "--help") throw_error<ConfigError>("{}", kUsage);
    if (i + 1 >= argc) throw_error<ConfigError>("gpt: {} needs a value\n{}", flag, kUsage);
    const std::string value = argv[++i];
    if (flag == "--layers") {
      c.layers = parse_int(flag, value);
    } else if (flag == "--d-model") {
      c.d_model = parse_int(flag, value);
    } else if (flag == "--heads") {
      c.heads = parse_int(flag, value);
    } else if (flag == "--seq") {
      c.seq = parse_int(flag, value);
    } else if (flag == "--vocab") {
      c.vocab = parse_int(flag, value);
    } else if (flag == "--batch") {
      c.batch = parse_int(flag, value);
    } else if (flag == "--tp") {
      c.tp = parse_int(flag, value);
    } else if (flag == "--steps") {
      c.steps = parse_int(flag, value);
    } else if (flag == "--seed") {
      c.seed = static_cast<uint64_t>(parse_int(flag, value));
    } else if (flag == "--lr") {
      c.lr = parse_real(flag, value);
    } else if (flag == "--dropout") {
      c.dropout = parse_real(flag, value);
    } else if (flag == "--clip") {
      c.clip = parse_real(flag, value);
    } else if (flag == "--dtype") {
      if (value == "f32") {
        c.dtype = DType::F32;
      } else if (value == "f64") {
        c.dtype = DType::F64;
      } else if (value == "bf16") {
        c.dtype = DType::BF16;
      } else {
        throw_error<ConfigError>("gpt: --dtype takes f32, f64 or bf16, got '{}'", value);
      }
    } else if (flag == "--mode") {
      if (value != "sp" && value != "fsdp" && value != "both") {
        throw_error<ConfigError>("gpt: --mode takes sp, fsdp or both, got '{}'", value);
      }
      c.mode = value;
    } else if (flag == "--data") {
      c.data = value;
    } else {
      throw_error<ConfigError>("gpt: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  if (c.d_model % c.heads != 0) {
    throw_error<ConfigError>("gpt: --d-model {} must be a multiple of --heads {}", c.d_model,
                             c.heads);
  }
  if (c.dropout >= 1.0) throw_error<ConfigError>("gpt: --dropout must be below 1");
  return c;
}

// ---- data ---------------------------------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error<ConfigError>("gpt: cannot read the training text '{}' (--data)", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- the program ------------------------------------------------------------------------------

void section(const World& world, const std::string& title) {
  if (world.is_coordinator()) fmt::print("\n== {}\n", title);
}

int gpt(World& world, Config c) {
  if (c.tp == 0 && (world.size() < 2 || world.size() % 2 != 0)) {
    throw_error<ConfigError>("gpt runs on a (dp=2, tp) mesh and needs an even world size, got {}",
                             world.size());
  }
  const int64_t tp = c.tp != 0 ? c.tp : world.size() / 2;
  if (world.size() % tp != 0) {
    throw_error<ConfigError>("gpt: --tp {} does not divide the world size {}", tp, world.size());
  }
  const DeviceMesh mesh = init_device_mesh(world, {world.size() / tp, tp}, {"dp", "tp"});
  // A shape-only dry run (--spmd-tensors=meta) has no losses to compare: it checks shapes and
  // issues every collective of the real run.
  const bool dry_run = meta_tensors();
  if (dry_run) c.check = false;
  const std::string text = read_text(c.data);
  const bool coordinator = world.is_coordinator();
  if (coordinator) {
    fmt::print("gpt: {} layers, d_model {}, {} heads, sequence {}, vocabulary {}, batch {}, {}\n",
               c.layers, c.d_model, c.heads, c.seq, c.vocab, c.batch, c.dtype);
    fmt::print("     {} steps of AdamW (lr {}), dropout {}, {} ranks, backend {}\n", c.steps, c.lr,
               c.dropout, world.size(), world.backend_name());
    fmt::print("     text: {} ({} bytes)\n", c.data, text.size());
    fmt::print("\n== mesh, layout {}\n{}", mesh.layout(),
               world.size() <= 64 ? mesh.to_grid() : std::string("(grid not drawn)\n"));
  }

  struct Run {
    std::string name;
    bool fsdp;
    std::vector<double> losses;
    Model<DTensor> model;
  };
  std::vector<Run> runs;
  if (c.mode != "fsdp") runs.push_back({"TP + SP", false, {}, {}});
  if (c.mode != "sp") runs.push_back({"FSDP x TP + SP", true, {}, {}});
  std::string comm;
  for (Run& run : runs) {
    const ModelLayout layout{mesh, run.fsdp};
    run.model = init_model<DTensor>(c, &layout);
    if (coordinator) {
      section(world, fmt::format("{}: where the parameters live", run.name));
      const Block<DTensor>& b = run.model.blocks.front();
      const VisualizeOptions small{.max_width = 48, .max_height = 4};
      auto show = [&](const char* what, const DTensor& p) {
        fmt::print("{} {} {}\n{}\n", what, shape_str(p.shape()), to_string(p.placements()),
                   visualize_sharding(p, small));
      };
      show("token embedding (vocabulary parallel)", run.model.wte);
      show("attention query (column-wise: heads over tp)", b.wq);
      show("MLP output (row-wise)", b.w2);
    }
    trace().clear();
    if (dry_run) {
      // The dry run's report: memory per rank, collectives per mesh dim, estimated step time
      // (--spmd-topology, SPMD_DEVICE for the device file; docs/dry-run.md).
      const char* device_file = std::getenv("SPMD_DEVICE");
      DryRun dry(world, device_file != nullptr ? DeviceSpec::load(device_file) : DeviceSpec{});
      std::vector<DTensor*> params = run.model.params();
      AdamW<DTensor> opt(params, adamw_options(c));
      std::vector<DTensor> grads;
      for (int64_t step = 0; step < c.steps; ++step) {
        // train_step's calls, with the gradients kept for the memory report.
        const DTensor tokens = place_tokens<DTensor>(batch_tokens(c, text, step), &layout);
        const DTensor loss = forward(c, Parallel{run.fsdp}, run.model, tokens, step);
        run.losses.push_back(scalar(loss));
        backward(loss);
        grads.clear();
        for (DTensor* p : params) grads.push_back(p->grad());
        clip_grad_norm(params, c.clip);
        opt.step();
      }
      MemoryParts parts;
      for (size_t i = 0; i < params.size(); ++i) {
        parts.parameters.push_back(params[i]);
        parts.gradients.push_back(&grads[i]);
        parts.optimizer_state.push_back(&opt.exp_avg(i));
        parts.optimizer_state.push_back(&opt.exp_avg_sq(i));
      }
      const DryRunReport report = dry.report(parts);
      if (coordinator) fmt::print("\n== {}: dry-run report\n{}", run.name, report.table());
      if (const char* path = std::getenv("SPMD_DRY_RUN_REPORT")) {
        std::ofstream(fmt::format("{}.{}.json", path, run.fsdp ? "fsdp" : "sp")) << report.json();
        dry.write_timeline(fmt::format("{}.{}.timeline.json", path, run.fsdp ? "fsdp" : "sp"));
      }
    } else {
      run.losses = train(c, text, Parallel{run.fsdp}, run.model, &layout);
    }
    comm += fmt::format("{}, {} steps:\n{}", run.name, c.steps, trace().summary_table());
  }
  section(world, "collectives of the training steps (this process's trace)");
  if (coordinator) fmt::print("{}", comm);

  std::vector<double> single;
  if (c.check) {
    Model<Tensor> model = init_model<Tensor>(c, nullptr);
    single = train(c, text, Single{}, model, nullptr);
  }
  const double tolerance = c.dtype == DType::F64 ? 1e-9 : c.dtype == DType::F32 ? 1e-5 : 5e-2;
  section(world, "loss per step");
  if (coordinator) {
    std::string header = fmt::format("{:>4}", "step");
    for (const Run& run : runs) header += fmt::format("  {:>16}", run.name);
    if (c.check) header += fmt::format("  {:>16}  {:>10}", "one device", "max |diff|");
    fmt::print("{}\n", header);
  }
  double worst = 0.0;
  for (int64_t s = 0; s < c.steps; ++s) {
    std::string line = fmt::format("{:>4}", s);
    double diff = 0.0;
    for (const Run& run : runs) {
      const double loss = run.losses[static_cast<size_t>(s)];
      line += fmt::format("  {:>16.10f}", loss);
      if (c.check) diff = std::max(diff, std::abs(loss - single[static_cast<size_t>(s)]));
    }
    if (c.check)
      line += fmt::format("  {:>16.10f}  {:>10.3g}", single[static_cast<size_t>(s)], diff);
    worst = std::max(worst, diff);
    if (coordinator) fmt::print("{}\n", line);
  }
  bool falls = true;
  for (const Run& run : runs) falls = falls && run.losses.back() < run.losses.front();
  const bool pass = dry_run || (falls && (!c.check || worst <= tolerance));
  if (coordinator && dry_run) {
    fmt::print(
        "\ndry run (--spmd-tensors=meta): shapes checked and every collective issued; no "
        "values, so no losses\n");
  } else if (coordinator) {
    fmt::print("\nloss falls: {} ({:.4f} -> {:.4f})\n", falls ? "yes" : "NO",
               runs.front().losses.front(), runs.front().losses.back());
    if (c.check) {
      fmt::print(
          "check: {} (every step's loss against one device: max |diff| {:.3g}, tolerance "
          "{:.0e})\n",
          pass ? "PASS" : "FAIL", worst, tolerance);
    } else {
      fmt::print("check: {} (the loss falls; single-device check off)\n", pass ? "PASS" : "FAIL");
    }
  }
  std::vector<LocalTensor> digest_of;
  for (const Run& run : runs) {
    digest_of.push_back(LocalTensor::replicate(world, from_vector(run.losses)));
    Model<DTensor> model = run.model;
    for (DTensor* p : model.params()) digest_of.push_back(p->local());
  }
  print_digest(world, digest_of);
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) { return gpt(world, parse_flags(argc, argv)); });
}
