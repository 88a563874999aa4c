// examples/gpt.cpp: a small GPT trained on 8 simulated ranks, twice: tensor + sequence parallel
// on a (dp=2, tp=4) mesh, and FSDP x TP on the same mesh; every step's loss is checked against
// the same model trained on one device. With --pp, also pipeline parallel: mesh (pp, dp, tp).
//
//   ./gpt                                     # sim: 8 ranks in this process, mesh (dp=2, tp=4)
//   ./gpt --spmd-backend=threads              # one thread per rank, the same digest
//   mpirun -n 8 ./gpt --spmd-backend=mpi      # one process per rank, the same digest
//   ./gpt --layers 4 --d-model 128 --heads 8 --seq 64 --steps 20 --dtype f32
//   ./gpt --pp 2 --schedule 1f1b              # mesh (pp=2, dp=2, tp=2), 4 microbatches
//   ./gpt --pp 4 --tp 2 --schedule interleaved   # (pp=4, dp=1, tp=2), 8 stages of one block
//   ./gpt --steps 2 --save ckpt && ./gpt --steps 2 --load ckpt --tp 2
//                                             # two steps, then two more on (dp=4, tp=2)
//   ./gpt --accumulate 2 --recompute          # 2 microbatches a step, blocks recomputed
//
// Pipeline parallelism (--pp N --schedule gpipe|1f1b|interleaved|zb --microbatches M
// --virtual-stages V, V = 2 by default for interleaved): the model is cut into N x V stages,
// the embeddings in the first, the final norm, the output layer and the loss in the last, the
// blocks split evenly (--layers defaults to one per stage; a count that does not split is a
// ConfigError). Each stage runs the code below on its own (dp, tp) mesh, run_pipeline
// (pipeline/runner.h) moves the activations between stages, and the dp gradient reduction, the
// clipping (its norm over every stage) and AdamW follow once per step; the single-device check
// runs the same microbatches with the same dropout masks (Note [GPT pipeline]).
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
// Training state (docs/training.md): --save DIR writes the first mesh run's model and AdamW state
// after its last step (spmd::checkpoint, nn/checkpoint.h); --load DIR starts every run, and the
// single-device check, from such a checkpoint, saved on any mesh, and numbers the steps from the
// saved one. --recompute recomputes every block's activations in backward (checkpoint_activations,
// Note [Recompute]). --accumulate N splits each step's batch into N microbatches, each dropping
// its rows of what the whole batch drops (DropoutRows), and accumulates their gradients under
// no_sync, so every gradient is reduced once per step (Note [No sync]): the losses are those
// without --accumulate, to rounding.
// --save, --load and --accumulate run without --pp (a pipeline microbatches already).
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
#include <variant>
#include <vector>

#include <spmd/pipeline/runner.h>
#include <spmd/spmd.h>

#include "gpt_model.h"

using namespace spmd;
using namespace gpt_model;

namespace {

// ---- flags --------------------------------------------------------------------------------------

constexpr const char* kUsage =
    "gpt [--layers N] [--d-model N] [--heads N] [--seq N] [--vocab N] [--batch N] [--steps N]\n"
    "    [--tp N] [--lr X] [--dropout P] [--clip X] [--dtype f32|f64|bf16] [--master-dtype "
    "f32|f64]\n"
    "    [--mode sp|fsdp|both]\n"
    "    [--pp N] [--schedule gpipe|1f1b|interleaved|zb] [--microbatches N] [--virtual-stages N]\n"
    "    [--no-check] [--data FILE] [--seed N] [--save DIR] [--load DIR] [--recompute]\n"
    "    [--accumulate N]   (and the --spmd-* flags of launch())";

// --dtype and --master-dtype: f32, f64 or bf16.
DType float_dtype(const std::string& flag, const std::string& value) {
  if (value == "f32") return DType::F32;
  if (value == "f64") return DType::F64;
  if (value == "bf16") return DType::BF16;
  throw_error<ConfigError>("gpt: {} takes f32, f64 or bf16, got '{}'", flag, value);
}

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
  bool layers_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-check") {
      c.check = false;
      continue;
    }
    if (flag == "--recompute") {
      c.recompute = true;
      continue;
    }
    if (flag == "-h" || flag == "--help") throw_error<ConfigError>("{}", kUsage);
    if (i + 1 >= argc) throw_error<ConfigError>("gpt: {} needs a value\n{}", flag, kUsage);
    const std::string value = argv[++i];
    if (flag == "--layers") {
      c.layers = parse_int(flag, value);
      layers_given = true;
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
    } else if (flag == "--pp") {
      c.pp = parse_int(flag, value);
    } else if (flag == "--schedule") {
      c.schedule = value;
    } else if (flag == "--microbatches") {
      c.microbatches = parse_int(flag, value);
    } else if (flag == "--virtual-stages") {
      c.virtual_stages = parse_int(flag, value);
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
      c.dtype = float_dtype(flag, value);
    } else if (flag == "--master-dtype") {
      c.master_dtype = float_dtype(flag, value);
    } else if (flag == "--mode") {
      if (value != "sp" && value != "fsdp" && value != "both") {
        throw_error<ConfigError>("gpt: --mode takes sp, fsdp or both, got '{}'", value);
      }
      c.mode = value;
    } else if (flag == "--data") {
      c.data = value;
    } else if (flag == "--save") {
      c.save = value;
    } else if (flag == "--load") {
      c.load = value;
    } else if (flag == "--accumulate") {
      c.accumulate = parse_int(flag, value);
    } else {
      throw_error<ConfigError>("gpt: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  if (c.d_model % c.heads != 0) {
    throw_error<ConfigError>("gpt: --d-model {} must be a multiple of --heads {}", c.d_model,
                             c.heads);
  }
  if (c.dropout >= 1.0) throw_error<ConfigError>("gpt: --dropout must be below 1");
  if (c.pp > 1 && (c.accumulate > 1 || !c.save.empty() || !c.load.empty())) {
    throw_error<ConfigError>(
        "gpt: --accumulate, --save and --load run without --pp (a pipeline splits each batch "
        "into --microbatches already, and its stages hold their own parameters)");
  }
  if (c.pp > 1 && c.recompute && c.schedule == "zb") {
    throw_error<ConfigError>(
        "gpt: --recompute with --pp runs the gpipe, 1f1b and interleaved schedules (zb splits each "
        "backward in two, and a recomputed block would run its forward twice)");
  }
  if (c.batch % c.accumulate != 0) {
    throw_error<ConfigError>("gpt: --batch {} must split into --accumulate {} microbatches",
                             c.batch, c.accumulate);
  }
  if (c.virtual_stages == 0) c.virtual_stages = c.schedule == "interleaved" ? 2 : 1;
  // Without --layers, a pipeline gets one block per stage (at least the default 2).
  if (!layers_given && c.pp > 1) c.layers = std::max(c.layers, c.pp * c.virtual_stages);
  return c;
}

// ---- data ---------------------------------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error<ConfigError>("gpt: cannot read the training text '{}' (--data)", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- pipeline parallelism -----------------------------------------------------------------------

// Note [GPT pipeline]
// With --pp above 1 the mesh is (pp, dp, tp) and the model is cut into pp x virtual stages
// (pipeline/schedule.h): stage 0 holds the embeddings, the last one the final norm, the output
// layer and the loss, and the blocks are split evenly in order. Stage s runs on pp rank
// s % pp, whose ranks form the stage mesh (dp, tp): a root mesh of its own
// (DeviceMesh::from_ranks), so a stage's parameters live only on its ranks. Each step, run_pipeline
// (pipeline/runner.h) runs the schedule; a stage's forward takes the runner's LocalTensor into a
// DTensor (from_local: the tokens S(0), R; an activation the sequence-parallel layout S(0), S(1)),
// runs the model's own code on it, and hands the result back (to_local). The stage sees its
// parameters through LocalTensor leaves, one per parameter and step, made DTensors with a
// gradient Partial over dp: the microbatches' gradients add up locally, and after the pipeline
// one all_reduce per parameter over dp reduces them (FSDP's reduce_scatter runs inside each
// backward, as its gather runs inside each forward). The gradient norm adds every stage's
// squares (an all_reduce over pp), and one AdamW step follows, as on one device, whose reference
// run splits each batch into the same microbatches with the same dropout masks
// (train_microbatched, Note [Dropout sites]).

struct PipelineSetup {
  pipeline::Schedule schedule;
  int64_t dp = 1, tp = 1;
  std::vector<DeviceMesh> meshes;  // per pp rank: the stage mesh (dp, tp)
  int64_t blocks_per_stage = 0;

  int stages() const { return schedule.stages(); }
  // The stage holding layer `layer` (-1: the embeddings; the layer count: the head).
  int stage_of(int64_t layer) const {
    if (layer < 0) return 0;
    return static_cast<int>(std::min<int64_t>(layer / blocks_per_stage, stages() - 1));
  }
  const DeviceMesh& mesh_of(int stage) const {
    return meshes[static_cast<size_t>(schedule.rank_of_stage(stage))];
  }
};

PipelineSetup make_pipeline(const Config& c, const DeviceMesh& mesh) {
  PipelineSetup setup;
  setup.schedule =
      pipeline::make_schedule(c.schedule, static_cast<int>(c.pp), static_cast<int>(c.microbatches),
                              static_cast<int>(c.virtual_stages));
  const int64_t stages = setup.stages();
  if (c.layers % stages != 0) {
    throw_error<ConfigError>(
        "gpt: --layers {} does not split into {} pipeline stages (--pp {} x {} virtual stages): "
        "every stage needs the same number of blocks; try --layers {}",
        c.layers, stages, c.pp, c.virtual_stages, stages * std::max<int64_t>(1, c.layers / stages));
  }
  setup.blocks_per_stage = c.layers / stages;
  setup.dp = mesh.size("dp");
  setup.tp = mesh.size("tp");
  if (c.batch % c.microbatches != 0 || (c.batch / c.microbatches) % setup.dp != 0) {
    throw_error<ConfigError>(
        "gpt: --batch {} must split into --microbatches {} of a multiple of dp = {} rows each",
        c.batch, c.microbatches, setup.dp);
  }
  if (c.seq % setup.tp != 0) {
    throw_error<ConfigError>("gpt: --seq {} must be a multiple of tp = {} (sequence parallel)",
                             c.seq, setup.tp);
  }
  // Rank ids are values, also in a dry run (--spmd-tensors=meta).
  const MetaTensorsScope real(false);
  const Tensor table = mesh.rank_table();
  for (int64_t p = 0; p < c.pp; ++p) {
    const Tensor ranks = table.select(0, p).contiguous();
    setup.meshes.push_back(DeviceMesh::from_ranks(mesh.world(), ranks, {"dp", "tp"}));
  }
  // Under mpi creating a communicator is collective over every process: all of them create every
  // stage mesh's, in the same order, before any stage communicates; the debug checks'
  // (--spmd-debug) too, which they would otherwise create at a stage's first op, on its ranks only.
  for (const DeviceMesh& m : setup.meshes) {
    for (int d = 0; d < m.ndim(); ++d) (void)communicator(m, d);
    create_debug_communicators(m);
  }
  return setup;
}

// A stage's view of parameter p: the gradient Partial over dp where p is replicated there, so the
// microbatches' gradients are reduced once per step (Note [GPT pipeline]).
Placements grad_placements(const DTensor& p) {
  Placements out = p.placements();
  if (std::holds_alternative<Replicate>(out[0])) out[0] = Partial{};
  return out;
}

// Trains c.steps steps by the pipeline; returns each step's loss (on every process).
std::vector<double> train_pipeline(World& world, const Config& c, const std::string& text,
                                   const Parallel& par, const DeviceMesh& mesh,
                                   const PipelineSetup& setup, Model<DTensor>& model,
                                   pipeline::PipelineStep* last_step = nullptr) {
  const Config mc = microbatch_config(c);
  const pipeline::Schedule& schedule = setup.schedule;
  const int last = setup.stages() - 1;
  const std::vector<int64_t> layer_of = param_layers(c);
  std::vector<DTensor*> params = model.params();
  std::vector<std::vector<size_t>> own(static_cast<size_t>(setup.stages()));
  for (size_t i = 0; i < params.size(); ++i) {
    own[static_cast<size_t>(setup.stage_of(layer_of[i]))].push_back(i);
  }
  const Placements sp = {Shard{0}, Shard{1}};
  const Placements batch_rows = {Shard{0}, Replicate{}};
  AdamW<DTensor> opt(params, adamw_options(c));
  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    const Tensor batch = batch_tokens(c, text, step);
    std::vector<LocalTensor> leaves(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i]->participates()) continue;
      leaves[i] = params[i]->local().detach();
      leaves[i].requires_grad_();
    }
    std::optional<Placements> logits_placements;
    auto tokens_of = [&](int mb, const DeviceMesh& on) {
      return distribute_tensor(microbatch_tokens(c, batch, mb), on, batch_rows);
    };
    pipeline::PipelineModel pm;
    for (int s = 0; s <= last; ++s) {
      pipeline::PipelineStage stage;
      for (size_t i : own[static_cast<size_t>(s)]) {
        if (leaves[i].defined()) stage.parameters.push_back(&leaves[i]);
      }
      stage.input_shape = {mc.batch / setup.dp, c.seq / setup.tp, c.d_model};
      stage.input_dtype = c.dtype;
      stage.forward = [&, s](const LocalTensor& input) {
        // The runner names the microbatch it runs (Note [Pipeline context]): its dropout masks.
        const int mb = pipeline_context().microbatch;
        const int64_t mb_step = microbatch_step(c, step, mb);
        const DeviceMesh& on = setup.mesh_of(s);
        Model<DTensor> m = model;
        const std::vector<DTensor*> views = m.params();
        for (size_t i : own[static_cast<size_t>(s)]) {
          const DTensor& p = *params[i];
          *views[i] = DTensor::from_local(leaves[i], p.mesh(), p.placements(), p.shape(),
                                          grad_placements(p));
        }
        DTensor x =
            s == 0 ? embed(mc, par, m,
                           DTensor::from_local(input, on, batch_rows, Shape{mc.batch, c.seq + 1}),
                           mb_step)
                   : DTensor::from_local(input, on, sp, Shape{mc.batch, c.seq, c.d_model});
        const int64_t first = s * setup.blocks_per_stage;
        for (int64_t l = first; l < first + setup.blocks_per_stage; ++l) {
          const Block<DTensor>& b = m.blocks[static_cast<size_t>(l)];
          if (!mc.recompute) {
            x = block(mc, par, b, l, x, mb_step);
            continue;
          }
          // --recompute: as forward() does; the block's parameters are copied (m is this
          // action's), the recompute runs in the microbatch's backward action.
          const std::function<DTensor(const std::vector<DTensor>&)> fn =
              [&mc, &par, b, l, mb_step](const std::vector<DTensor>& in) {
                return block(mc, par, b, l, in[0], mb_step);
              };
          x = checkpoint_activations(fn, {x});
        }
        if (s != last) return x.redistribute(sp).to_local();
        const DTensor logits = logits_of(par, m, x);
        logits_placements = logits.placements();
        return logits.to_local();
      };
      pm.stages.push_back(std::move(stage));
    }
    pm.input = [&](int mb, const std::vector<int>&) {
      return tokens_of(mb, setup.meshes.front()).local();
    };
    pm.loss = [&](const LocalTensor& logits, int mb) {
      const DeviceMesh& on = setup.mesh_of(last);
      const DTensor loss = next_token_loss(
          mc, DTensor::from_local(logits, on, *logits_placements, Shape{mc.batch, c.seq, c.vocab}),
          tokens_of(mb, on));
      return loss.redistribute(replicate_placements(on)).to_local();
    };
    const pipeline::PipelineStep ran = pipeline::run_pipeline(pm, schedule, mesh, "pp");
    if (last_step != nullptr) *last_step = ran;
    // A dry run (--spmd-tensors=meta) issues every op and collective below on shapes; the norm
    // and the loss have no values.
    const bool shapes_only = meta_tensors();

    // The dp reduction of every gradient, then the norm over every stage's squares.
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
      DTensor& acc =
          squares[static_cast<size_t>(schedule.rank_of_stage(setup.stage_of(layer_of[i])))];
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

// ---- the program ------------------------------------------------------------------------------

void section(const World& world, const std::string& title) {
  if (world.is_coordinator()) fmt::print("\n== {}\n", title);
}

int gpt(World& world, Config c) {
  const int64_t n = world.size();
  if (c.tp == 0 && (n % c.pp != 0 || n / c.pp < 2 || (n / c.pp) % 2 != 0)) {
    throw_error<ConfigError>(
        "gpt runs on a (dp=2, tp) mesh per pipeline rank and needs a world size that --pp {} "
        "divides into an even count, got {} (or give --tp)",
        c.pp, n);
  }
  const int64_t tp = c.tp != 0 ? c.tp : n / c.pp / 2;
  if (n % (c.pp * tp) != 0) {
    throw_error<ConfigError>("gpt: --pp {} x --tp {} does not divide the world size {}", c.pp, tp,
                             n);
  }
  // Megatron's and torchtitan's order: tp the innermost dim (neighbouring ranks, the most
  // traffic), pp the outermost (the least: one activation per microbatch and stage).
  const DeviceMesh mesh =
      c.pp > 1 ? init_device_mesh(world, {c.pp, n / c.pp / tp, tp}, {"pp", "dp", "tp"})
               : init_device_mesh(world, {n / tp, tp}, {"dp", "tp"});
  const bool pipelined = c.pp > 1;
  std::optional<PipelineSetup> setup;
  if (pipelined) setup = make_pipeline(c, mesh);
  // A shape-only dry run (--spmd-tensors=meta) has no losses to compare: it checks shapes and
  // issues every collective of the real run.
  const bool dry_run = meta_tensors();
  if (dry_run) c.check = false;
  if (dry_run && (!c.save.empty() || !c.load.empty())) {
    throw_error<ConfigError>("gpt: --save and --load run outside a dry run (it has no values)");
  }
  if (!pipelined && (c.batch / c.accumulate) % mesh.size("dp") != 0) {
    throw_error<ConfigError>(
        "gpt: --batch {} must split into --accumulate {} microbatches of a multiple of dp = {} "
        "rows each",
        c.batch, c.accumulate, mesh.size("dp"));
  }
  const std::string text = read_text(c.data);
  const bool coordinator = world.is_coordinator();
  if (coordinator) {
    fmt::print("gpt: {} layers, d_model {}, {} heads, sequence {}, vocabulary {}, batch {}, {}\n",
               c.layers, c.d_model, c.heads, c.seq, c.vocab, c.batch, c.dtype);
    fmt::print("     {} steps of AdamW (lr {}), dropout {}, {} ranks, backend {}\n", c.steps, c.lr,
               c.dropout, world.size(), world.backend_name());
    fmt::print("     text: {} ({} bytes)\n", c.data, text.size());
    if (c.accumulate > 1) {
      fmt::print(
          "     gradient accumulation: {} microbatches of {} rows a step, all but the last "
          "backward under no_sync\n",
          c.accumulate, c.batch / c.accumulate);
    }
    if (c.recompute) fmt::print("     every block's activations recomputed in backward\n");
    if (!c.load.empty()) fmt::print("     resumed from {}\n", c.load);
    if (pipelined) {
      fmt::print(
          "     pipeline: schedule {}, {} microbatches of {} rows, {} stages ({} pp ranks x {} "
          "virtual), blocks per stage: {}\n",
          c.schedule, c.microbatches, c.batch / c.microbatches, setup->stages(), c.pp,
          c.virtual_stages, setup->blocks_per_stage);
    }
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
  int64_t first_step = 0;  // the first step's number: the loaded one with --load
  for (Run& run : runs) {
    const ModelLayout layout{mesh, run.fsdp};
    std::vector<ModelLayout> stage_layouts;
    if (pipelined) {
      for (const DeviceMesh& m : setup->meshes) stage_layouts.push_back(ModelLayout{m, run.fsdp});
      run.model = init_model<DTensor>(c, [&](int64_t layer) {
        return &stage_layouts[static_cast<size_t>(
            setup->schedule.rank_of_stage(setup->stage_of(layer)))];
      });
    } else {
      run.model = init_model<DTensor>(c, &layout);
    }
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
      if (pipelined) {
        // With pp: the last step's in-flight activations per pp rank, and its pipelined time
        // (Note [Dry-run estimates]).
        pipeline::PipelineStep step;
        run.losses = train_pipeline(world, c, text, Parallel{run.fsdp, policy_of(c), false}, mesh,
                                    *setup, run.model, &step);
        MemoryParts parts;
        for (DTensor* p : params) parts.parameters.push_back(p);
        parts.pipeline = &step;
        const DryRunReport report = dry.report(parts);
        if (coordinator) fmt::print("\n== {}: dry-run report\n{}", run.name, report.table());
        if (const char* path = std::getenv("SPMD_DRY_RUN_REPORT"); path != nullptr && coordinator) {
          std::ofstream(fmt::format("{}.{}.json", path, run.fsdp ? "fsdp" : "sp")) << report.json();
        }
        comm += fmt::format("{}, {} steps:\n{}", run.name, c.steps, trace().summary_table());
        continue;
      }
      AdamW<DTensor> opt(params, adamw_options(c));
      std::vector<DTensor> grads;  // kept for the memory report
      for (int64_t step = 0; step < c.steps; ++step) {
        // The report is of the last step, in the steady state the earlier ones left.
        if (step > 0 && step + 1 == c.steps) dry.begin_step();
        run.losses.push_back(train_step(c, Parallel{run.fsdp, policy_of(c)}, run.model, opt, params,
                                        batch_tokens(c, text, step), &layout, step, &grads));
      }
      MemoryParts parts;
      for (size_t i = 0; i < params.size(); ++i) {
        parts.parameters.push_back(params[i]);
        parts.gradients.push_back(&grads[i]);
        parts.optimizer_state.push_back(&opt.exp_avg(i));
        parts.optimizer_state.push_back(&opt.exp_avg_sq(i));
      }
      // FSDP gathers a block's parameters ahead of its compute (the prefetch window).
      if (run.fsdp) parts.prefetch_gathers = sizeof(gpt_model::Block<DTensor>) / sizeof(DTensor);
      const DryRunReport report = dry.report(parts);
      if (coordinator) fmt::print("\n== {}: dry-run report\n{}", run.name, report.table());
      if (const char* path = std::getenv("SPMD_DRY_RUN_REPORT")) {
        std::ofstream(fmt::format("{}.{}.json", path, run.fsdp ? "fsdp" : "sp")) << report.json();
        dry.write_timeline(fmt::format("{}.{}.timeline.json", path, run.fsdp ? "fsdp" : "sp"));
      }
    } else if (pipelined) {
      run.losses = train_pipeline(world, c, text, Parallel{run.fsdp, policy_of(c), false}, mesh,
                                  *setup, run.model);
    } else {
      // The first run writes the checkpoint (--save); every run starts from --load's.
      run.losses = train(c, text, Parallel{run.fsdp, policy_of(c)}, run.model, &layout, &first_step,
                         &run == &runs.front() ? c.save : std::string());
    }
    comm += fmt::format("{}, {} steps:\n{}", run.name, c.steps, trace().summary_table());
  }
  section(world, "collectives of the training steps (this process's trace)");
  if (coordinator) fmt::print("{}", comm);

  std::vector<double> single;
  if (c.check) {
    Model<Tensor> model = init_model<Tensor>(c, nullptr);
    single = pipelined ? train_microbatched(c, text, model)
                       : train(c, text, Single{policy_of(c).param_dtype}, model, nullptr);
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
    std::string line = fmt::format("{:>4}", first_step + s);
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
  for (const Run& run : runs) {
    falls = falls && (run.losses.back() < run.losses.front() || c.steps == 1);
  }
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
