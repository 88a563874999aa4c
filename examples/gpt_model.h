// examples/gpt_model.h: the GPT of examples/gpt.cpp, shared with bench/gpt_bench.cpp.
//
// One model definition, a template over the tensor type: Tensor runs it on one device, DTensor on
// a (dp, tp) mesh, where `Parallel` adds the redistributions of tensor, sequence and (optionally)
// FSDP parallelism (nn/parallel.h) and `Single` adds nothing. Parameters come from mesh-invariant
// random DTensors and dropout masks are mesh-invariant, so both runs compute the same model. A
// pipeline stage runs the pieces of forward() it holds (embed, block, logits_of,
// next_token_loss) on its own (dp, tp) mesh (examples/gpt.cpp, Note [GPT pipeline]).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <spmd/spmd.h>

namespace gpt_model {

using namespace spmd;

// The model's shape and the training run.
struct Config {
  int64_t layers = 2;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t seq = 32;
  int64_t vocab = 256;
  int64_t batch = 8;
  int64_t tp = 0;                 // the tp mesh dim's size; 0: half of what pp leaves (dp = 2)
  int64_t pp = 1;                 // pipeline stages' ranks: mesh (pp, dp, tp) when above 1
  std::string schedule = "1f1b";  // pipeline/schedule.h: gpipe, 1f1b, interleaved, zb
  int64_t microbatches = 4;       // per step, with pp above 1
  int64_t virtual_stages = 0;     // stages per pp rank; 0: 2 for interleaved, else 1
  int64_t steps = 8;
  double lr = 3e-3;
  double dropout = 0.1;
  double clip = 1.0;
  DType dtype = DType::F64;
  std::string mode = "both";  // sp, fsdp or both
  bool check = true;
  std::string data;  // the training text
  uint64_t seed = 1234;
  int64_t accumulate = 1;  // --accumulate N: microbatches a step, all but the last under no_sync
  DropoutRows rows;        // an --accumulate microbatch: its rows of the step's batch (dropout)
  bool recompute = false;  // --recompute: every block's activations recomputed in backward
  std::string save, load;  // --save DIR, --load DIR: the model and AdamW's state (nn/checkpoint.h)
  // --master-dtype: the parameters are stored and stepped in it and used in `dtype`, gradients
  // reduced in it (MixedPrecisionPolicy, Note [Mixed precision] in spmd/nn/parallel.h).
  std::optional<DType> master_dtype;
};

// ---- data ---------------------------------------------------------------------------------------

// Step `step`'s batch: B windows of S + 1 bytes (token = byte mod vocab), as [B, S + 1] I64.
inline Tensor batch_tokens(const Config& c, const std::string& text, int64_t step) {
  const int64_t span = c.seq + 1;
  // A shape-only dry run (--spmd-tensors=meta) reads no text: the tokens have no values.
  if (meta_tensors()) return zeros({c.batch, span}, DType::I64);
  const int64_t n = static_cast<int64_t>(text.size());
  if (n <= span) {
    throw_error<ConfigError>("gpt: the text has {} bytes, fewer than --seq + 1 = {}", n, span);
  }
  std::vector<int64_t> tokens;
  tokens.reserve(static_cast<size_t>(c.batch * span));
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t start = ((step * c.batch + b) * 7919) % (n - span);
    for (int64_t i = 0; i < span; ++i) {
      tokens.push_back(static_cast<unsigned char>(text[static_cast<size_t>(start + i)]) % c.vocab);
    }
  }
  return from_vector(tokens, {c.batch, span});
}

// ---- the model, once for Tensor and DTensor -------------------------------------------------

template <class T>
struct Block {
  T ln1_w, ln1_b, wq, wk, wv, wo, bo, ln2_w, ln2_b, w1, b1, w2, b2;
};

template <class T>
struct Model {
  T wte, wpe, lnf_w, lnf_b, head;
  std::vector<Block<T>> blocks;

  std::vector<T*> params() {
    std::vector<T*> out = {&wte, &wpe};
    for (Block<T>& b : blocks) {
      for (T* p : {&b.ln1_w, &b.ln1_b, &b.wq, &b.wk, &b.wv, &b.wo, &b.bo, &b.ln2_w, &b.ln2_b, &b.w1,
                   &b.b1, &b.w2, &b.b2}) {
        out.push_back(p);
      }
    }
    for (T* p : {&lnf_w, &lnf_b, &head}) out.push_back(p);
    return out;
  }
};

// What a parameter is, for its placements.
enum class Role { Vocab, Replicated, Colwise, ColwiseBias, Rowwise };

// Where the parallel runs put things: the mesh, and whether parameters are FSDP-sharded.
struct ModelLayout {
  DeviceMesh mesh;
  bool fsdp = false;

  Placements placements(Role role, const Shape& shape) const {
    Placements p = replicate_placements(mesh);
    switch (role) {
      case Role::Vocab:
      case Role::Rowwise:
        p = rowwise_placements(mesh, "tp");
        break;
      case Role::Colwise:
        p = colwise_placements(mesh, "tp");
        break;
      case Role::ColwiseBias:
        p = colwise_bias_placements(mesh, "tp");
        break;
      case Role::Replicated:
        break;
    }
    return fsdp ? fsdp_placements(p, shape, mesh, "dp") : p;
  }
};

// One parameter: normal(0, std) from `seed`, or `fill` when std is 0; mesh-invariant (a DTensor's
// pieces are the single-device tensor's blocks).
template <class T>
T make_param(const ModelLayout* layout, Role role, const Shape& shape, uint64_t seed, double std,
             double fill, DType dtype) {
  if constexpr (std::is_same_v<T, Tensor>) {
    if (std == 0.0) return full(shape, fill, dtype);
    return (randn(shape, seed, DType::F64) * std).to(dtype);
  } else {
    const Placements placements = layout->placements(role, shape);
    if (std != 0.0)
      return to(randn(shape, layout->mesh, placements, seed, DType::F64) * std, dtype);
    auto spec = std::make_shared<const DTensorSpec>(layout->mesh, placements, shape, dtype);
    return dtensor_from_blocks("make_param", spec, [&](const Shape&, const Shape& size) {
      return full(size, fill, dtype);
    });
  }
}

// The layout of layer `layer`'s parameters: -1 for the embeddings, c.layers for the final norm
// and the output layer (one layout for all without pipeline parallelism; the stage's with it).
using LayoutOf = std::function<const ModelLayout*(int64_t layer)>;

// The layer of each parameter, in params() order (-1: embeddings, c.layers: final norm and head).
inline std::vector<int64_t> param_layers(const Config& c) {
  std::vector<int64_t> out = {-1, -1};
  for (int64_t l = 0; l < c.layers; ++l) out.insert(out.end(), 13, l);
  out.insert(out.end(), 3, c.layers);
  return out;
}

template <class T>
Model<T> init_model(const Config& c, const LayoutOf& layout_of) {
  const int64_t d = c.d_model;
  const double std = 0.02;
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  uint64_t seed = c.seed;
  const ModelLayout* layout = layout_of(-1);
  auto param = [&](Role role, const Shape& shape, double s, double fill = 0.0) {
    return make_param<T>(layout, role, shape, ++seed, s, fill, c.master_dtype.value_or(c.dtype));
  };
  Model<T> m;
  m.wte = param(Role::Vocab, {c.vocab, d}, std);
  m.wpe = param(Role::Replicated, {c.seq, d}, std);
  for (int64_t l = 0; l < c.layers; ++l) {
    layout = layout_of(l);
    Block<T> b;
    b.ln1_w = param(Role::Replicated, {d}, 0.0, 1.0);
    b.ln1_b = param(Role::Replicated, {d}, 0.0);
    b.wq = param(Role::Colwise, {d, d}, std);
    b.wk = param(Role::Colwise, {d, d}, std);
    b.wv = param(Role::Colwise, {d, d}, std);
    b.wo = param(Role::Rowwise, {d, d}, out_std);
    b.bo = param(Role::Replicated, {d}, 0.0);
    b.ln2_w = param(Role::Replicated, {d}, 0.0, 1.0);
    b.ln2_b = param(Role::Replicated, {d}, 0.0);
    b.w1 = param(Role::Colwise, {d, 4 * d}, std);
    b.b1 = param(Role::ColwiseBias, {4 * d}, 0.0);
    b.w2 = param(Role::Rowwise, {4 * d, d}, out_std);
    b.b2 = param(Role::Replicated, {d}, 0.0);
    m.blocks.push_back(std::move(b));
  }
  layout = layout_of(c.layers);
  m.lnf_w = param(Role::Replicated, {d}, 0.0, 1.0);
  m.lnf_b = param(Role::Replicated, {d}, 0.0);
  m.head = param(Role::Colwise, {d, c.vocab}, std);
  for (T* p : m.params()) p->requires_grad_();
  return m;
}

template <class T>
Model<T> init_model(const Config& c, const ModelLayout* layout) {
  return init_model<T>(c, [layout](int64_t) { return layout; });
}

// The mixed-precision policy of --master-dtype: parameters used in c.dtype, gradients reduced in
// the master dtype; none without it.
inline MixedPrecisionPolicy policy_of(const Config& c) {
  if (!c.master_dtype) return {};
  return MixedPrecisionPolicy{c.dtype, c.master_dtype, std::nullopt};
}

// The redistributions of the parallel runs; nothing on one device (but the cast of
// --master-dtype's parameters to the compute dtype).
struct Single {
  std::optional<DType> param_dtype;
  Tensor use(const Tensor& p) const { return param_dtype ? p.to(*param_dtype) : p; }
  Tensor use_root(const Tensor& p) const { return use(p); }
  Tensor into_tp(const Tensor& x) const { return x; }
  Tensor out_of_tp(const Tensor& partial, const Tensor& bias) const { return partial + bias; }
  Tensor into_sp(const Tensor& x) const { return x; }
};

struct Parallel {
  bool fsdp = false;
  MixedPrecisionPolicy policy;  // --master-dtype's (policy_of); default: none
  // FSDP2's reshard_after_forward for the blocks: true, except in a pipeline (torchtitan's
  // default, which would otherwise gather every microbatch's parameters again).
  bool reshard_after_forward = true;
  // FSDP: the parameter gathered over dp before its use (cast to the policy's param_dtype first).
  DTensor use(const DTensor& p) const { return use(p, reshard_after_forward); }
  // A parameter of the root module (embeddings, final norm, head): FSDP2 keeps it gathered from
  // the forward to the backward.
  DTensor use_root(const DTensor& p) const { return use(p, false); }
  DTensor use(const DTensor& p, bool reshard) const {
    if (fsdp) return fsdp_unshard(p, "dp", policy, reshard);
    return policy.param_dtype && p.dtype() != *policy.param_dtype ? to(p, *policy.param_dtype) : p;
  }
  // Into a tensor-parallel region: the sequence gathered over tp (its gradient reduce-scattered
  // back, in the policy's reduce_dtype).
  DTensor into_tp(const DTensor& x) const {
    const Placements gathered = with_placement(x.placements(), x.mesh(), "tp", Replicate{});
    if (policy.reduce_dtype)
      return cast_redistribute(x, std::nullopt, gathered, policy.reduce_dtype);
    return x.redistribute(gathered);
  }
  // Out of it: the row-wise partial sums reduce-scattered over the sequence.
  DTensor out_of_tp(const DTensor& partial, const DTensor& bias) const {
    return sequence_parallel(partial, "tp", 1) + bias;
  }
  DTensor into_sp(const DTensor& x) const { return sequence_parallel(x, "tp", 1); }
};

// Dropout seeds: one per (step, site), the same in every run.
inline uint64_t dropout_seed(const Config& c, int64_t step, int64_t site) {
  return c.seed * 1000003ULL + static_cast<uint64_t>(step) * 1009ULL + static_cast<uint64_t>(site);
}

template <class T, class P>
T attention(const Config& c, const P& par, const Block<T>& b, const T& h) {
  const int64_t B = c.batch, S = c.seq, H = c.heads, D = c.d_model / c.heads;
  const T hg = par.into_tp(h);
  auto heads = [&](const T& w) {
    return permute(reshape(matmul(hg, par.use(w)), {B, S, H, D}), {0, 2, 1, 3});
  };
  const T o = scaled_dot_product_attention(heads(b.wq), heads(b.wk), heads(b.wv), true);
  const T merged = reshape(permute(o, {0, 2, 1, 3}), {B, S, c.d_model});
  return par.out_of_tp(matmul(merged, par.use(b.wo)), par.use(b.bo));
}

template <class T, class P>
T mlp(const P& par, const Block<T>& b, const T& h) {
  const T u = matmul(par.into_tp(h), par.use(b.w1)) + par.use(b.b1);
  return par.out_of_tp(matmul(gelu(u, GeluApproximate::Tanh), par.use(b.w2)), par.use(b.b2));
}

// The pieces of the forward, which the pipeline stages run apart (Note [Dropout sites]):
// the embeddings of tokens [B, S + 1] (the last column is only a target) ...
template <class T, class P>
T embed(const Config& c, const P& par, const Model<T>& m, const T& tokens, int64_t step) {
  const T ids = narrow(tokens, 1, 0, c.seq);
  const T x = par.into_sp(embedding(ids, par.use_root(m.wte)));
  return dropout(x + par.use_root(m.wpe), c.dropout, dropout_seed(c, step, 0), c.rows);
}

// ... block `layer` of the residual stream [B, S, d] ...
template <class T, class P>
T block(const Config& c, const P& par, const Block<T>& b, int64_t layer, const T& x, int64_t step) {
  const int64_t site = 1 + 2 * layer;
  auto drop = [&](const T& y, int64_t at) {
    return dropout(y, c.dropout, dropout_seed(c, step, at), c.rows);
  };
  const T h =
      x + drop(attention(c, par, b, layer_norm(x, par.use(b.ln1_w), par.use(b.ln1_b))), site);
  return h + drop(mlp(par, b, layer_norm(h, par.use(b.ln2_w), par.use(b.ln2_b))), site + 1);
}

// ... the final norm and the output layer: logits [B, S, V] ...
template <class T, class P>
T logits_of(const P& par, const Model<T>& m, const T& x) {
  const T h = layer_norm(x, par.use_root(m.lnf_w), par.use_root(m.lnf_b));
  return matmul(par.into_tp(h), par.use_root(m.head));
}

// ... and the mean cross-entropy of the next token.
template <class T>
T next_token_loss(const Config& c, const T& logits, const T& tokens) {
  const int64_t B = c.batch, S = c.seq;
  const T targets = reshape(narrow(tokens, 1, 1, S), {B * S});
  return cross_entropy(reshape(logits, {B * S, c.vocab}), targets);
}

// Note [Dropout sites]
// Every dropout of a forward has a site: 0 after the embeddings, 1 + 2 l and 2 + 2 l after block
// l's attention and MLP. Its mask's seed is dropout_seed(step, site), so a pipeline stage holding
// blocks 4..7 draws the masks the whole model on one device draws there. A pipeline microbatch
// draws its own (its step is microbatch_step); an --accumulate microbatch keeps the step's seeds
// and drops its rows of the whole batch's masks (Config::rows, DropoutRows).

// The loss of one batch ([B, S + 1] tokens).
template <class T, class P>
T forward(const Config& c, const P& par, const Model<T>& m, const T& tokens, int64_t step) {
  T x = embed(c, par, m, tokens, step);
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    const Block<T>& b = m.blocks[l];
    const int64_t layer = static_cast<int64_t>(l);
    if (!c.recompute) {
      x = block(c, par, b, layer, x, step);
      continue;
    }
    // --recompute: the block's activations are recomputed in backward (Note [Recompute] in
    // spmd/nn/recompute.h); its dropout masks come from explicit seeds, so both forwards agree.
    // The function runs again after forward returns: the layer and step are copied.
    const std::function<T(const std::vector<T>&)> fn = [&c, &par, &b, layer,
                                                        step](const std::vector<T>& in) {
      return block(c, par, b, layer, in[0], step);
    };
    x = checkpoint_activations(fn, {x});
  }
  return next_token_loss(c, logits_of(par, m, x), tokens);
}

// The loss's value; NaN in a shape-only dry run (--spmd-tensors=meta), which has none.
inline double scalar(const Tensor& t) {
  if (t.is_meta()) return std::nan("");
  return t.to(DType::F64).item<double>();
}
inline double scalar(const DTensor& t) {
  return scalar(t.full_tensor());
}

// The batch as the run places it: a DTensor split over dp, replicated over tp.
template <class T>
T place_tokens(const Tensor& tokens, const ModelLayout* layout) {
  if constexpr (std::is_same_v<T, Tensor>) {
    return tokens;
  } else {
    return distribute_tensor(tokens, layout->mesh, {Shard{0}, Replicate{}});
  }
}

// The configuration of one microbatch: c.batch / c.microbatches rows.
inline Config microbatch_config(const Config& c) {
  Config mc = c;
  mc.batch = c.batch / c.microbatches;
  return mc;
}

// Microbatch m of step `step`: its rows of the batch, and the step index its dropout masks use
// (each microbatch its own masks, the same on one device and in the pipeline).
inline Tensor microbatch_tokens(const Config& c, const Tensor& batch, int64_t m) {
  const int64_t rows = c.batch / c.microbatches;
  return batch.narrow(0, m * rows, rows).contiguous();
}
inline int64_t microbatch_step(const Config& c, int64_t step, int64_t m) {
  return step * c.microbatches + m;
}

// One training step on `batch` ([B, S + 1] tokens): forward, backward, gradient clipping, AdamW.
// With c.accumulate above 1 the batch is split into that many microbatches, each one's loss
// divided by their count and its dropout masks its rows of the batch's (DropoutRows): the step
// computes what it computes without accumulation. The backwards of all but the last run under
// no_sync, so each gradient is reduced once per step (Note [No sync] in spmd/dtensor/dtensor.h).
// Returns the loss before the update (the sum of the scaled losses); with `grads`, the gradients
// AdamW stepped with (the dry run's memory report).
template <class T, class P>
double train_step(const Config& c, const P& par, Model<T>& model, AdamW<T>& opt,
                  const std::vector<T*>& params, const Tensor& batch, const ModelLayout* layout,
                  int64_t step, std::vector<T>* grads = nullptr) {
  double value = 0.0;
  if (c.accumulate == 1) {
    const T loss = forward(c, par, model, place_tokens<T>(batch, layout), step);
    value = scalar(loss);
    backward(loss);
  } else {
    Config ac = c;
    ac.microbatches = c.accumulate;
    Config mc = microbatch_config(ac);
    const double scale = 1.0 / static_cast<double>(c.accumulate);
    for (int64_t m = 0; m < c.accumulate; ++m) {
      const T tokens = place_tokens<T>(microbatch_tokens(ac, batch, m), layout);
      mc.rows = DropoutRows{m * mc.batch, c.batch};
      const T loss = forward(mc, par, model, tokens, step) * scale;
      value += scalar(loss);
      if (m + 1 < c.accumulate) {
        const auto guard = no_sync();  // DTensor leaves: the sums wait; Tensor leaves just add
        backward(loss);
      } else {
        backward(loss);
      }
    }
  }
  if (grads != nullptr) {
    grads->clear();
    for (T* p : params) grads->push_back(p->grad());
  }
  clip_grad_norm(params, c.clip);
  opt.step();
  return value;
}

inline AdamWOptions adamw_options(const Config& c) {
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

// Trains for c.steps steps on `text`; returns each step's loss. With c.load the model and AdamW's
// state come from that checkpoint and the steps follow the loaded one (*first: its number); with
// `save` (the first mesh run's c.save) both are written after the last step.
template <class T, class P>
std::vector<double> train(const Config& c, const std::string& text, const P& par, Model<T>& model,
                          const ModelLayout* layout, int64_t* first = nullptr,
                          const std::string& save = {}) {
  std::vector<T*> params = model.params();
  AdamW<T> opt(params, adamw_options(c));
  if (!c.load.empty()) checkpoint::load(training_state(model, opt), c.load);
  const int64_t start = opt.steps();
  if (first != nullptr) *first = start;
  std::vector<double> losses;
  for (int64_t step = start; step < start + c.steps; ++step) {
    losses.push_back(
        train_step(c, par, model, opt, params, batch_tokens(c, text, step), layout, step));
  }
  if constexpr (std::is_same_v<T, DTensor>) {
    if (!save.empty()) checkpoint::save(layout->mesh.world(), training_state(model, opt), save);
  }
  return losses;
}

// train() as the pipeline runs it (on one device): each step's batch split into c.microbatches
// microbatches, each one's loss divided by their count and its gradients accumulated, then one
// clipping and one AdamW step. Returns each step's loss (the sum of the scaled losses).
inline std::vector<double> train_microbatched(const Config& c, const std::string& text,
                                              Model<Tensor>& model) {
  const Config mc = microbatch_config(c);
  std::vector<Tensor*> params = model.params();
  AdamW<Tensor> opt(params, adamw_options(c));
  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    const Tensor batch = batch_tokens(c, text, step);
    Tensor total;
    for (int64_t m = 0; m < c.microbatches; ++m) {
      const Tensor loss = forward(mc, Single{policy_of(c).param_dtype}, model,
                                  microbatch_tokens(c, batch, m), microbatch_step(c, step, m)) *
                          (1.0 / static_cast<double>(c.microbatches));
      backward(loss);
      const Tensor value = loss.detach();
      total = total.defined() ? total + value : value;
    }
    losses.push_back(scalar(total));
    clip_grad_norm(params, c.clip);
    opt.step();
  }
  return losses;
}

}  // namespace gpt_model
