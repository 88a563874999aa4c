// spmd/ops/nn.cpp: the entries of a transformer's layers: layer_norm, rms_norm, dropout,
// cross_entropy and scaled_dot_product_attention, the losses nll_loss and mse_loss, and the
// entries their backward uses.
//
// Each computes on Tensors with other ops (so it runs on every device that has their kernels) and
// shards as its entry says: the norms and attention keep the shards of their batch dims (and
// attention those of its heads), dropout keeps every shard, cross_entropy shards over rows, and
// over classes through its composite form (Note [Vocabulary-parallel cross-entropy]).
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/meta.h>
#include <spmd/tensor/random.h>

namespace spmd {
namespace {

void check_floating(std::string_view op, const InputMeta& in, std::string_view what) {
  if (!is_floating(in.dtype)) {
    throw_error<Unsupported>("{}: the {} must be floating, got {} (shape {})", op, what, in.dtype,
                             shape_str(*in.shape));
  }
}

// Strategies of an op over the rows of its first `n_rows` inputs (each of the first input's
// shape, or broadcastable to it by leading dims): shards of every dim but the last pass; the
// other inputs (per-feature vectors) are Replicate.
std::vector<OpStrategy> rowwise_strategies(ShardingInputs in, size_t n_rows) {
  const size_t n = in.size();
  const int nd = static_cast<int>(in[0]->ndim());
  std::vector<DimOption> options = {{std::vector<Placement>(n, Replicate{}), Replicate{}}};
  for (int d = 0; d + 1 < nd; ++d) {
    DimOption o{std::vector<Placement>(n, Replicate{}), Shard{d}};
    for (size_t t = 0; t < n_rows; ++t) o.inputs[t] = Shard{d};
    options.push_back(std::move(o));
  }
  return expand_dim_options(in, options);
}

double eps_arg(std::string_view op, const OpArgs& args) {
  const double eps = args.reals.at(0);
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    throw_error<ConfigError>("{}: eps must be a finite number >= 0, got {}", op, eps);
  }
  return eps;
}

// ---- layer_norm and rms_norm --------------------------------------------------------------------
// Normalized over the last dim. args.reals = [eps]. layer_norm: inputs (x, weight, bias);
// rms_norm: (x, weight). Their backward entries (grad, x, weight) with args.ints = [mode]: mode 0
// the input's gradient, mode 1 grad * x_hat (summed over the rows: the weight's gradient).

template <bool rms>
constexpr std::string_view norm_name() {
  return rms ? "rms_norm" : "layer_norm";
}

template <bool rms>
OpMeta norm_meta(std::span<const InputMeta> in, const OpArgs& args) {
  constexpr std::string_view name = norm_name<rms>();
  const Shape& x = *in[0].shape;
  check_floating(name, in[0], "input");
  eps_arg(name, args);
  if (x.empty()) throw_error<ShapeError>("{}: the input must have at least one dim", name);
  DType dtype = in[0].dtype;
  for (size_t k = 1; k < in.size(); ++k) {
    if (*in[k].shape != Shape{x.back()}) {
      throw_error<ShapeError>("{}: the {} must have shape [{}] (the input's last dim), got {}",
                              name, k == 1 ? "weight" : "bias", x.back(), shape_str(*in[k].shape));
    }
    dtype = promote_types(dtype, in[k].dtype);
  }
  return OpMeta{x, dtype};
}

// x normalized over its last dim (no affine), and 1 / its standard deviation (or RMS).
struct Normalized {
  Tensor x_hat;
  Tensor rstd;
};

template <bool rms>
Normalized normalize(const Tensor& x, double eps) {
  if constexpr (rms) {
    const Tensor rstd = rsqrt(mean(x * x, {-1}, true) + eps);
    return {x * rstd, rstd};
  } else {
    const Tensor centered = x - mean(x, {-1}, true);
    const Tensor rstd = rsqrt(mean(centered * centered, {-1}, true) + eps);
    return {centered * rstd, rstd};
  }
}

template <bool rms>
Tensor norm_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor y = normalize<rms>(in[0].to(out.dtype), args.reals[0]).x_hat * in[1].to(out.dtype);
  if constexpr (rms) {
    return y;
  } else {
    return y + in[2].to(out.dtype);
  }
}

template <bool rms>
OpMeta norm_backward_meta(std::span<const InputMeta> in, const OpArgs&) {
  return OpMeta{*in[1].shape, promote_types(promote_types(in[0].dtype, in[1].dtype), in[2].dtype)};
}

// mode 0: dx = rstd (gw - mean(gw) - x_hat mean(gw x_hat)) with gw = g w (rms: without the
// mean(gw) term); mode 1: g x_hat.
template <bool rms>
Tensor norm_backward_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor g = in[0].to(out.dtype);
  const Normalized n = normalize<rms>(in[1].to(out.dtype), args.reals.at(0));
  if (args.ints.at(0) == 1) return g * n.x_hat;
  const Tensor gw = g * in[2].to(out.dtype);
  Tensor inner = gw - n.x_hat * mean(gw * n.x_hat, {-1}, true);
  if constexpr (!rms) inner = inner - mean(gw, {-1}, true);
  return n.rstd * inner;
}

template <bool rms>
void norm_backward(BackwardContext& c) {
  const OpDef& derivative = rms ? op::rms_norm_backward : op::layer_norm_backward;
  const std::vector<double> eps = {c.args().reals.at(0)};
  const Var& g = c.grad();
  if (c.needs_grad(0)) c.set_grad(0, apply(derivative, {g, c.input(0), c.input(1)}, {{0}, eps}));
  if (c.needs_grad(1)) {
    c.set_grad(1, sum_to(apply(derivative, {g, c.input(0), c.input(1)}, {{1}, eps}),
                         var_shape(c.input(1))));
  }
  if (!rms && c.needs_grad(2)) c.set_grad(2, sum_to(g, var_shape(c.input(2))));
}

// ---- rms_norm as PyTorch eager runs it (Note [Eager kernels] in debug/dry_run.h) ---------------
// at::rms_norm before PyTorch 2.8 was a CompositeImplicitAutograd function: x cast to its math
// dtype a (F32 for BF16 and F16), pow(2), mean over the last dim, + eps and rsqrt (per row),
// times x, cast back to x's dtype, times the weight: eight kernels, and autograd's backward
// through them. Per element of x, with e, o and a the bytes of x's, the output's and the math
// dtype, c = e + a where x is cast (else 0), and the per-row and weight-sized terms left out:
//   forward           c (cast) + 2a (pow) + a (mean) + 2a (* rstd) + c (cast back) + e + o (* w)
//   backward, mode 0  2o (g * w) + c (cast) + 2a (* rstd) + 3a (* x, for rstd's gradient) +
//                     a (its sum) + a (mean's backward) + 2a (pow(x, 1)) + 2a (* 2) + 3a (* g) +
//                     3a (the two paths' gradients added) + c (cast back)
//   backward, mode 1  o + e + o (g * y); the sum over rows is the sum_to op after it
// bench/peers/eager_kernels.py counts the kernels PyTorch runs: 36.1 and 92.2 bytes per element
// forward and backward in BF16, as here (36 and 84 + 6 + the sum's 2).

double rms_norm_eager_bytes(std::span<const InputMeta> in, const OpArgs& args, const OpMeta& out) {
  const bool backward = in.size() == 3;
  const InputMeta& x = in[backward ? 1 : 0];
  const double n = static_cast<double>(shape_numel(*x.shape));
  const double e = static_cast<double>(itemsize(x.dtype));
  const double o = static_cast<double>(itemsize(out.dtype));
  const DType math = x.dtype == DType::F64 ? DType::F64 : DType::F32;
  const double a = static_cast<double>(itemsize(math));
  const double c = x.dtype == math ? 0.0 : e + a;
  if (!backward) return n * (c + 2 * a + a + 2 * a + c + e + o);
  if (args.ints.at(0) == 1) return n * (o + e + o);
  return n * (2 * o + c + 2 * a + 3 * a + a + a + 2 * a + 2 * a + 3 * a + 3 * a + c);
}

const EagerKernels kRmsNormEager{
    .of = "rms_norm",
    .bytes = rms_norm_eager_bytes,
    .source = "at::rms_norm before PyTorch 2.8: cast, pow, mean, rsqrt, mul, cast, mul",
};

// ---- dropout ------------------------------------------------------------------------------------
// args.reals = [p], args.seed; args.ints = [row offset, rows] when the input is those rows of a
// larger tensor along dim 0 (DropoutRows).
//
// Note [Mesh-invariant dropout]
// Element i (flat row-major index of the global tensor) is dropped when philox_uniform(seed, i) < p
// (tensor/random.h), so the mask is a function of the global index alone: every rank generates its
// own block's, and any mesh and placements drop the same elements as one device. Kept elements are
// scaled by 1 / (1 - p). An input that is rows of a larger tensor (DropoutRows: a microbatch of a
// batch) is indexed in that tensor, so microbatches drop what the whole batch drops.

OpMeta dropout_meta(std::span<const InputMeta> in, const OpArgs& args) {
  check_floating("dropout", in[0], "input");
  const double p = args.reals.at(0);
  if (!(p >= 0.0 && p <= 1.0)) {
    throw_error<ConfigError>("dropout: the probability must lie in [0, 1], got {} (shape {})", p,
                             shape_str(*in[0].shape));
  }
  if (!args.ints.empty()) {
    const Shape& shape = *in[0].shape;
    const int64_t offset = args.ints.at(0), rows = args.ints.at(1);
    if (shape.empty() || offset < 0 || offset + shape[0] > rows) {
      throw_error<ShapeError>(
          "dropout: an input of shape {} cannot be rows [{}, {}) of a tensor of {} rows along dim "
          "0 (DropoutRows)",
          shape_str(shape), offset, offset + (shape.empty() ? 0 : shape[0]), rows);
    }
  }
  return OpMeta{*in[0].shape, in[0].dtype};
}

// Dropout of `x`, the block at `offset` of a global tensor of shape `global`.
Tensor dropout_block(const Tensor& x, const OpArgs& args, const Shape& global,
                     const Shape& offset) {
  const double p = args.reals[0];
  if (p == 0.0) return x.clone();
  DeviceOps& kernels = kernels_for("dropout", {&x});
  Shape whole = global;
  Shape at = offset;
  if (!args.ints.empty()) {  // rows of a larger tensor (Note [Mesh-invariant dropout])
    at[0] += args.ints[0];
    whole[0] = args.ints[1];
  }
  // Kept elements times 1 / (1 - p), dropped ones times 0, in one product as torch's (x * 0 is
  // -0 for a negative x and NaN for an infinite or NaN one); BF16/F16 multiply in F32.
  const DType compute = pointwise::scalar_compute_dtype(x.dtype());
  const Tensor mask = dropout_mask_block(whole, args.seed, at, x.shape(), p, compute);
  Tensor out = empty(x.shape(), compute, x.device());
  kernels.binary(element::index_of<element::Mul, element::BinaryOps>, out, x.to(compute),
                 mask.to(x.device()));
  return out.to(x.dtype());
}

Tensor dropout_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  return dropout_block(in[0], args, in[0].shape(), Shape(static_cast<size_t>(in[0].dim()), 0));
}

Tensor dropout_piece(std::span<const Tensor> pieces, const OpArgs& args,
                     const PieceContext& where) {
  return dropout_block(pieces[0], args, where.output.shape(),
                       where.output.local_offset(where.coordinate));
}

// Linear with a non-negative factor per element: shards, sums, averages, maxima and minima pass.
std::vector<OpStrategy> dropout_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  return derived_strategies(in, [](const Placement& p) -> std::optional<Placement> {
    if (const Partial* q = std::get_if<Partial>(&p); q != nullptr && q->op == ReduceOp::Product) {
      return std::nullopt;
    }
    return p;
  });
}

// The same mask on the gradient (the same args, seed included).
void dropout_backward(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, apply(op::dropout, {c.grad()}, c.args()));
}

// ---- cross_entropy and nll_loss -----------------------------------------------------------------
// inputs (logits [N, C, d...] or [C], target [N, d...] or [] integer; nll_loss: log-probabilities
// for logits); args (loss_args in ops/ops.h): ints = [reduction (0 mean, 1 sum, 2 none),
// ignore_index], reals = [label_smoothing]. The class dim is 1 (0 for [C]). The loss of element i
// (torch's formula) is
//   cross_entropy: (1 - eps) (lse_i - x_i[t_i]) + (eps / C) sum_c (lse_i - x_i[c]), with lse_i the
//                  logsumexp over the classes;
//   nll_loss:      -x_i[t_i];
// and 0 where t_i == ignore_index. Mean divides the sum by the count of elements not ignored
// (0 / 0 = NaN when every one is, as torch), Sum sums, None keeps one loss per target element.
//
// Note [Vocabulary-parallel cross-entropy]
// With the classes sharded (logits Shard(1) on some mesh dim, as a column-parallel output layer
// leaves them) the op runs as its composite form, Megatron-LM's vocabulary-parallel loss written
// with table ops: the row maximum (amax, P(max) -> all_reduce max), exp of the shifted logits, the
// sum of exponentials (P(sum) -> all_reduce), and the target's logit by a masked gather (P(sum) ->
// all_reduce): three all_reduces of N values, and the logits are never gathered (label smoothing
// adds the sum of the shifted logits: a fourth). Its backward is that of its ops (the gather's
// scatters into each rank's own classes). Otherwise the op is one entry whose elements shard
// (the batch dim and d..., with the target's); None keeps those shards and Sum gives P(sum).
//
// Note [Mean over the elements not ignored]
// A piece of rows cannot divide by the global count of elements not ignored: that depends on the
// targets of every rank. So a Mean over sharded elements runs as the composite too: the
// per-element losses (table ops that keep the elements' shards: no communication), their sum
// (P(sum)), the count of targets not ignored (a sum of the target's mask: P(sum), all_reduced as
// the divisor: one value), and the division, which keeps the sum's P(sum). Exact for uneven and
// ignored rows. Where every rank holds whole rows of classes and there is no label smoothing,
// the losses are PyTorch's own decomposition of cross_entropy, log_softmax then nll_loss (its
// Sum), so that what the loss keeps for backward is PyTorch's (a dry run's memory: the output of
// log_softmax, and in backward one gradient each for nll_loss and log_softmax). (The composite is
// the op's whole form: an apply() of the entry inside it would record the entry's node over the
// composite's and differentiate the fused entry instead.)

enum class LossKind { CrossEntropy, Nll };

struct LossArgs {
  int64_t reduction = 0;  // 0 mean, 1 sum, 2 none
  int64_t ignore_index = -100;
  double smoothing = 0.0;
};

LossArgs loss_options(const OpArgs& args) {
  LossArgs a;
  if (!args.ints.empty()) a.reduction = args.ints[0];
  if (args.ints.size() > 1) a.ignore_index = args.ints[1];
  if (!args.reals.empty()) a.smoothing = args.reals[0];
  return a;
}

template <LossKind k>
constexpr std::string_view loss_name() {
  return k == LossKind::CrossEntropy ? "cross_entropy" : "nll_loss";
}

// The class dim of logits of `ndim` dims: 1, or 0 for unbatched [C].
int64_t class_dim(size_t ndim) {
  return ndim == 1 ? 0 : 1;
}

// The logits dim that target dim j lines up with.
int target_to_logits_dim(int j) {
  return j == 0 ? 0 : j + 1;
}

template <LossKind k>
OpMeta loss_meta(std::span<const InputMeta> in, const OpArgs& args) {
  constexpr std::string_view name = loss_name<k>();
  const Shape& logits = *in[0].shape;
  const Shape& target = *in[1].shape;
  check_floating(name, in[0], k == LossKind::CrossEntropy ? "logits" : "input");
  if (in[1].dtype != DType::I64 && in[1].dtype != DType::I32) {
    throw_error<Unsupported>("{}: the target must be I64 or I32 class indices, got {} (shape {})",
                             name, in[1].dtype, shape_str(target));
  }
  Shape want;
  for (size_t d = 0; d < logits.size(); ++d) {
    if (static_cast<int64_t>(d) != class_dim(logits.size())) want.push_back(logits[d]);
  }
  if (logits.empty() || target != want) {
    throw_error<ShapeError>(
        "{}: expects {} [N, C, d1, ...] and target [N, d1, ...] (or [C] and []), got {} {} and "
        "target {}",
        name, k == LossKind::CrossEntropy ? "logits" : "input",
        k == LossKind::CrossEntropy ? "logits" : "input", shape_str(logits), shape_str(target));
  }
  const LossArgs a = loss_options(args);
  if (a.reduction < 0 || a.reduction > 2) {
    throw_error<ConfigError>("{}: reduction {} is none of mean (0), sum (1) and none (2)", name,
                             a.reduction);
  }
  if (!(a.smoothing >= 0.0 && a.smoothing <= 1.0)) {
    throw_error<ConfigError>("{}: label_smoothing must lie in [0, 1], got {} (logits {})", name,
                             a.smoothing, shape_str(logits));
  }
  if (k == LossKind::Nll && a.smoothing != 0.0) {
    throw_error<ConfigError>("nll_loss: takes no label smoothing, got {}", a.smoothing);
  }
  return OpMeta{a.reduction == 2 ? target : Shape{}, in[0].dtype};
}

// Where a piece of the target sits in the whole: its offset, and the whole logits' shape (both
// empty: the piece is the whole).
struct TargetPlace {
  Shape offset;
  Shape logits;
};

// "2" for a 1-D target, "[2, 1]" otherwise.
std::string position_str(const Shape& index) {
  return index.size() == 1 ? std::to_string(index[0]) : shape_str(index);
}

// ShapeError naming the first target that is neither a class index in [0, classes) nor
// ignore_index, its position and the class count, as torch's "Target 7 is out of bounds" says less.
void check_targets(std::string_view name, const Tensor& target, const Tensor& logits,
                   int64_t ignore_index, const TargetPlace& place) {
  if (target.is_meta()) return;
  const int64_t classes = logits.size(class_dim(static_cast<size_t>(logits.dim())));
  const Tensor host = target.to(cpu()).to(DType::I64).contiguous();
  const int64_t* p = host.data<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if ((p[i] >= 0 && p[i] < classes) || p[i] == ignore_index) continue;
    Shape index(static_cast<size_t>(host.dim()));
    for (int64_t r = i, d = host.dim() - 1; d >= 0; --d) {
      const auto u = static_cast<size_t>(d);
      index[u] = r % host.size(d) + (place.offset.empty() ? 0 : place.offset[u]);
      r /= host.size(d);
    }
    throw_error<ShapeError>(
        "{}: target {} at index {} is not a class index: expected [0, {}) for the {} classes of "
        "logits {} (or ignore_index {})",
        name, p[i], position_str(index), classes, classes,
        shape_str(place.logits.empty() ? logits.shape() : place.logits), ignore_index);
  }
}

// The targets not ignored (Bool, the target's shape) and the targets with the ignored ones 0.
struct Targets {
  Tensor valid;
  Tensor safe;
};

Targets split_targets(const Tensor& target, int64_t ignore_index) {
  const Tensor t = target.to(DType::I64);
  const Tensor valid = ne(t, full({}, static_cast<double>(ignore_index), DType::I64, t.device()));
  return {valid, where(valid, t, zeros({}, DType::I64, t.device()))};
}

// The loss of every target element (the target's shape), 0 where ignored.
template <LossKind k>
Tensor element_losses(const Tensor& logits, const Tensor& target, const LossArgs& a,
                      const TargetPlace& place = {}) {
  check_targets(loss_name<k>(), target, logits, a.ignore_index, place);
  const int64_t cd = class_dim(static_cast<size_t>(logits.dim()));
  const Targets t = split_targets(target, a.ignore_index);
  Tensor loss;
  if constexpr (k == LossKind::Nll) {
    loss = -gather(logits, cd, t.safe.unsqueeze(cd)).squeeze(cd);
  } else {
    const Tensor shifted = logits - amax(logits, {cd}, true);
    const Tensor lse = log(sum(exp(shifted), {cd}));
    const Tensor picked = gather(shifted, cd, t.safe.unsqueeze(cd)).squeeze(cd);
    if (a.smoothing == 0.0) {
      loss = lse - picked;
    } else {
      const double classes = static_cast<double>(logits.size(cd));
      loss = lse - picked * (1.0 - a.smoothing) - sum(shifted, {cd}) * (a.smoothing / classes);
    }
  }
  return call(op::masked_fill, {loss, t.valid}, {{1}, {0.0}});
}

// The losses reduced as the args say: the count for Mean is of this target's elements.
Tensor reduce_losses(const Tensor& losses, const Tensor& target, const LossArgs& a) {
  if (a.reduction == 2) return losses;
  if (a.reduction == 1) return sum(losses);
  const Tensor count = sum(split_targets(target, a.ignore_index).valid);
  return sum(losses) / count;
}

template <LossKind k>
Tensor loss_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  const LossArgs a = loss_options(args);
  return reduce_losses(element_losses<k>(in[0], in[1], a), in[1], a);
}

// A piece of elements (None: its losses; Sum: its partial sum; Mean runs only unsharded, Note
// [Mean over the elements not ignored]). The piece knows its place for the error message.
template <LossKind k>
Tensor loss_piece(std::span<const Tensor> pieces, const OpArgs& args, const PieceContext& where) {
  const LossArgs a = loss_options(args);
  const TargetPlace place{where.inputs[1]->local_offset(where.coordinate),
                          where.inputs[0]->shape()};
  return reduce_losses(element_losses<k>(pieces[0], pieces[1], a, place), pieces[1], a);
}

// All Replicate; None and Sum: each element dim sharded with the target's dim (None keeps it,
// Sum gives P(sum)). Mean over sharded elements runs as the composite.
std::vector<OpStrategy> loss_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const LossArgs a = loss_options(args);
  std::vector<DimOption> options = {{{Replicate{}, Replicate{}}, Replicate{}}};
  if (a.reduction != 0 && in[0]->ndim() >= 2) {
    for (int j = 0; j < static_cast<int>(in[1]->ndim()); ++j) {
      options.push_back({{Shard{target_to_logits_dim(j)}, Shard{j}},
                         a.reduction == 2 ? Placement{Shard{j}} : Placement{Partial{}}});
    }
  }
  return expand_dim_options(in, options);
}

bool loss_use_composite(ShardingInputs in, const OpArgs& args) {
  const int cd = static_cast<int>(class_dim(static_cast<size_t>(in[0]->ndim())));
  const bool mean = loss_options(args).reduction == 0;
  for (const Placement& p : in[0]->placements()) {
    if (is_shard(p, cd) || (mean && is_shard(p))) return true;
  }
  if (mean) {
    for (const Placement& p : in[1]->placements()) {
      if (is_shard(p)) return true;
    }
  }
  return false;
}

Var var_scalar_op(const OpDef& op, const Var& v, double c) {
  return apply(op, {v}, {{}, {c}});
}

// The composite form (Notes [Vocabulary-parallel cross-entropy], [Mean over the elements not
// ignored]).
template <LossKind k>
Var loss_composite(std::span<const Var> in, ShardingInputs shardings, const OpArgs& args) {
  const Var& logits = in[0];
  const Var& target = in[1];
  const LossArgs a = loss_options(args);
  const Shape& shape = var_shape(logits);
  const int64_t cd = class_dim(shape.size());
  // The targets not ignored, and the targets with the ignored ones 0 (table ops on the target).
  const Var zero = var_scalar_op(op::mul_scalar, target, 0.0);
  const Var ignored = var_scalar_op(op::add_scalar, zero, static_cast<double>(a.ignore_index));
  const Var valid = apply(op::ne, {target, ignored});
  bool classes_whole = true;
  for (const Placement& p : shardings[0]->placements()) {
    if (is_shard(p, static_cast<int>(cd))) classes_whole = false;
  }
  if (k == LossKind::CrossEntropy && classes_whole && a.smoothing == 0.0 && a.reduction == 0) {
    // Note [Mean over the elements not ignored]: each rank's classes whole, so PyTorch's own
    // decomposition, log_softmax then nll_loss summed, over the global count: the loss holds
    // what PyTorch's holds (log_softmax's output; in backward its gradient and nll_loss's), where
    // the composite below holds the shifted logits and their exponentials too.
    const Var log_probs = apply(op::log_softmax, {logits}, {{cd}, {}});
    Var out;
    try {
      out = apply(op::nll_loss, {log_probs, target},
                  loss_args(NllLossOptions{.reduction = LossReduction::Sum,
                                           .ignore_index = a.ignore_index}));
    } catch (const ShapeError& e) {
      // nll_loss's report (the bad target, its index, the classes) under the op the user called.
      std::string_view why = e.what();
      if (why.starts_with("nll_loss: ")) why.remove_prefix(std::string_view("nll_loss: ").size());
      throw_error<ShapeError>("{} (log_softmax, then nll_loss, over sharded rows): {}",
                              loss_name<k>(), why);
    }
    return out / apply(op::sum, {valid}, reduction_args({}, false));
  }
  const Var safe = apply(op::where, {valid, target, zero});
  const Var index = apply(op::unsqueeze, {safe}, {{cd}, {}});
  Var shifted = logits;
  Var lse;
  if constexpr (k == LossKind::CrossEntropy) {
    const Var max = apply(op::amax, {logits}, reduction_args({cd}, true)).detach();
    shifted = logits - max;
    lse =
        apply(op::log, {apply(op::sum, {apply(op::exp, {shifted})}, reduction_args({cd}, false))});
  }
  Var gathered;
  try {
    gathered = apply(op::gather, {shifted, index}, {{cd}, {}});
  } catch (const ShapeError& e) {
    // The gather's pieces see the whole class range (Note [Masked lookup]): its report names the
    // bad target's value and its position (the target's, with the class dim as 0).
    const int64_t classes = shape[static_cast<size_t>(cd)];
    throw_error<ShapeError>(
        "{}: a target is not a class index: expected [0, {}) for the {} classes of logits {} (or "
        "ignore_index {}; sharded: the gather of the target logits reports the target's value "
        "and its position): {}",
        loss_name<k>(), classes, classes, shape_str(shape), a.ignore_index, e.what());
  }
  // The elements' log-likelihoods as the log-probabilities of one class (the class dim of size 1),
  // each element's target 0 or -1 where ignored: nll_loss (the entry: its elements keep their
  // shards) masks the ignored ones and reduces. Masking here with masked_fill would, in the
  // backward, gather the mask to the gradient's Replicate (Note [Following the first input]).
  Var likelihood = gathered;
  if constexpr (k == LossKind::CrossEntropy) {
    const Var picked = apply(op::squeeze, {gathered}, {{cd}, {}});
    Var loss = lse - picked;
    if (a.smoothing != 0.0) {
      const double classes = static_cast<double>(shape[static_cast<size_t>(cd)]);
      loss = lse - picked * (1.0 - a.smoothing) -
             apply(op::sum, {shifted}, reduction_args({cd}, false)) * (a.smoothing / classes);
    }
    likelihood = apply(op::unsqueeze, {-loss}, {{cd}, {}});
  }
  const Var one_class = apply(op::where, {valid, zero, var_scalar_op(op::sub_scalar, zero, 1.0)});
  const Var out = apply(op::nll_loss, {likelihood, one_class},
                        loss_args(NllLossOptions{.reduction = a.reduction == 2 ? LossReduction::None
                                                                               : LossReduction::Sum,
                                                 .ignore_index = -1}));
  if (a.reduction != 0) return out;
  return out / apply(op::sum, {valid}, reduction_args({}, false));
}

template <LossKind k>
void loss_derivative(BackwardContext& c) {
  const OpDef& derivative =
      k == LossKind::CrossEntropy ? op::cross_entropy_backward : op::nll_loss_backward;
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(derivative, {c.grad(), c.input(0), c.input(1)}, c.args()));
  }
}

// (grad, logits, target) -> the logits' gradient: grad_i / divisor * (softmax(logits_i) - (1 - eps)
// one_hot(t_i) - eps / C) for cross_entropy, -grad_i / divisor * one_hot(t_i) for nll_loss; 0 on
// the ignored elements. grad is 0-d (Mean, Sum) or of the target's shape (None); the divisor is
// the count of elements not ignored for Mean (of the whole target: Mean runs unsharded), else 1.
OpMeta loss_backward_meta(std::span<const InputMeta> in, const OpArgs&) {
  return OpMeta{*in[1].shape, promote_types(in[0].dtype, in[1].dtype)};
}

template <LossKind k>
Tensor loss_backward_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const LossArgs a = loss_options(args);
  const Tensor logits = in[1].to(out.dtype);
  const Tensor& target = in[2];
  const int64_t cd = class_dim(static_cast<size_t>(logits.dim()));
  const int64_t classes = logits.size(cd);
  const Targets t = split_targets(target, a.ignore_index);
  Shape along(static_cast<size_t>(logits.dim()), 1);
  along[static_cast<size_t>(cd)] = classes;
  const Tensor one_hot =
      eq(arange(classes, DType::I64).reshape(along).to(logits.device()), t.safe.unsqueeze(cd))
          .to(out.dtype);
  Tensor delta;
  if constexpr (k == LossKind::Nll) {
    delta = -one_hot;
  } else {
    delta = softmax(logits, cd) - one_hot * (1.0 - a.smoothing);
    if (a.smoothing != 0.0) delta = delta - a.smoothing / static_cast<double>(classes);
  }
  Tensor g = in[0].to(out.dtype);
  if (a.reduction == 0) g = g / sum(t.valid);
  if (a.reduction != 2) g = g.expand(target.shape());
  // masked_fill, not a product: a Mean over no element divides by 0, and its gradient is 0.
  const Tensor scale = call(op::masked_fill, {g, t.valid}, {{1}, {0.0}});
  return delta * scale.unsqueeze(cd);
}

// All Replicate; the gradient linear in grad (P(sum) and P(avg) pass); None and Sum: each element
// dim sharded with the target's (None: grad's too).
std::vector<OpStrategy> loss_backward_strategies(ShardingInputs in, const OpArgs& args,
                                                 const OpMeta&) {
  const LossArgs a = loss_options(args);
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{{R, R, R}, R},
                                    {{Partial{}, R, R}, Partial{}},
                                    {{Partial{ReduceOp::Avg}, R, R}, Partial{ReduceOp::Avg}}};
  if (a.reduction != 0 && in[1]->ndim() >= 2) {
    for (int j = 0; j < static_cast<int>(in[2]->ndim()); ++j) {
      const int d = target_to_logits_dim(j);
      options.push_back(
          {{a.reduction == 2 ? Placement{Shard{j}} : R, Shard{d}, Shard{j}}, Shard{d}});
    }
  }
  return expand_dim_options(in, options);
}

// ---- mse_loss -----------------------------------------------------------------------------------
// inputs (a, b) broadcasting; args.ints = [reduction (0 mean, 1 sum, 2 none)]. (a - b)^2 per
// element of the broadcast shape; Mean divides by that shape's element count. Sharding: the
// elementwise shards pass (None keeps them, Sum and Mean give P(sum): a Mean piece divides by the
// global count, so the sum over ranks is the mean even for uneven shards).

int64_t mse_reduction(const OpArgs& args) {
  return args.ints.empty() ? 0 : args.ints[0];
}

Shape mse_shape(const Shape& a, const Shape& b) {
  return broadcast_shapes(a, b, "mse_loss");
}

OpMeta mse_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const DType dtype = promote_types(in[0].dtype, in[1].dtype);
  if (!is_floating(dtype)) {
    throw_error<Unsupported>(
        "mse_loss: the inputs must be floating, got {} and {} (shapes {} and {})", in[0].dtype,
        in[1].dtype, shape_str(*in[0].shape), shape_str(*in[1].shape));
  }
  const Shape shape = mse_shape(*in[0].shape, *in[1].shape);
  const int64_t r = mse_reduction(args);
  if (r < 0 || r > 2) {
    throw_error<ConfigError>("mse_loss: reduction {} is none of mean (0), sum (1) and none (2)", r);
  }
  return OpMeta{r == 2 ? shape : Shape{}, dtype};
}

Tensor mse_of(const Tensor& a, const Tensor& b, int64_t reduction, double count) {
  const Tensor d = a - b;
  const Tensor sq = d * d;
  if (reduction == 2) return sq;
  return reduction == 1 ? sum(sq) : sum(sq) / count;
}

Tensor mse_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor a = in[0].to(out.dtype);
  const Tensor b = in[1].to(out.dtype);
  return mse_of(a, b, mse_reduction(args),
                static_cast<double>(shape_numel(mse_shape(a.shape(), b.shape()))));
}

Tensor mse_piece(std::span<const Tensor> pieces, const OpArgs& args, const PieceContext& where) {
  const DType dtype = promote_types(pieces[0].dtype(), pieces[1].dtype());
  const double count = static_cast<double>(
      shape_numel(mse_shape(where.inputs[0]->shape(), where.inputs[1]->shape())));
  return mse_of(pieces[0].to(dtype), pieces[1].to(dtype), mse_reduction(args), count);
}

std::vector<OpStrategy> mse_strategies(ShardingInputs in, const OpArgs& args, const OpMeta& out) {
  const OpMeta full{mse_shape(in[0]->shape(), in[1]->shape()), out.dtype};
  std::vector<DimOption> options = pointwise_shard_options(in, full);
  if (mse_reduction(args) != 2) {
    for (DimOption& o : options) {
      if (is_shard(o.output)) o.output = Partial{};
    }
  }
  return expand_dim_options(in, options);
}

// d/da = 2 (a - b) grad / count, summed to a's shape; d/db its negation.
void mse_backward(BackwardContext& c) {
  const Var& a = c.input(0);
  const Var& b = c.input(1);
  const int64_t r = mse_reduction(c.args());
  double scale = 2.0;
  if (r == 0) {
    scale /= static_cast<double>(shape_numel(mse_shape(var_shape(a), var_shape(b))));
  }
  const Var g = (a - b) * c.grad() * scale;
  if (c.needs_grad(0)) c.set_grad(0, sum_to(g, var_shape(a)));
  if (c.needs_grad(1)) c.set_grad(1, sum_to(-g, var_shape(b)));
}

// ---- scaled_dot_product_attention ---------------------------------------------------------------
// inputs (q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv][, mask]) with the same leading dims
// (batch, heads); args.ints = [causal, enable_gqa, has_mask] (the last two may be absent: 0),
// args.reals = [scale]. softmax(q k^T * scale, masked) v, as torch's: the causal mask hides key j
// from query i when j > i (top-left alignment); the mask, broadcastable to [..., Sq, Sk], is Bool
// (true: attend; false: -inf) or floating (added to the scores), and not both with causal (torch's
// assertion). enable_gqa: k and v have Hkv heads (dim -3) dividing q's H, and query head h uses kv
// head h / (H / Hkv) (torch's repeat_interleave). attention_probs (q, k[, mask]) is the softmax
// alone, which the backward recomputes instead of saving.
//
// Note [Attention sharding]
// The batch dims pass sharded alike (the mask's with them where it has them); the heads too when
// q and k/v have as many heads, or with GQA when H and Hkv both divide evenly over the mesh dims
// that shard them (query block c then uses exactly kv block c). With GQA and Hkv smaller than the
// tensor-parallel degree, q's heads shard with k and v whole on the heads: each piece maps its
// global query heads (PieceContext offsets) to the kv heads it holds. The query rows may shard with
// k and v whole (each piece masks with its rows' global offset, the mask sharded with the rows);
// a Partial of v passes (the output is linear in v). attention_grad shards the same way, the
// output's gradient with q; its dk and dv sum over q's rows and heads, so they are Partial where
// q's rows or heads are split and k's and v's are whole.

struct AttentionFlags {
  bool causal = false;
  bool gqa = false;
  bool mask = false;
};

AttentionFlags attention_flags(const OpArgs& args) {
  auto flag = [&](size_t i) { return args.ints.size() > i && args.ints[i] != 0; };
  return {flag(0), flag(1), flag(2)};
}

// Where the optional mask sits: after v (the attention) or after k (its probabilities).
size_t mask_index(bool with_v) {
  return with_v ? 3 : 2;
}

void check_attention(std::span<const InputMeta> in, const OpArgs& args, bool with_v) {
  constexpr std::string_view name = "scaled_dot_product_attention";
  const AttentionFlags f = attention_flags(args);
  const size_t n_data = with_v ? 3 : 2;
  if (in.size() != n_data + (f.mask ? 1 : 0)) {
    throw_error<ShapeError>("{}: expects {} inputs{}, got {}", name, n_data + (f.mask ? 1 : 0),
                            f.mask ? " (q, k, v and the mask)" : "", in.size());
  }
  const Shape& q = *in[0].shape;
  const Shape& k = *in[1].shape;
  for (size_t t = 0; t < n_data; ++t) check_floating(name, in[t], "input");
  const size_t nd = q.size();
  // The leading dims must agree, but for the heads (dim -3) with GQA: Hkv divides H.
  auto leading_ok = [&](const Shape& o) {
    if (o.size() != nd) return false;
    for (size_t d = 0; d + 2 < nd; ++d) {
      if (f.gqa && d + 3 == nd) {
        if (o[d] == 0 || q[d] % o[d] != 0) return false;
      } else if (o[d] != q[d]) {
        return false;
      }
    }
    return true;
  };
  bool ok = nd >= (f.gqa ? 3u : 2u) && leading_ok(k) && q.back() == k.back();
  if (with_v) {
    const Shape& v = *in[2].shape;
    ok = ok && leading_ok(v) && v[nd - 2] == k[nd - 2] && (!f.gqa || v[nd - 3] == k[nd - 3]);
  }
  if (!ok) {
    // Grouped-query attention without enable_gqa: k and v have fewer heads than q, the rest fits.
    std::string hint;
    if (!f.gqa && nd >= 3 && k.size() == nd && k[nd - 3] > 0 && k[nd - 3] < q[nd - 3] &&
        q[nd - 3] % k[nd - 3] == 0) {
      hint = fmt::format(
          "; k has {} heads for q's {}: repeat the key/value heads (repeat_interleave(k, {}, -3)) "
          "or pass enable_gqa",
          k[nd - 3], q[nd - 3], q[nd - 3] / k[nd - 3]);
    }
    throw_error<ShapeError>(
        "{}: expects q [..., Sq, D], k [..., Sk, D] and v [..., Sk, Dv] with equal leading dims{}, "
        "got q {}, k {}{}{}",
        name,
        f.gqa ? " but for the heads (dim -3), where k's and v's (equal) must divide q's "
                "(enable_gqa)"
              : "",
        shape_str(q), shape_str(k), with_v ? ", v " + shape_str(*in[2].shape) : "", hint);
  }
  if (!f.mask) return;
  const InputMeta& m = in[mask_index(with_v)];
  const Shape& ms = *m.shape;
  if (m.dtype != DType::Bool && !is_floating(m.dtype)) {
    throw_error<Unsupported>("{}: the mask must be Bool or floating, got {} (shape {})", name,
                             m.dtype, shape_str(ms));
  }
  Shape scores = q;
  scores.back() = k[nd - 2];
  bool fits = ms.size() <= scores.size();
  for (size_t i = 0; fits && i < ms.size(); ++i) {
    const int64_t have = ms[ms.size() - 1 - i];
    fits = have == 1 || have == scores[scores.size() - 1 - i];
  }
  if (!fits) {
    throw_error<ShapeError>("{}: the mask {} does not broadcast to the scores [..., Sq, Sk] = {}",
                            name, shape_str(ms), shape_str(scores));
  }
  if (f.causal) {
    throw_error<ConfigError>(
        "{}: a mask and causal together are not supported (as torch's); put the causal mask into "
        "the mask (mask {}, q {})",
        name, shape_str(ms), shape_str(q));
  }
}

// An infinite or NaN scale makes every score NaN (a negative one is unusual but well defined).
void check_scale(const OpArgs& args) {
  const double scale = args.reals.at(0);
  if (!std::isfinite(scale)) {
    throw_error<ConfigError>("scaled_dot_product_attention: scale must be finite, got {}", scale);
  }
}

OpMeta attention_meta(std::span<const InputMeta> in, const OpArgs& args) {
  check_attention(in, args, true);
  check_scale(args);
  Shape out = *in[0].shape;
  out.back() = in[2].shape->back();
  DType dtype = promote_types(promote_types(in[0].dtype, in[1].dtype), in[2].dtype);
  return OpMeta{std::move(out), dtype};
}

OpMeta attention_probs_meta(std::span<const InputMeta> in, const OpArgs& args) {
  check_attention(in, args, false);
  check_scale(args);
  Shape out = *in[0].shape;
  out.back() = (*in[1].shape)[in[1].shape->size() - 2];
  return OpMeta{std::move(out), promote_types(in[0].dtype, in[1].dtype)};
}

// Where a piece sits: its first query row and first query head, and its k's first head.
struct AttentionOffsets {
  int64_t row = 0;
  int64_t q_head = 0;
  int64_t kv_head = 0;
};

AttentionOffsets attention_offsets(const PieceContext& where) {
  const Shape q = where.inputs[0]->local_offset(where.coordinate);
  AttentionOffsets o{q[q.size() - 2], 0, 0};
  if (q.size() >= 3) {
    const Shape k = where.inputs[1]->local_offset(where.coordinate);
    o.q_head = q[q.size() - 3];
    o.kv_head = k[k.size() - 3];
  }
  return o;
}

// The kv heads (dim -3) each of q's local heads uses: global query head o.q_head + j uses kv head
// (o.q_head + j) / (H / Hkv), which is local head that minus o.kv_head.
Tensor heads_for_queries(const Tensor& kv, int64_t q_heads, int64_t group,
                         const AttentionOffsets& o) {
  const int64_t nd = kv.dim();
  if (group == 1 && o.q_head == o.kv_head && kv.size(nd - 3) == q_heads) return kv;
  std::vector<int64_t> index(static_cast<size_t>(q_heads));
  for (int64_t j = 0; j < q_heads; ++j) {
    index[static_cast<size_t>(j)] = (o.q_head + j) / group - o.kv_head;
    SPMD_CHECK_MSG(
        index[static_cast<size_t>(j)] >= 0 && index[static_cast<size_t>(j)] < kv.size(nd - 3),
        "scaled_dot_product_attention: a piece lacks the kv head of query head {}", o.q_head + j);
  }
  return index_select(kv, nd - 3, from_vector(index, {q_heads}).to(kv.device()));
}

// The attention weights of these queries (their offsets `o`), keys already per query head.
Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor* mask, const OpArgs& args,
                         int64_t row) {
  Tensor scores = matmul(q, k.transpose(-1, -2)) * args.reals.at(0);
  if (attention_flags(args).causal) {
    const int64_t rows = q.size(-2);
    const int64_t cols = k.size(-2);
    std::vector<bool> hidden(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) hidden[static_cast<size_t>(i * cols + j)] = j > row + i;
    }
    scores = masked_fill(scores, from_vector(hidden, {rows, cols}).to(q.device()),
                         -std::numeric_limits<double>::infinity());
  }
  if (mask != nullptr) {
    scores = mask->dtype() == DType::Bool ? call(op::masked_fill, {scores, *mask},
                                                 {{1}, {-std::numeric_limits<double>::infinity()}})
                                          : scores + mask->to(scores.dtype());
  }
  return softmax(scores, -1);
}

// The GQA group: query heads per kv head (1 without GQA).
int64_t gqa_group(const Shape& q, const Shape& k, const OpArgs& args) {
  if (!attention_flags(args).gqa) return 1;
  return q[q.size() - 3] / k[k.size() - 3];
}

// The weights on pieces (or whole tensors: offsets 0), and v per query head when given.
struct AttentionPieces {
  Tensor q, k, v;
  const Tensor* mask = nullptr;
};

// The mask, if any, is in[mask_at] (default: after v, or after k without v).
AttentionPieces attention_pieces(std::span<const Tensor> in, const OpArgs& args, bool with_v,
                                 DType dtype, const AttentionOffsets& o, const Shape& q_global,
                                 const Shape& k_global, std::optional<size_t> mask_at = {}) {
  AttentionPieces p;
  p.q = in[0].to(dtype);
  p.k = in[1].to(dtype);
  if (with_v) p.v = in[2].to(dtype);
  if (p.q.dim() >= 3) {  // the kv heads of this piece's query heads (Note [Attention sharding])
    const int64_t group = gqa_group(q_global, k_global, args);
    const int64_t heads = p.q.size(-3);
    p.k = heads_for_queries(p.k, heads, group, o);
    if (with_v) p.v = heads_for_queries(p.v, heads, group, o);
  }
  if (attention_flags(args).mask) p.mask = &in[mask_at.value_or(mask_index(with_v))];
  return p;
}

// Note [Blocked attention] (tensor/kernels/attention.cpp): the kernel's operands for q, k, v and
// the mask (at in[mask_at] when there is one) of a piece at offsets `o`: each tensor folded to
// [items, S, D], every query item pointed at its kv item (GQA and the head offsets of Note
// [Attention sharding]), the mask broadcast to the scores.
struct BlockedOperands {
  AttentionKernelArgs args;
  int64_t items = 0;     // query items (the product of q's leading dims)
  int64_t kv_items = 0;  // k and v items
};

int64_t leading_items(const Shape& s) {
  int64_t n = 1;
  for (size_t d = 0; d + 2 < s.size(); ++d) n *= s[d];
  return n;
}

BlockedOperands blocked_operands(std::span<const Tensor> in, const OpArgs& args,
                                 const AttentionOffsets& o, const Shape& q_global,
                                 const Shape& k_global, DType dtype, size_t mask_at) {
  const AttentionFlags f = attention_flags(args);
  const Tensor q = in[0].to(dtype).contiguous();
  const Tensor k = in[1].to(dtype).contiguous();
  const Tensor v = in[2].to(dtype).contiguous();
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const size_t nd = qs.size();
  BlockedOperands b;
  b.items = leading_items(qs);
  b.kv_items = leading_items(ks);
  b.args.q = q.view({b.items, qs[nd - 2], qs[nd - 1]});
  b.args.k = k.view({b.kv_items, ks[nd - 2], ks[nd - 1]});
  b.args.v = v.view({b.kv_items, ks[nd - 2], v.shape().back()});
  b.args.kv_of.resize(static_cast<size_t>(b.items));
  const int64_t heads = nd >= 3 ? qs[nd - 3] : 1;
  const int64_t kv_heads = nd >= 3 ? ks[nd - 3] : 1;
  const int64_t group = nd >= 3 ? gqa_group(q_global, k_global, args) : 1;
  for (int64_t item = 0; item < b.items; ++item) {
    const int64_t kv_head = (o.q_head + item % heads) / group - o.kv_head;
    SPMD_CHECK_MSG(kv_head >= 0 && kv_head < kv_heads,
                   "scaled_dot_product_attention: a piece lacks the kv head of query head {}",
                   o.q_head + item % heads);
    b.args.kv_of[static_cast<size_t>(item)] = item / heads * kv_heads + kv_head;
  }
  if (f.mask) {
    const Tensor& m = in[mask_at];
    Shape scores = qs;
    scores.back() = ks[nd - 2];
    b.args.mask = (m.dtype() == DType::Bool ? m : m.to(dtype)).expand(scores);
  }
  b.args.scale = args.reals.at(0);
  b.args.causal = f.causal;
  b.args.row_offset = o.row;
  return b;
}

// Whether the blocked kernel can take this dtype at all (the device may still decline).
bool blocked_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64;
}

Tensor attention_run(std::span<const Tensor> in, const OpArgs& args, const AttentionOffsets& o,
                     const Shape& q_global, const Shape& k_global) {
  const DType dtype = promote_types(promote_types(in[0].dtype(), in[1].dtype()), in[2].dtype());
  if (blocked_dtype(dtype)) {
    const BlockedOperands b = blocked_operands(in, args, o, q_global, k_global, dtype, 3);
    Shape shape = in[0].shape();
    shape.back() = in[2].shape().back();
    Tensor out = empty_for("scaled_dot_product_attention", shape, dtype, in[0].device());
    const Tensor folded = out.view({b.items, shape[shape.size() - 2], shape.back()});
    if (kernels_for("scaled_dot_product_attention", in[0].device()).attention(folded, b.args)) {
      return out;
    }
  }
  const AttentionPieces p = attention_pieces(in, args, true, dtype, o, q_global, k_global);
  return matmul(attention_weights(p.q, p.k, p.mask, args, o.row), p.v);
}

Tensor attention_probs_run(std::span<const Tensor> in, const OpArgs& args,
                           const AttentionOffsets& o, const Shape& q_global,
                           const Shape& k_global) {
  const DType dtype = promote_types(in[0].dtype(), in[1].dtype());
  const AttentionPieces p = attention_pieces(in, args, false, dtype, o, q_global, k_global);
  return attention_weights(p.q, p.k, p.mask, args, o.row);
}

// An attention op's compute (whole tensors: offsets 0) and piece function, from its run.
using AttentionRun = Tensor (*)(std::span<const Tensor> in, const OpArgs& args,
                                const AttentionOffsets& o, const Shape& q_global,
                                const Shape& k_global);

template <AttentionRun run>
Tensor attention_whole(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  return run(in, args, {}, in[0].shape(), in[1].shape());
}

template <AttentionRun run>
Tensor attention_on_piece(std::span<const Tensor> in, const OpArgs& args,
                          const PieceContext& where) {
  return run(in, args, attention_offsets(where), where.inputs[0]->shape(),
             where.inputs[1]->shape());
}

// attention_grad (q, k, v, grad[, mask]): attention's gradients through the blocked kernel (Note
// [Blocked attention]), `grad` the output's gradient; args.ints = [causal, enable_gqa, has_mask,
// which], which: 0 dq, 1 dk and dv side by side on the last dim ([..., Sk, D + Dv]: one op, one
// pass over the tiles for both). The mask gets no gradient here: attention's backward takes the
// composed path when it needs one.
enum AttentionGradOf : int64_t { kGradQ = 0, kGradKV = 1 };

int64_t attention_grad_which(const OpArgs& args) {
  return args.ints.size() > 3 ? args.ints[3] : -1;
}

OpMeta attention_grad_meta(std::span<const InputMeta> in, const OpArgs& args) {
  constexpr std::string_view name = "attention_grad";
  const AttentionFlags f = attention_flags(args);
  const int64_t which = attention_grad_which(args);
  if (which != kGradQ && which != kGradKV) {
    throw_error<ConfigError>("{}: args.ints[3] must say which gradient (0: q, 1: k and v), got {}",
                             name, args.to_string());
  }
  if (in.size() != 4 + (f.mask ? 1u : 0u)) {
    throw_error<ShapeError>("{}: expects q, k, v and the output's gradient{}, got {} inputs", name,
                            f.mask ? " and the mask" : "", in.size());
  }
  std::vector<InputMeta> attention_in(in.begin(), in.begin() + 3);
  if (f.mask) attention_in.push_back(in[4]);
  const OpMeta out = attention_meta(attention_in, args);
  if (*in[3].shape != out.shape) {
    throw_error<ShapeError>("{}: the output's gradient must have the output's shape {}, got {}",
                            name, shape_str(out.shape), shape_str(*in[3].shape));
  }
  if (which == kGradQ) return OpMeta{*in[0].shape, out.dtype};
  Shape kv = *in[1].shape;
  kv.back() += in[2].shape->back();
  return OpMeta{std::move(kv), out.dtype};
}

// The composed form, for devices and dtypes without the kernel: the weights p (S^2), then dv =
// p^T g, ds = p (g v^T - rowsum(g v^T p)), dq = scale ds k, dk = scale ds^T q, each kv gradient per
// query head added into its kv item.
void attention_grad_composed(std::span<const Tensor> in, const OpArgs& args,
                             const AttentionOffsets& o, const Shape& q_global,
                             const Shape& k_global, DType dtype, const BlockedOperands& b,
                             Tensor dq, Tensor dk, Tensor dv) {
  const AttentionPieces p = attention_pieces(in, args, true, dtype, o, q_global, k_global, 4);
  const Tensor probs = attention_weights(p.q, p.k, p.mask, args, o.row);
  const Tensor g = in[3].to(dtype);
  const Tensor dp = matmul(g, p.v.transpose(-1, -2));
  const Tensor ds = probs * (dp - sum(dp * probs, {-1}, true));
  const double scale = args.reals.at(0);
  const int64_t sq = probs.size(-2);
  const int64_t sk = probs.size(-1);
  if (dq.defined()) {
    dq.copy_((matmul(ds, p.k) * scale).reshape({b.items, sq, dq.size(2)}));
    return;
  }
  const Tensor per_k =
      (matmul(ds.transpose(-1, -2), p.q) * scale).reshape({b.items, sk, dk.size(2)});
  const Tensor per_v = matmul(probs.transpose(-1, -2), g).reshape({b.items, sk, dv.size(2)});
  dk.fill_(0.0);
  dv.fill_(0.0);
  for (int64_t item = 0; item < b.items; ++item) {
    const int64_t kv = b.args.kv_of[static_cast<size_t>(item)];
    dk.select(0, kv).copy_(dk.select(0, kv) + per_k.select(0, item));
    dv.select(0, kv).copy_(dv.select(0, kv) + per_v.select(0, item));
  }
}

Tensor attention_grad_run(std::span<const Tensor> in, const OpArgs& args, const AttentionOffsets& o,
                          const Shape& q_global, const Shape& k_global) {
  const DType dtype = promote_types(promote_types(in[0].dtype(), in[1].dtype()), in[2].dtype());
  const BlockedOperands b = blocked_operands(in, args, o, q_global, k_global, dtype, 4);
  const int64_t d = b.args.q.size(2);
  const int64_t dv_size = b.args.v.size(2);
  const int64_t sq = b.args.q.size(1);
  const int64_t sk = b.args.k.size(1);
  Tensor result, dq, dk, dv;
  if (attention_grad_which(args) == kGradQ) {
    result = empty_for("attention_grad", in[0].shape(), dtype, in[0].device());
    dq = result.view({b.items, sq, d});
  } else {
    Shape shape = in[1].shape();
    shape.back() = d + dv_size;
    result = empty_for("attention_grad", shape, dtype, in[0].device());
    const Tensor kv = result.view({b.kv_items, sk, d + dv_size});
    dk = kv.narrow(2, 0, d);
    dv = kv.narrow(2, d, dv_size);
  }
  const Tensor grad = in[3].to(dtype).contiguous().view({b.items, sq, dv_size});
  if (blocked_dtype(dtype) &&
      kernels_for("attention_grad", in[0].device()).attention_backward(dq, dk, dv, grad, b.args)) {
    return result;
  }
  attention_grad_composed(in, args, o, q_global, k_global, dtype, b, dq, dk, dv);
  return result;
}

// The product of the sizes of the mesh dims on which some input t shards its dim dims[t].
int64_t sharding_parts(ShardingInputs in, const std::vector<int>& dims) {
  int64_t parts = 1;
  const std::vector<int64_t>& mesh = in[0]->mesh_shape();
  for (size_t i = 0; i < mesh.size(); ++i) {
    for (size_t t = 0; t < dims.size(); ++t) {
      if (dims[t] >= 0 && is_shard(in[t]->placements()[i], dims[t])) {
        parts *= mesh[i];
        break;
      }
    }
  }
  return parts;
}

// Which of an attention op's inputs shard like q (its rows; its heads with k and v whole on them),
// the others like k and v: attention and attention_probs (q, k[, v][, mask]) and attention_grad
// (q, k, v, grad[, mask]), whose grad is q's kind. A kv-shaped output (dk, dv) is
// the sum over q's rows and heads: Partial where those alone are split.
struct AttentionRoles {
  std::vector<bool> like_q;  // per input before the mask
  bool kv_output = false;
  bool partial_v = false;  // a Partial v gives a Partial output (attention itself)
};

// Note [Attention sharding].
std::vector<OpStrategy> attention_family_strategies(ShardingInputs in, const OpArgs& args,
                                                    const AttentionRoles& roles) {
  const AttentionFlags f = attention_flags(args);
  const size_t n = in.size();
  const size_t n_data = roles.like_q.size();
  const int nd = static_cast<int>(in[0]->ndim());
  const Shape& q = in[0]->shape();
  const Shape& k = in[1]->shape();
  // The scores' shape [..., Sq, Sk], which the mask broadcasts to.
  Shape scores = q;
  scores.back() = k[k.size() - 2];
  // The option with `data` placements and the mask's dim aligned to output dim d; the output
  // Shard{d}, or Partial when only q's kind is split and the output is k's kind.
  auto option = [&](int d, const std::vector<Placement>& data, bool q_alone) {
    const Placement output =
        q_alone && roles.kv_output ? Placement{Partial{ReduceOp::Sum}} : Placement{Shard{d}};
    DimOption o{std::vector<Placement>(n, Replicate{}), output};
    for (size_t t = 0; t < n_data; ++t) o.inputs[t] = data[t];
    if (f.mask) {
      const int m = aligned_dim(in[n - 1]->shape(), scores, d);
      if (m >= 0) o.inputs[n - 1] = Shard{m};
    }
    return o;
  };
  auto q_kind_only = [&](int d) {
    std::vector<Placement> data(n_data, Replicate{});
    for (size_t t = 0; t < n_data; ++t) {
      if (roles.like_q[t]) data[t] = Shard{d};
    }
    return data;
  };
  std::vector<DimOption> options = {{std::vector<Placement>(n, Replicate{}), Replicate{}}};
  for (int d = 0; d + 2 < nd; ++d) {
    const bool heads = d + 3 == nd;
    const int64_t h = q[static_cast<size_t>(d)];
    const int64_t hkv = k[static_cast<size_t>(d)];
    std::vector<int> dims(n, d);
    if (f.mask) dims[n - 1] = aligned_dim(in[n - 1]->shape(), scores, d);
    const int64_t parts = sharding_parts(in, dims);
    if (!heads || h == hkv || (h % parts == 0 && hkv % parts == 0)) {
      options.push_back(option(d, std::vector<Placement>(n_data, Shard{d}), false));
    }
    if (heads) options.push_back(option(d, q_kind_only(d), true));  // k and v whole on the heads
  }
  options.push_back(option(nd - 2, q_kind_only(nd - 2), true));  // q's rows
  if (roles.partial_v) {
    for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
      DimOption p{std::vector<Placement>(n, Replicate{}), Partial{o}};
      p.inputs[2] = Partial{o};
      options.push_back(std::move(p));
    }
  }
  std::vector<OpStrategy> strategies = expand_dim_options(in, options);
  if (nd < 3) return strategies;
  // q's heads sharded where k's are whole, and k's sharded on another mesh dim, would nest q's
  // blocks in a way k's blocks need not contain: k is whole on the heads then, or sharded alike.
  const Placement heads = Shard{nd - 3};
  std::erase_if(strategies, [&](const OpStrategy& st) {
    const Placements& sq = st.inputs[0];
    const Placements& sk = st.inputs[1];
    bool q_only = false;
    bool k_sharded = false;
    for (size_t i = 0; i < sq.size(); ++i) {
      q_only = q_only || (sq[i] == heads && !(sk[i] == heads));
      k_sharded = k_sharded || sk[i] == heads;
    }
    return q_only && k_sharded;
  });
  return strategies;
}

// attention (q, k, v[, mask]) and attention_probs (q, k[, mask]).
std::vector<OpStrategy> attention_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const size_t n_data = in.size() - (attention_flags(args).mask ? 1 : 0);
  AttentionRoles roles;
  roles.like_q = {true, false};
  if (n_data == 3) roles.like_q.push_back(false);
  roles.partial_v = n_data == 3;
  return attention_family_strategies(in, args, roles);
}

// attention_grad (q, k, v, grad[, mask]).
std::vector<OpStrategy> attention_grad_strategies(ShardingInputs in, const OpArgs& args,
                                                  const OpMeta&) {
  AttentionRoles roles;
  roles.like_q = {true, false, false, true};
  roles.kv_output = attention_grad_which(args) != kGradQ;
  return attention_family_strategies(in, args, roles);
}

Var transposed(const Var& v) {
  return apply(op::transpose, {v}, {{-1, -2}, {}});
}

// With GQA: a kv tensor per query head (repeat_interleave along the heads), and the gradient of
// such a tensor summed back over each group of query heads.
Var kv_per_query_head(const Var& kv, int64_t group) {
  if (group == 1) return kv;
  return apply(op::repeat_interleave, {kv}, {{group, -3}, {}});
}

Var kv_gradient(const Var& g, int64_t group, const Shape& kv) {
  if (group == 1) return g;
  return apply(op::repeat_interleave_backward, {g},
               {{group, static_cast<int64_t>(kv.size()) - 3, kv[kv.size() - 3]}, {}});
}

// With p the weights and g the output's gradient (k and v per query head): dv = p^T g;
// ds = p (dp - rowsum(dp p)) for dp = g v^T; dq = ds k scale; dk = ds^T q scale; with GQA dk and
// dv summed over the query heads of each kv head; a floating mask's gradient is ds summed to its
// shape (a Bool mask has none).
void attention_backward(BackwardContext& c) {
  const Var& q = c.input(0);
  const Var& k = c.input(1);
  const Var& v = c.input(2);
  const Var& g = c.grad();
  const AttentionFlags f = attention_flags(c.args());
  const double scale = c.args().reals.at(0);
  const int64_t group = gqa_group(var_shape(q), var_shape(k), c.args());
  // Note [Fused attention accounting]: the S^2 temporaries count no bytes in a dry run on a
  // device with a fused kernel; the gradients of q, k and v do.
  const AttentionKernelScope kernel(f.causal);
  const bool mask_grad = f.mask && c.needs_grad(3);
  if (!meta_tensors() && !mask_grad) {
    // Note [Blocked attention]: no S^2 tensor; dk and dv from one pass.
    OpArgs args = c.args();
    args.ints.resize(3, 0);
    args.ints.push_back(kGradQ);
    std::vector<Var> in = {q, k, v, g};
    if (f.mask) in.push_back(c.input(3));
    if (c.needs_grad(0)) c.set_grad(0, apply(op::attention_grad, in, args));
    if (c.needs_grad(1) || c.needs_grad(2)) {
      args.ints[3] = kGradKV;
      const Var kv = apply(op::attention_grad, in, args);
      const int64_t d = var_shape(k).back();
      const int64_t last = static_cast<int64_t>(var_shape(k).size()) - 1;
      if (c.needs_grad(1)) c.set_grad(1, apply(op::narrow, {kv}, {{last, 0, d}, {}}));
      if (c.needs_grad(2)) {
        c.set_grad(2, apply(op::narrow, {kv}, {{last, d, var_shape(v).back()}, {}}));
      }
    }
    return;
  }
  std::optional<MetaUncountedScope> uncounted;
  auto s2_temporaries = [&](bool on) {
    if (!on) {
      uncounted.reset();
    } else if (fused_attention_accounting() && meta_tensors()) {
      uncounted.emplace();
    }
  };
  s2_temporaries(true);
  const Var p = f.mask ? apply(op::attention_probs, {q, k, c.input(3)}, c.args())
                       : apply(op::attention_probs, {q, k}, c.args());
  const Var pt = c.needs_grad(2) ? transposed(p) : Var();
  s2_temporaries(false);
  if (c.needs_grad(2)) {
    c.set_grad(2, kv_gradient(apply(op::matmul, {pt, g}), group, var_shape(v)));
  }
  if (!c.needs_grad(0) && !c.needs_grad(1) && !mask_grad) return;
  s2_temporaries(true);
  const Var dp = apply(op::matmul, {g, transposed(kv_per_query_head(v, group))});
  const Var ds = p * (dp - apply(op::sum, {dp * p}, reduction_args({-1}, true)));
  const Var dst = c.needs_grad(1) ? transposed(ds) : Var();
  s2_temporaries(false);
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::matmul, {ds, kv_per_query_head(k, group)}) * scale);
  }
  if (c.needs_grad(1)) {
    c.set_grad(1, kv_gradient(apply(op::matmul, {dst, q}) * scale, group, var_shape(k)));
  }
  if (mask_grad) c.set_grad(3, sum_to(ds, var_shape(c.input(3))));
}

// q k^T over every batch and query head (2 * B*H * Sq * Sk * D, so GQA costs as many as its
// query heads), and for the attention itself p v too (twice that).
template <bool probs_only>
double attention_flops(std::span<const InputMeta> in, const OpMeta&) {
  const Shape& q = *in[0].shape;
  const Shape& k = *in[1].shape;
  if (q.size() < 2 || k.size() < 2) return 0.0;
  double batch = 1.0;
  for (size_t d = 0; d + 2 < q.size(); ++d) batch *= static_cast<double>(q[d]);
  const double sq = static_cast<double>(q[q.size() - 2]);
  const double dh = static_cast<double>(q.back());
  const double sk = static_cast<double>(k[k.size() - 2]);
  return (probs_only ? 2.0 : 4.0) * batch * sq * sk * dh;
}

// attention_grad: the products a fused backward kernel does, given the rows' logsumexp (as
// PyTorch's flash backward is given it), which add up to the composed backward's (Note [Fused
// attention accounting]), so a dry run counts the same either way: dq: q k^T, g v^T, ds k; dk and
// dv: p^T g, ds^T q. (Our CPU kernel also makes q k^T, p v and g v^T again where the fused one
// shares them; flops sees no args: the output's last dim, D + Dv, tells dk and dv from dq.)
double attention_grad_flops(std::span<const InputMeta> in, const OpMeta& out) {
  const Shape& q = *in[0].shape;
  const Shape& k = *in[1].shape;
  const Shape& v = *in[2].shape;
  if (q.size() < 2 || out.shape.empty()) return 0.0;
  const double pairs = static_cast<double>(leading_items(q)) *
                       static_cast<double>(q[q.size() - 2]) * static_cast<double>(k[k.size() - 2]);
  const double d = static_cast<double>(q.back());
  const double dv = static_cast<double>(v.back());
  const bool kv = v.back() > 0 && out.shape.back() == q.back() + v.back();
  return 2.0 * pairs * (kv ? d + dv : 2.0 * d + dv);
}

std::atomic<bool> g_fused_attention_accounting{false};
thread_local AttentionKernel t_attention_kernel;

}  // namespace

void set_fused_attention_accounting(bool on) {
  g_fused_attention_accounting.store(on, std::memory_order_relaxed);
}

bool fused_attention_accounting() {
  return g_fused_attention_accounting.load(std::memory_order_relaxed);
}

AttentionKernel attention_kernel() {
  return t_attention_kernel;
}

AttentionKernelScope::AttentionKernelScope(bool causal) : saved_(t_attention_kernel) {
  t_attention_kernel = AttentionKernel{true, causal};
}

AttentionKernelScope::~AttentionKernelScope() {
  t_attention_kernel = saved_;
}

OpArgs attention_args(int64_t head_dim, bool causal, std::optional<double> scale) {
  const double s =
      scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(head_dim, 1)));
  return OpArgs{{causal ? 1 : 0}, {s}};
}

OpArgs attention_args(int64_t head_dim, const AttentionOptions& options, bool has_mask) {
  OpArgs args = attention_args(head_dim, options.causal, options.scale);
  args.ints.push_back(options.enable_gqa ? 1 : 0);
  args.ints.push_back(has_mask ? 1 : 0);
  return args;
}

const OpDef op::layer_norm{
    .name = "layer_norm",
    .meta = norm_meta<false>,
    .compute = norm_compute<false>,
    .strategies = [](ShardingInputs in, const OpArgs&,
                     const OpMeta&) { return rowwise_strategies(in, 1); },
    .backward = norm_backward<false>,
    .saves = saves_inputs({0, 1}),
};
const OpDef op::layer_norm_backward{
    .name = "layer_norm_backward",
    .meta = norm_backward_meta<false>,
    .compute = norm_backward_compute<false>,
    .strategies = [](ShardingInputs in, const OpArgs&,
                     const OpMeta&) { return rowwise_strategies(in, 2); },
};
const OpDef op::rms_norm{
    .name = "rms_norm",
    .meta = norm_meta<true>,
    .compute = norm_compute<true>,
    .strategies = [](ShardingInputs in, const OpArgs&,
                     const OpMeta&) { return rowwise_strategies(in, 1); },
    .backward = norm_backward<true>,
    .saves = saves_inputs({0, 1}),
    .eager = &kRmsNormEager,
};
const OpDef op::rms_norm_backward{
    .name = "rms_norm_backward",
    .meta = norm_backward_meta<true>,
    .compute = norm_backward_compute<true>,
    .strategies = [](ShardingInputs in, const OpArgs&,
                     const OpMeta&) { return rowwise_strategies(in, 2); },
    .eager = &kRmsNormEager,
};
const OpDef op::dropout{
    .name = "dropout",
    .meta = dropout_meta,
    .compute = dropout_compute,
    .strategies = dropout_strategies,
    .piece = dropout_piece,
    .backward = dropout_backward,
    .saves = kSavesNone,
};
const OpDef op::cross_entropy{
    .name = "cross_entropy",
    .meta = loss_meta<LossKind::CrossEntropy>,
    .compute = loss_compute<LossKind::CrossEntropy>,
    .strategies = loss_strategies,
    .piece = loss_piece<LossKind::CrossEntropy>,
    .backward = loss_derivative<LossKind::CrossEntropy>,
    .composite = loss_composite<LossKind::CrossEntropy>,
    .use_composite = loss_use_composite,
    .saves = kSavesInputs,
};
const OpDef op::cross_entropy_backward{
    .name = "cross_entropy_backward",
    .meta = loss_backward_meta,
    .compute = loss_backward_compute<LossKind::CrossEntropy>,
    .strategies = loss_backward_strategies,
};
const OpDef op::nll_loss{
    .name = "nll_loss",
    .meta = loss_meta<LossKind::Nll>,
    .compute = loss_compute<LossKind::Nll>,
    .strategies = loss_strategies,
    .piece = loss_piece<LossKind::Nll>,
    .backward = loss_derivative<LossKind::Nll>,
    .composite = loss_composite<LossKind::Nll>,
    .use_composite = loss_use_composite,
};
const OpDef op::nll_loss_backward{
    .name = "nll_loss_backward",
    .meta = loss_backward_meta,
    .compute = loss_backward_compute<LossKind::Nll>,
    .strategies = loss_backward_strategies,
};
const OpDef op::mse_loss{
    .name = "mse_loss",
    .meta = mse_meta,
    .compute = mse_compute,
    .strategies = mse_strategies,
    .piece = mse_piece,
    .backward = mse_backward,
};
const OpDef op::scaled_dot_product_attention{
    .name = "scaled_dot_product_attention",
    .meta = attention_meta,
    .compute = attention_whole<attention_run>,
    .strategies = attention_strategies,
    .piece = attention_on_piece<attention_run>,
    .backward = attention_backward,
    .flops = attention_flops<false>,
    .saves = kSavesInputs,
};
const OpDef op::attention_probs{
    .name = "attention_probs",
    .meta = attention_probs_meta,
    .compute = attention_whole<attention_probs_run>,
    .strategies = attention_strategies,
    .piece = attention_on_piece<attention_probs_run>,
    .flops = attention_flops<true>,
};
const OpDef op::attention_grad{
    .name = "attention_grad",
    .meta = attention_grad_meta,
    .compute = attention_whole<attention_grad_run>,
    .strategies = attention_grad_strategies,
    .piece = attention_on_piece<attention_grad_run>,
    .flops = attention_grad_flops,
};

}  // namespace spmd
