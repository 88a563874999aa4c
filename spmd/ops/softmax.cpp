// spmd/ops/softmax.cpp: the entries of softmax and log_softmax along args.ints[0].
//
// Computed stably (max subtracted first); integer inputs give F32; Bool is refused. Sharding: the
// softmax dim must be whole on every rank (never sharded, never Partial); other dims keep their
// shards.
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {
namespace {

template <bool log>
constexpr std::string_view softmax_name() {
  return log ? "log_softmax" : "softmax";
}

template <bool log>
OpMeta softmax_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (in[0].dtype == DType::Bool) {
    throw_error<Unsupported>("{}: dtype bool is not supported (shape {}); convert with to() first",
                             softmax_name<log>(), shape_str(shape));
  }
  normalize_dim(args.ints.at(0), std::max<int64_t>(static_cast<int64_t>(shape.size()), 1),
                softmax_name<log>(), shape);
  return OpMeta{shape, is_floating(in[0].dtype) ? in[0].dtype : DType::F32};
}

template <bool log>
Tensor softmax_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& t = in[0];
  DeviceOps& kernels = kernels_for(softmax_name<log>(), {&t});
  // A 0-d tensor is a softmax over one element.
  const Tensor x = t.dim() == 0 ? t.unsqueeze(0) : t;
  const int64_t d = normalize_dim(args.ints[0], x.dim(), softmax_name<log>(), t.shape());
  Tensor result = empty_for(softmax_name<log>(), x.shape(), out.dtype, t.device());
  kernels.softmax(result, x.to(out.dtype), d, log);
  return t.dim() == 0 ? result.view({}) : result;
}

std::vector<OpStrategy> softmax_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(
      normalize_dim(args.ints[0], std::max<int64_t>(in[0]->ndim(), 1), "softmax", in[0]->shape()));
  return derived_strategies(in, [d](const Placement& p) -> std::optional<Placement> {
    if (is_partial(p) || is_shard(p, d)) return std::nullopt;
    return p;
  });
}

// softmax: dx = y * (g - sum(g * y, d)); log_softmax: dx = g - exp(y) * sum(g, d), one op
// (log_softmax_backward) whose temporaries live inside it, as PyTorch's: the dry run's memory
// and a real run's (one output where the composite allocated three).
template <bool log>
void softmax_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const Var& y = c.output();
  const Var& g = c.grad();
  if constexpr (log) {
    c.set_grad(0, apply(op::log_softmax_backward, {g, y}, c.args()));
  } else {
    const OpArgs dim = reduction_args({c.args().ints[0]}, true);
    c.set_grad(0, y * (g - apply(op::sum, {g * y}, dim)));
  }
}

// ---- log_softmax_backward: (grad, y) with args.ints = [dim] -------------------------------------

OpMeta log_softmax_backward_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& g = *in[0].shape;
  const Shape& y = *in[1].shape;
  if (g != y) {
    throw_error<ShapeError>(
        "log_softmax_backward: the gradient {} and the output {} must have the same shape",
        shape_str(g), shape_str(y));
  }
  if (!is_floating(in[0].dtype) || !is_floating(in[1].dtype)) {
    throw_error<Unsupported>(
        "log_softmax_backward: the gradient ({}) and the output ({}) must be floating (shape {})",
        in[0].dtype, in[1].dtype, shape_str(y));
  }
  normalize_dim(args.ints.at(0), std::max<int64_t>(static_cast<int64_t>(y.size()), 1),
                "log_softmax_backward", y);
  return OpMeta{y, promote_types(in[0].dtype, in[1].dtype)};
}

// The same arithmetic, in the same order and dtypes, as the table ops it replaces (so the same
// bits); promotion gives the meta's dtype.
Tensor log_softmax_backward_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  const Tensor& g = in[0];
  const Tensor& y = in[1];
  if (y.dim() == 0) return g - exp(y) * g;
  const int64_t d = normalize_dim(args.ints[0], y.dim(), "log_softmax_backward", y.shape());
  return g - exp(y) * sum(g, {d}, true);
}

// Both inputs with the same shards, never along the softmax dim; linear in the gradient, so a
// pending sum there stays one (the output alone needs every term).
std::vector<OpStrategy> log_softmax_backward_strategies(ShardingInputs in, const OpArgs& args,
                                                        const OpMeta&) {
  const int nd = static_cast<int>(in[1]->ndim());
  const int d = static_cast<int>(
      normalize_dim(args.ints[0], std::max(nd, 1), "log_softmax_backward", in[1]->shape()));
  std::vector<DimOption> options = {{{Replicate{}, Replicate{}}, Replicate{}}};
  for (int k = 0; k < nd; ++k) {
    if (k != d) options.push_back({{Shard{k}, Shard{k}}, Shard{k}});
  }
  options.push_back({{Partial{}, Replicate{}}, Partial{}});
  return expand_dim_options(in, options);
}

}  // namespace

const OpDef op::softmax{
    .name = "softmax",
    .meta = softmax_meta<false>,
    .compute = softmax_compute<false>,
    .strategies = softmax_strategies,
    .backward = softmax_backward<false>,
    .saves = kSaveOutput,
};
const OpDef op::log_softmax{
    .name = "log_softmax",
    .meta = softmax_meta<true>,
    .compute = softmax_compute<true>,
    .strategies = softmax_strategies,
    .backward = softmax_backward<true>,
    .saves = kSaveOutput,
};
const OpDef op::log_softmax_backward{
    .name = "log_softmax_backward",
    .meta = log_softmax_backward_meta,
    .compute = log_softmax_backward_compute,
    .strategies = log_softmax_backward_strategies,
    .partial_use = PartialUse::Numerator,
};

}  // namespace spmd
