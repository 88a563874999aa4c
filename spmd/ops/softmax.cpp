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

// softmax: dx = y * (g - sum(g * y, d)); log_softmax: dx = g - exp(y) * sum(g, d).
template <bool log>
void softmax_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const Var& y = c.output();
  const Var& g = c.grad();
  const OpArgs dim = reduction_args({c.args().ints[0]}, true);
  if constexpr (log) {
    c.set_grad(0, g - apply(op::exp, {y}) * apply(op::sum, {g}, dim));
  } else {
    c.set_grad(0, y * (g - apply(op::sum, {g * y}, dim)));
  }
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
};

}  // namespace spmd
