// examples/llama_model.h: the Llama 3 of examples/llama.cpp, written once as a template over the
// tensor type (Tensor: one device; DTensor: a mesh of dp, ep, cp and tp dims), as gpt_model.h is.
//
// Llama 3's block (Meta's reference model): x + attention(rms_norm(x)), then h + ffn(rms_norm(h));
// attention with rotary position embeddings (theta 500000, Llama 3.1's frequency scaling) on q and
// k, grouped-query attention (kv_heads key/value heads shared by heads / kv_heads query heads
// each), causal; the FFN a SwiGLU (w2 (silu(x w1) * x w3)) or a mixture of experts (nn/moe.h) with
// an optional shared expert; no biases, no dropout; tied nothing. The parallel run adds:
//   dp, ep   the batch split over both (ep also splits the experts, Note [Expert parallelism])
//   cp       context parallelism: the sequence split over cp everywhere, in zigzag (head-tail)
//            order by default (tokens, targets and rotary positions alike, so every rank rotates
//            by its tokens' global positions); attention by ring (keys and values passed around the
//            cp ring), all-gather, or sdpa's own row-sharded strategy (contiguous order only;
//            nn/context_parallel.h)
//   tp       Megatron tensor parallelism with sequence parallelism (nn/parallel.h): q, k, v, w1,
//            w3 column-wise, wo, w2 row-wise, the embedding vocabulary-parallel, the output layer
//            column-wise into the vocabulary-parallel cross-entropy; key/value heads fewer than tp
//            (or not a multiple of it) are computed replicated and each rank keeps the repeated
//            heads its query heads use
//   fsdp     (--fsdp) dense parameters also split over dp, gathered before use
//   pp       (--pp) pipeline parallelism: a stage runs the pieces of forward() it holds (embed,
//            block, logits_of, next_token_loss) on its own mesh (examples/llama.cpp, Note [Llama
//            pipeline])
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <spmd/spmd.h>

namespace llama_model {

using namespace spmd;

struct Config {
  int64_t layers = 2;
  int64_t d_model = 64;
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t ffn = 128;  // the SwiGLU's (and each expert's) hidden size
  int64_t seq = 32;
  int64_t vocab = 256;
  int64_t batch = 8;
  int64_t steps = 6;
  double lr = 3e-3;
  double clip = 1.0;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  bool rope_scaling = true;  // Llama 3.1: factor 8, low 1, high 4, original context 8192
  // Mixture of experts (0: the dense SwiGLU).
  int64_t experts = 0;
  int64_t top_k = 2;
  double capacity_factor = 0.0;
  double aux_coef = 0.01;
  bool shared_expert = false;
  // The mesh; tp 0: what the world leaves (4 on 8 ranks without other dims).
  int64_t pp = 1, dp = 2, ep = 1, cp = 1, tp = 0;
  // Pipeline parallelism (pp above 1): pipeline/schedule.h's schedule, the microbatches per step,
  // the stages per pp rank (0: 2 for interleaved, else 1).
  std::string schedule = "1f1b";
  int64_t microbatches = 4;
  int64_t virtual_stages = 0;
  // Context parallelism's attention (nn/context_parallel.h): ring (keys and values passed around
  // the cp ring), allgather, or sdpa (scaled_dot_product_attention's own row-sharded strategy, its
  // keys and values gathered by DTensor); zigzag: the sequence in head-tail order over cp (ring
  // and allgather only).
  std::string cp_method = "ring";
  bool zigzag = true;
  bool fsdp = false;
  DType dtype = DType::F64;
  bool check = true;
  std::string data;
  bool recompute = false;  // --recompute: every block's activations recomputed in backward
  // --selective-recompute: the same, keeping the matmuls' and attention's outputs (Note
  // [Selective recompute] in spmd/ops/selective.h)
  bool selective = false;
  // --selective-recompute-policy alternate: torchtitan's "op" policy, every second matmul
  // recomputed too (save_alternate_matmuls).
  bool alternate_matmuls = false;
  // --loss-dtype f32: the logits are cast before the loss (torchtitan computes its cross-entropy
  // on logits.float()).
  std::optional<DType> loss_dtype;
  // --master-dtype: the parameters are stored and stepped in it and used in `dtype`, gradients
  // reduced in it (MixedPrecisionPolicy, Note [Mixed precision] in spmd/nn/parallel.h).
  std::optional<DType> master_dtype;
  // --float8: the blocks' linears as FP8 training (torchao's Float8Linear with tensorwise
  // scaling, which torchtitan's float8 converter applies): float8_matmul, Note [Float8 training]
  // in spmd/ops/linalg.cpp. The output layer stays in `dtype`, as torchtitan leaves it. As in
  // torchao under FSDP, activations and gradients are scaled rank by rank over dp and cp (their
  // amax is each rank's own); --float8-global-scales scales them over the whole batch instead,
  // as one device does.
  bool float8 = false;
  bool float8_global = false;
  // --float8-all-gather: with --fsdp, those linears' weights are cast to float8 on their shard and
  // gathered in float8, with amaxes reduced once per step (torchao's enable_fsdp_float8_all_gather
  // and precompute_float8_dynamic_scale_for_fsdp; Note [Float8 all-gather] in
  // spmd/nn/parallel.h). The same values as gathering them wide.
  bool float8_all_gather = false;
  std::string save;        // --save DIR: the model and AdamW's state after the last step
  std::string load;        // --load DIR: both before the first step, which follows the loaded step
  int64_t accumulate = 1;  // --accumulate N: microbatches per step, backward under no_sync but last
  uint64_t seed = 2024;
  std::string model = "toy";  // or 8b, 70b, 405b (shapes for a dry run)

  int64_t head_dim() const { return d_model / heads; }
};

// ---- rotary embeddings ----------------------------------------------------------------------

// The op table's rotary_embedding with Llama 3.1's frequency scaling (theta 500000, factor 8,
// low/high frequency factors 1 and 4, original context 8192) or plain RoPE, rotating the pairs
// (i, i + D/2) of q, k [B, S, H, D] by the positions of their rows (HF's layout).
inline RopeConfig rope_config(const Config& c) {
  RopeConfig r{.theta = c.rope_theta, .interleaved = false};
  if (c.rope_scaling) r.scaling = RopeScaling{};
  return r;
}

// ---- parameters -----------------------------------------------------------------------------

template <class T>
struct Block {
  T attn_norm, wq, wk, wv, wo, ffn_norm;
  T w1, w3, w2;       // the dense SwiGLU, or the shared expert with experts
  MoEWeights<T> moe;  // with experts
  std::vector<T*> params() {
    std::vector<T*> out = {&attn_norm, &wq, &wk, &wv, &wo, &ffn_norm};
    for (T* p : {&w1, &w3, &w2, &moe.router, &moe.w1, &moe.w3, &moe.w2}) {
      if (p->defined()) out.push_back(p);
    }
    return out;
  }
  // The weights of its linears (linear(): FP8 under --float8).
  std::vector<const T*> linears() const {
    std::vector<const T*> out = {&wq, &wk, &wv, &wo};
    for (const T* p : {&w1, &w3, &w2}) {
      if (p->defined()) out.push_back(p);
    }
    return out;
  }
};

template <class T>
struct Model {
  T tok_embeddings, norm, output;
  std::vector<Block<T>> blocks;
  std::vector<T*> params() {
    std::vector<T*> out = {&tok_embeddings};
    for (Block<T>& b : blocks) {
      for (T* p : b.params()) out.push_back(p);
    }
    out.push_back(&norm);
    out.push_back(&output);
    return out;
  }
};

// What a parameter is, for its placements.
enum class Role { Vocab, Replicated, Colwise, Rowwise, KeyValue, Expert };

// Where the parallel run puts things.
struct ModelLayout {
  DeviceMesh mesh;
  bool fsdp = false;
  bool kv_replicated = false;  // key/value heads computed on every tp rank (kv_heads % tp != 0)

  bool has(const std::string& dim) const {
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (mesh.dim_name(d) == dim) return true;
    }
    return false;
  }
  Placements placements(Role role, const Shape& shape) const {
    Placements p = replicate_placements(mesh);
    const bool tp = has("tp");
    switch (role) {
      case Role::Vocab:
      case Role::Rowwise:
        if (tp) p = rowwise_placements(mesh, "tp");
        break;
      case Role::Colwise:
        if (tp) p = colwise_placements(mesh, "tp");
        break;
      case Role::KeyValue:
        if (tp && !kv_replicated) p = colwise_placements(mesh, "tp");
        break;
      case Role::Expert:
        return placed_on(mesh, "ep", Shard{0});
      case Role::Replicated:
        break;
    }
    return fsdp ? fsdp_placements(p, shape, mesh, "dp") : p;
  }
  // The activations [B, S, ...]: the batch over dp and ep, the sequence over cp and tp.
  Placements activations() const {
    Placements p = replicate_placements(mesh);
    for (int d = 0; d < mesh.ndim(); ++d) {
      const std::string name = mesh.dim_name(d);
      p[static_cast<size_t>(d)] =
          name == "dp" || name == "ep" ? Placement{Shard{0}} : Placement{Shard{1}};
    }
    return p;
  }
  // The tokens [B, S + 1]: the batch split, whole along the sequence.
  Placements tokens() const {
    Placements p = replicate_placements(mesh);
    for (int d = 0; d < mesh.ndim(); ++d) {
      const std::string name = mesh.dim_name(d);
      if (name == "dp" || name == "ep") p[static_cast<size_t>(d)] = Shard{0};
    }
    return p;
  }
};

template <class T>
T make_param(const ModelLayout* layout, Role role, const Shape& shape, uint64_t seed, double std,
             DType dtype) {
  if constexpr (std::is_same_v<T, Tensor>) {
    if (std == 0.0) return ones(shape, dtype);
    return (randn(shape, seed, DType::F64) * std).to(dtype);
  } else {
    const Placements placements = layout->placements(role, shape);
    if (std != 0.0)
      return to(randn(shape, layout->mesh, placements, seed, DType::F64) * std, dtype);
    auto spec = std::make_shared<const DTensorSpec>(layout->mesh, placements, shape, dtype);
    return dtensor_from_blocks("make_param", spec,
                               [&](const Shape&, const Shape& size) { return ones(size, dtype); });
  }
}

// The layout of layer `layer`'s parameters: -1 for the embeddings, c.layers for the final norm
// and the output layer (one layout for all without pipeline parallelism; the stage's with it).
using LayoutOf = std::function<const ModelLayout*(int64_t layer)>;

template <class T>
Model<T> init_model(const Config& c, const LayoutOf& layout_of) {
  const int64_t d = c.d_model, D = c.head_dim();
  const double std = 0.02, out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  uint64_t seed = c.seed;
  const ModelLayout* layout = layout_of(-1);
  auto param = [&](Role role, const Shape& shape, double s) {
    return make_param<T>(layout, role, shape, ++seed, s, c.master_dtype.value_or(c.dtype));
  };
  Model<T> m;
  m.tok_embeddings = param(Role::Vocab, {c.vocab, d}, std);
  for (int64_t l = 0; l < c.layers; ++l) {
    layout = layout_of(l);
    Block<T> b;
    b.attn_norm = param(Role::Replicated, {d}, 0.0);
    b.wq = param(Role::Colwise, {d, c.heads * D}, std);
    b.wk = param(Role::KeyValue, {d, c.kv_heads * D}, std);
    b.wv = param(Role::KeyValue, {d, c.kv_heads * D}, std);
    b.wo = param(Role::Rowwise, {c.heads * D, d}, out_std);
    b.ffn_norm = param(Role::Replicated, {d}, 0.0);
    if (c.experts == 0 || c.shared_expert) {
      b.w1 = param(Role::Colwise, {d, c.ffn}, std);
      b.w3 = param(Role::Colwise, {d, c.ffn}, std);
      b.w2 = param(Role::Rowwise, {c.ffn, d}, out_std);
    }
    if (c.experts > 0) {
      // The router and the experts stay whole over dp (no FSDP): the router is replicated, the
      // experts split by expert over ep.
      if constexpr (std::is_same_v<T, Tensor>) {
        b.moe.router = param(Role::Replicated, {d, c.experts}, std);
      } else {
        const ModelLayout whole{layout->mesh, false, layout->kv_replicated};
        b.moe.router = make_param<T>(&whole, Role::Replicated, {d, c.experts}, ++seed, std,
                                     c.master_dtype.value_or(c.dtype));
      }
      b.moe.w1 = param(Role::Expert, {c.experts, d, c.ffn}, std);
      b.moe.w3 = param(Role::Expert, {c.experts, d, c.ffn}, std);
      b.moe.w2 = param(Role::Expert, {c.experts, c.ffn, d}, out_std);
    }
    m.blocks.push_back(std::move(b));
  }
  layout = layout_of(c.layers);
  m.norm = param(Role::Replicated, {d}, 0.0);
  m.output = param(Role::Colwise, {d, c.vocab}, std);
  for (T* p : m.params()) p->requires_grad_();
  return m;
}

template <class T>
Model<T> init_model(const Config& c, const ModelLayout* layout) {
  return init_model<T>(c, [layout](int64_t) { return layout; });
}

// The layer of each parameter, in params() order (-1: the embeddings, the layer count: the final
// norm and the output layer).
template <class T>
std::vector<int64_t> param_layers(Model<T>& m) {
  std::vector<int64_t> out = {-1};
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    out.insert(out.end(), m.blocks[l].params().size(), static_cast<int64_t>(l));
  }
  out.insert(out.end(), 2, static_cast<int64_t>(m.blocks.size()));
  return out;
}

// ---- the redistributions of the parallel run; none on one device ------------------------------

// The mixed-precision policy of --master-dtype: parameters used in c.dtype, gradients reduced in
// the master dtype; none without it.
inline MixedPrecisionPolicy policy_of(const Config& c) {
  if (!c.master_dtype) return {};
  return MixedPrecisionPolicy{c.dtype, c.master_dtype, std::nullopt};
}

// A block weight as its linear uses it (par.use_linear): `value` gathered in the compute dtype,
// or with `amax` defined, in float8 with the amax of its scale (--float8-all-gather).
template <class T>
struct Used {
  T value;
  T amax;
};

struct Single {
  Tensor positions;                  // [S]: 0, 1, ..., S - 1
  std::optional<DType> param_dtype;  // --master-dtype: parameters used in the compute dtype
  Tensor use(const Tensor& p) const { return param_dtype ? p.to(*param_dtype) : p; }
  Tensor use_root(const Tensor& p) const { return use(p); }
  Tensor into_tp(const Tensor& x) const { return x; }
  Tensor out_of_tp(const Tensor& partial) const { return partial; }
  Tensor into_sp(const Tensor& x) const { return x; }
  Tensor heads_for_tp(const Tensor& kv) const { return kv; }
  Used<Tensor> use_linear(const Tensor& w) const { return {use(w), {}}; }
  Tensor float8(const Tensor& x, const Used<Tensor>& w) const { return float8_matmul(x, w.value); }
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v) const {
    return scaled_dot_product_attention(q, k, v, true);
  }
};

struct Parallel {
  const ModelLayout* layout = nullptr;
  DTensor positions;  // [S] I64: the position of each sequence index, split over cp like it
  std::string cp_method = "sdpa";
  std::vector<int64_t> order;    // the same positions on the host (empty: in order)
  MixedPrecisionPolicy policy;   // --master-dtype's (policy_of); default: none
  Float8Options float8_options;  // --float8's rank-local dims (dp and cp unless global)
  // --float8-all-gather with FSDP: the step's amaxes of the blocks' linear weights, by parameter
  // (precompute_float8_amaxes; one not there reduces its own: a pipeline stage's copies), and the
  // float8 weights of a block gathered ahead (pre_gathered), by its parameter.
  bool float8_all_gather = false;
  std::shared_ptr<std::map<const DTensor*, DTensor>> float8_amaxes;
  std::shared_ptr<const std::map<const DTensor*, Float8Weight>> gathered_float8;
  // The parameter w of a linear, gathered for it: in float8 under --float8-all-gather.
  Used<DTensor> use_linear(const DTensor& w) const {
    if (!float8_all_gather || !layout->fsdp) return {use(w), {}};
    const Float8Weight g =
        pre_gathered ? gathered_float8->at(&w) : gather_float8(w, reshard_after_forward);
    return {g.data, g.amax};
  }
  // x @ w in FP8.
  DTensor float8(const DTensor& x, const Used<DTensor>& w) const {
    if (w.amax.defined()) return float8_matmul(x, Float8Weight{w.value, w.amax}, float8_options);
    return float8_matmul(x, w.value, float8_options);
  }
  Float8Weight gather_float8(const DTensor& w, bool reshard) const {
    DTensor amax;
    if (float8_amaxes) {
      if (auto it = float8_amaxes->find(&w); it != float8_amaxes->end()) amax = it->second;
    }
    return fsdp_unshard_float8(w, "dp", amax, policy, reshard);
  }
  // Causal attention of q, k, v [B, H, S, D]: over cp by the chosen method.
  DTensor attend(const DTensor& q, const DTensor& k, const DTensor& v) const {
    if (!layout->has("cp") || cp_method == "sdpa")
      return scaled_dot_product_attention(q, k, v, true);
    return context_attention(
        q, k, v,
        {.cp = "cp",
         .positions = order,
         .method = cp_method == "ring" ? ContextMethod::Ring : ContextMethod::AllGather});
  }
  // FSDP2's reshard_after_forward for the blocks: true, except in a pipeline (torchtitan's
  // default, which would otherwise gather every microbatch's parameters again).
  bool reshard_after_forward = true;
  DTensor use(const DTensor& p) const { return use(p, reshard_after_forward); }
  // A parameter of the root module (embeddings, final norm, output layer): FSDP2 keeps it
  // gathered from the forward to the backward.
  DTensor use_root(const DTensor& p) const { return use(p, false); }
  DTensor use(const DTensor& p, bool reshard) const {
    if (pre_gathered) return p;
    if (layout->fsdp) return fsdp_unshard(p, "dp", policy, reshard);
    return policy.param_dtype && p.dtype() != *policy.param_dtype ? to(p, *policy.param_dtype) : p;
  }
  // torchtitan does not reshard the last block after forward either (FSDP2 would gather it again
  // at once for backward): with FSDP and a checkpointed block, its parameters are gathered once,
  // outside the checkpoint, kept to the backward, and used as they are by the block and its
  // recomputation (no all_gather in backward), through a copy of this view with pre_gathered.
  bool keeps_last_block() const { return layout->fsdp && reshard_after_forward; }
  bool pre_gathered = false;  // use() returns the parameter as it is: gathered already
  // Into a tensor-parallel region: the sequence gathered over tp (it stays split over cp), its
  // gradient reduced back in the policy's reduce_dtype.
  DTensor into_tp(const DTensor& x) const {
    if (!layout->has("tp")) return x;
    const Placements gathered = with_placement(x.placements(), x.mesh(), "tp", Replicate{});
    if (policy.reduce_dtype)
      return cast_redistribute(x, std::nullopt, gathered, policy.reduce_dtype);
    return x.redistribute(gathered);
  }
  // Out of it: the row-wise partial sums reduce-scattered over the sequence.
  DTensor out_of_tp(const DTensor& partial) const { return into_sp(partial); }
  // The activation layout.
  DTensor into_sp(const DTensor& x) const { return x.redistribute(layout->activations()); }
  // Repeated key/value heads [B, S, H, D] computed on every tp rank: each keeps its query heads'.
  DTensor heads_for_tp(const DTensor& kv) const {
    if (!layout->has("tp") || !layout->kv_replicated) return kv;
    return kv.redistribute(with_placement(kv.placements(), kv.mesh(), "tp", Shard{2}));
  }
};

// --float8-all-gather with FSDP: the amaxes of the blocks' linear weights for the step, in one
// all_reduce per mesh (float8_amaxes; torchtitan runs torchao's
// precompute_float8_dynamic_scale_for_fsdp after each optimizer step, so before each forward).
inline void precompute_float8_amaxes(const Parallel& par, const Model<DTensor>& model) {
  if (!par.float8_amaxes || !par.layout->fsdp) return;
  std::vector<const DTensor*> weights;
  for (const Block<DTensor>& b : model.blocks) {
    for (const DTensor* w : b.linears()) weights.push_back(w);
  }
  const std::vector<DTensor> amaxes = float8_amaxes(weights);
  par.float8_amaxes->clear();
  for (size_t i = 0; i < weights.size(); ++i) (*par.float8_amaxes)[weights[i]] = amaxes[i];
}

// ---- the model ------------------------------------------------------------------------------

// One of a block's linears, x @ w (w from par.use_linear): in FP8 under --float8.
template <class T, class P>
T linear(const Config& c, const P& par, const T& x, const Used<T>& w) {
  return c.float8 ? par.float8(x, w) : matmul(x, w.value);
}

template <class T, class P>
T attention(const Config& c, const P& par, const Block<T>& b, const T& x) {
  const int64_t B = c.batch, S = c.seq, H = c.heads, Hkv = c.kv_heads, D = c.head_dim();
  const T h = par.into_tp(x);
  const RopeConfig rope = rope_config(c);
  const T q = rotary_embedding(reshape(linear(c, par, h, par.use_linear(b.wq)), {B, S, H, D}),
                               par.positions, rope);
  const T k = rotary_embedding(reshape(linear(c, par, h, par.use_linear(b.wk)), {B, S, Hkv, D}),
                               par.positions, rope);
  const T v = reshape(linear(c, par, h, par.use_linear(b.wv)), {B, S, Hkv, D});
  // Grouped-query attention: kv head j serves query heads j * H/Hkv .. (j + 1) * H/Hkv - 1.
  auto repeat = [&](const T& t) { return par.heads_for_tp(repeat_interleave(t, H / Hkv, 2)); };
  auto heads_first = [](const T& t) { return permute(t, {0, 2, 1, 3}); };
  const T o = par.attend(heads_first(q), heads_first(repeat(k)), heads_first(repeat(v)));
  const T merged = reshape(permute(o, {0, 2, 1, 3}), {B, S, H * D});
  return par.out_of_tp(linear(c, par, merged, par.use_linear(b.wo)));
}

template <class T, class P>
T swiglu(const Config& c, const P& par, const T& w1, const T& w3, const T& w2, const T& x) {
  const T h = par.into_tp(x);
  // In a fixed order (a dry run's FSDP timeline follows the order of the gathers): the output
  // weight gathered first, then the up and gate projections, each gathered as it is used.
  const Used<T> down = par.use_linear(w2);
  const T up = linear(c, par, h, par.use_linear(w3));
  const T gate = linear(c, par, h, par.use_linear(w1));
  return par.out_of_tp(linear(c, par, silu(gate) * up, down));
}

// The FFN's output and, with experts, the layer's load-balancing loss (undefined otherwise).
template <class T, class P>
std::pair<T, T> ffn(const Config& c, const P& par, const Block<T>& b, const T& x) {
  if (c.experts == 0) return {swiglu(c, par, b.w1, b.w3, b.w2, x), T{}};
  const MoEOutput<T> r =
      moe(x, b.moe, MoEOptions{.top_k = c.top_k, .capacity_factor = c.capacity_factor, .ep = "ep"});
  T out = r.out;
  if (c.shared_expert) out = out + swiglu(c, par, b.w1, b.w3, b.w2, x);
  return {out, r.aux_loss};
}

// The pieces of forward() a pipeline stage runs apart: the embeddings of input tokens [B, S] ...
template <class T, class P>
T embed(const P& par, const Model<T>& m, const T& ids) {
  return par.into_sp(embedding(ids, par.use_root(m.tok_embeddings)));
}

// ... one block of the residual stream [B, S, d], adding its load-balancing loss (with experts)
// to `aux` ...
template <class T, class P>
T block(const Config& c, const P& par, const Block<T>& b, const T& x, T& aux) {
  const T h = x + attention(c, par, b, rms_norm(x, par.use(b.attn_norm), c.norm_eps));
  auto [out, layer_aux] = ffn(c, par, b, rms_norm(h, par.use(b.ffn_norm), c.norm_eps));
  const T y = h + out;
  if (layer_aux.defined()) aux = aux.defined() ? aux + layer_aux : layer_aux;
  return y;
}

// ... the final norm and the output layer: logits [B, S, V] ...
template <class T, class P>
T logits_of(const Config& c, const P& par, const Model<T>& m, const T& x) {
  return matmul(par.into_tp(rms_norm(x, par.use_root(m.norm), c.norm_eps)), par.use_root(m.output));
}

// ... and the loss: the mean next-token cross-entropy of the targets `next` [B, S], plus aux_coef
// times the layers' load-balancing losses `aux` (undefined: none).
template <class T>
T next_token_loss(const Config& c, const T& logits, const T& next, const T& aux) {
  const int64_t B = c.batch, S = c.seq;
  const T targets = reshape(next, {B * S});
  T flat = reshape(logits, {B * S, c.vocab});
  if (c.loss_dtype) {
    if constexpr (std::is_same_v<T, DTensor>) {
      flat = to(flat, *c.loss_dtype);
    } else {
      flat = flat.to(*c.loss_dtype);
    }
  }
  const T loss = cross_entropy(flat, targets);
  return aux.defined() ? loss + aux * c.aux_coef : loss;
}

// The loss of one batch: input tokens and their next tokens [B, S] (in the run's sequence order).
template <class T, class P>
T forward(const Config& c, const P& par, const Model<T>& m, const T& ids, const T& next) {
  T x = embed(par, m, ids);
  T aux;
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    const Block<T>& b = m.blocks[l];
    if (!c.recompute) {
      x = block(c, par, b, x, aux);
      continue;
    }
    // The last block's parameters gathered and kept (Parallel::keeps_last_block); the function
    // runs again in backward, so it owns them.
    std::shared_ptr<const Block<T>> kept;
    std::shared_ptr<const P> kept_par;
    if constexpr (std::is_same_v<T, DTensor>) {
      if (l + 1 == m.blocks.size() && par.keeps_last_block() && !b.moe.router.defined()) {
        auto gathered = std::make_shared<Block<T>>(b);
        auto view = std::make_shared<P>(par);
        if (c.float8 && par.float8_all_gather) {
          // The linears' weights gathered in float8 (Note [Float8 all-gather]), the norms' wide.
          auto float8 = std::make_shared<std::map<const DTensor*, Float8Weight>>();
          const std::vector<const T*> from = b.linears();
          const std::vector<const T*> to = std::as_const(*gathered).linears();
          for (size_t i = 0; i < to.size(); ++i) {
            (*float8)[to[i]] = par.gather_float8(*from[i], false);
          }
          for (T* p : {&gathered->attn_norm, &gathered->ffn_norm}) *p = par.use(*p, false);
          view->gathered_float8 = std::move(float8);
        } else {
          for (T* p : gathered->params()) *p = par.use(*p, false);
        }
        view->pre_gathered = true;
        kept = std::move(gathered);
        kept_par = std::move(view);
      }
    }
    // --recompute: the block's activations are recomputed in backward (Note [Recompute] in
    // spmd/nn/recompute.h); dense blocks only (an MoE block's aux loss is a second output).
    const std::function<T(const std::vector<T>&)> fn = [&c, &par, &b, kept,
                                                        kept_par](const std::vector<T>& in) {
      T no_aux;
      return kept ? block(c, *kept_par, *kept, in[0], no_aux) : block(c, par, b, in[0], no_aux);
    };
    x = c.selective ? checkpoint_activations(
                          fn, {x}, c.alternate_matmuls ? save_alternate_matmuls() : save_matmuls())
                    : checkpoint_activations(fn, {x});
  }
  return next_token_loss(c, logits_of(c, par, m, x), next, aux);
}

}  // namespace llama_model
