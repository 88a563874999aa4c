// spmd/ops/reduction.cpp: the entries of sum, mean, amax and amin, and argmax and argmin.
//
// args.ints = [keepdim, dims...] (dims as the user gave them; none: every dim). Sharding: a
// reduced sharded dim becomes P(sum)/P(avg)/P(max)/P(min); mean gives P(avg) only when every
// piece of that dim has the same size (else the dim is gathered, so the result equals the
// single-device mean); a P(sum)/P(avg) input passes through sum and mean, P(max) through amax,
// P(min) through amin. An empty piece of a sharded reduced dim (Note [Uneven sharding])
// contributes the reduction's identity to amax's and amin's Partial.
#include <algorithm>
#include <limits>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {

OpArgs reduction_args(const std::vector<int64_t>& dims, bool keepdim) {
  OpArgs args;
  args.ints.reserve(dims.size() + 1);
  args.ints.push_back(keepdim ? 1 : 0);
  args.ints.insert(args.ints.end(), dims.begin(), dims.end());
  return args;
}

namespace {

// The reduced dims of args for a tensor of `shape`: normalized, sorted, each once. ShapeError
// naming the op for a dim out of range or given twice.
std::vector<int64_t> reduced_dims(std::string_view op, const OpArgs& args, const Shape& shape) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  if (args.ints.size() <= 1) {
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
    return dims;
  }
  for (size_t i = 1; i < args.ints.size(); ++i) {
    // A 0-d tensor accepts dim 0 / -1, as in torch; there is nothing to reduce over.
    const int64_t d = normalize_dim(args.ints[i], std::max<int64_t>(ndim, 1), op, shape);
    if (ndim == 0) continue;
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      throw_error<ShapeError>(
          "{}: dim {} appears more than once in dims {} (shape {})", op, args.ints[i],
          shape_str(std::vector<int64_t>(args.ints.begin() + 1, args.ints.end())),
          shape_str(shape));
    }
    dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

bool keepdim(const OpArgs& args) {
  return !args.ints.empty() && args.ints[0] != 0;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keep) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end();
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keep) {
      out.push_back(1);
    }
  }
  return out;
}

template <Reduction r>
OpMeta reduction_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const std::string_view name = op_name(r);
  const Shape& shape = *in[0].shape;
  const std::vector<int64_t> dims = reduced_dims(name, args, shape);
  DType dtype = in[0].dtype;
  if (r == Reduction::Sum && !is_floating(dtype)) dtype = DType::I64;
  if (r == Reduction::Mean && !is_floating(dtype)) {
    throw_error<Unsupported>(
        "mean: dtype {} is not supported (shape {}); only floating dtypes have a mean, convert "
        "with to(DType::F32)",
        dtype, shape_str(shape));
  }
  if (r == Reduction::Amax || r == Reduction::Amin) {
    int64_t count = 1;
    for (int64_t d : dims) count *= shape[static_cast<size_t>(d)];
    if (count == 0 && shape_numel(reduced_shape(shape, dims, true)) > 0) {
      throw_error<ShapeError>(
          "{}: cannot reduce over zero elements (dims {} of shape {}): there is no identity", name,
          shape_str(dims), shape_str(shape));
    }
  }
  return OpMeta{reduced_shape(shape, dims, keepdim(args)), dtype};
}

template <Reduction r>
Tensor reduction_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& t = in[0];
  DeviceOps& kernels = kernels_for(op_name(r), {&t});
  const std::vector<int64_t> dims = reduced_dims(op_name(r), args, t.shape());
  Tensor result = empty(reduced_shape(t.shape(), dims, true), out.dtype, t.device());
  kernels.reduce(r, result, t, dims);
  return result.view(out.shape);
}

ReduceOp reduction_partial(Reduction r) {
  switch (r) {
    case Reduction::Sum:
      return ReduceOp::Sum;
    case Reduction::Mean:
      return ReduceOp::Avg;
    case Reduction::Amax:
      return ReduceOp::Max;
    case Reduction::Amin:
      return ReduceOp::Min;
  }
  return ReduceOp::Sum;
}

template <Reduction r>
std::vector<OpStrategy> reduction_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const std::vector<int64_t> dims = reduced_dims(op_name(r), args, in[0]->shape());
  const bool keep = keepdim(args);
  const int nd = static_cast<int>(in[0]->ndim());
  std::vector<DimOption> options = {{{Replicate{}}, Replicate{}}};
  int kept = 0;
  for (int d = 0; d < nd; ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (reduced) {
      options.push_back({{Shard{d}}, Partial{reduction_partial(r)}});
      if (keep) ++kept;
    } else {
      options.push_back({{Shard{d}}, Shard{kept++}});
    }
  }
  if (r == Reduction::Sum || r == Reduction::Mean) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      options.push_back({{Partial{op}}, Partial{op}});
    }
  } else {
    const ReduceOp op = reduction_partial(r);
    options.push_back({{Partial{op}}, Partial{op}});
  }
  std::vector<OpStrategy> strategies = expand_dim_options(in, options);
  if (r != Reduction::Mean) return strategies;
  // mean gives P(avg) only when every piece of the reduced dims has the same size.
  std::vector<OpStrategy> even;
  for (OpStrategy& s : strategies) {
    bool ok = true;
    for (int64_t d : dims) {
      int64_t n = in[0]->shape()[static_cast<size_t>(d)];
      for (size_t i = 0; i < s.inputs[0].size(); ++i) {
        if (!is_shard(s.inputs[0][i], static_cast<int>(d))) continue;
        const int64_t k = in[0]->mesh_shape()[i];
        if (n % k != 0) ok = false;
        n /= k;
      }
    }
    if (ok) even.push_back(std::move(s));
  }
  return even;
}

// The identity of max (lowest value) or min (highest value) for `dtype`.
double extreme(DType dtype, bool lowest) {
  if (is_floating(dtype)) {
    return lowest ? -std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::infinity();
  }
  if (dtype == DType::Bool) return lowest ? 0.0 : 1.0;
  if (dtype == DType::I32) {
    return lowest ? std::numeric_limits<int32_t>::lowest() : std::numeric_limits<int32_t>::max();
  }
  return lowest ? static_cast<double>(std::numeric_limits<int64_t>::lowest())
                : static_cast<double>(std::numeric_limits<int64_t>::max());
}

// amax/amin of one rank's piece: the identity where the piece of a reduced dim is empty.
template <Reduction r>
Tensor extremum_piece(std::span<const Tensor> pieces, const OpArgs& args, const PieceContext&) {
  const Tensor& t = pieces[0];
  const std::vector<int64_t> dims = reduced_dims(op_name(r), args, t.shape());
  for (int64_t d : dims) {
    if (t.size(d) == 0) {
      return full(reduced_shape(t.shape(), dims, keepdim(args)),
                  extreme(t.dtype(), r == Reduction::Amax), t.dtype(), t.device());
    }
  }
  return call(r == Reduction::Amax ? op::amax : op::amin, pieces, args);
}

// ---- backward -----------------------------------------------------------------------------------

// `v` (a reduction's output or gradient) with the reduced dims put back as size 1, then expanded
// to the input's shape.
Var expand_back(const Var& v, const std::vector<int64_t>& dims, bool keep, const Shape& shape) {
  Var out = v;
  if (!keep) {
    for (int64_t d : dims) out = apply(op::unsqueeze, {out}, {{d}, {}});
  }
  return apply(op::expand, {out}, {shape, {}});
}

// amax/amin's gradient weights: 1 / (number of ties) where an element equals its group's extremum,
// 0 elsewhere. One op, so the extremum and the comparison see the same values: on Partial inputs
// two separate ops could be reduced along different paths and round differently.
template <Reduction r>
Tensor extremum_weights_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& x = in[0];
  const std::vector<int64_t> dims = reduced_dims(op_name(r), args, x.shape());
  const Tensor m =
      call(r == Reduction::Amax ? op::amax : op::amin, {x}, reduction_args(dims, true));
  const Tensor hit = call(op::eq, {x, m}).to(out.dtype);
  return hit / sum(hit, dims, true);
}

template <Reduction r>
const OpDef kExtremumWeights{
    .name = r == Reduction::Amax ? "amax_weights" : "amin_weights",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs&) {
          return OpMeta{*in[0].shape, in[0].dtype};
        },
    .compute = extremum_weights_compute<r>,
    .strategies =  // The reduced dims whole on every rank (no Shard, no Partial); the others keep
                   // their shards.
    [](ShardingInputs in, const OpArgs& args, const OpMeta&) {
      const std::vector<int64_t> dims = reduced_dims(op_name(r), args, in[0]->shape());
      return derived_strategies(in, [&dims](const Placement& p) -> std::optional<Placement> {
        if (is_partial(p)) return std::nullopt;
        if (const Shard* s = std::get_if<Shard>(&p)) {
          if (std::find(dims.begin(), dims.end(), s->dim) != dims.end()) return std::nullopt;
        }
        return p;
      });
    },
};

template <Reduction r>
void reduction_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const Var& x = c.input(0);
  const Shape& shape = var_shape(x);
  const std::vector<int64_t> dims = reduced_dims(op_name(r), c.args(), shape);
  const bool keep = keepdim(c.args());
  Var g = expand_back(c.grad(), dims, keep, shape);
  if constexpr (r == Reduction::Mean) {
    int64_t count = 1;
    for (int64_t d : dims) count *= shape[static_cast<size_t>(d)];
    g = apply(op::div_scalar, {g}, {{}, {static_cast<double>(count)}});
  } else if constexpr (r == Reduction::Amax || r == Reduction::Amin) {
    // Ties share the gradient equally (torch.amax's rule).
    g = g * apply(kExtremumWeights<r>, {x}, c.args());
  }
  c.set_grad(0, g);
}

// ---- argmax and argmin
// --------------------------------------------------------------------------- args.ints = [dim,
// keepdim]. The first index of the largest (argmax) or smallest (argmin) value along dim (NaN
// counts as both, as in torch, where max and min propagate NaN); I64, no gradient. Sharding: dim
// whole on every rank, other shards pass.

template <bool kMax>
constexpr std::string_view arg_name = kMax ? "argmax" : "argmin";

template <bool kMax>
int64_t arg_dim(const OpArgs& args, const Shape& shape) {
  return normalize_dim(args.ints.at(0), std::max<int64_t>(static_cast<int64_t>(shape.size()), 1),
                       arg_name<kMax>, shape);
}

template <bool kMax>
OpMeta arg_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const int64_t d = arg_dim<kMax>(args, shape);
  if (shape.empty()) return OpMeta{{}, DType::I64};
  if (shape[static_cast<size_t>(d)] == 0) {
    throw_error<ShapeError>("{}: dim {} of shape {} is empty: there is no {} element",
                            arg_name<kMax>, d, shape_str(shape), kMax ? "largest" : "smallest");
  }
  return OpMeta{reduced_shape(shape, {d}, args.ints.at(1) != 0), DType::I64};
}

template <bool kMax>
Tensor arg_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& x = in[0];
  if (x.dim() == 0) return zeros({}, DType::I64, x.device());
  const int64_t d = arg_dim<kMax>(args, x.shape());
  const int64_t n = x.size(d);
  const Tensor m = kMax ? amax(x, {d}, true) : amin(x, {d}, true);
  Shape along(static_cast<size_t>(x.dim()), 1);
  along[static_cast<size_t>(d)] = n;
  const Tensor index = arange(n, DType::I64).reshape(along).to(x.device());
  const Tensor nan = call(op::ne, {x, x});
  const Tensor hit = call(op::where, {nan, nan, call(op::eq, {x, m})});
  const Tensor candidates =
      call(op::where, {hit, index, full({}, static_cast<double>(n), DType::I64, x.device())});
  return amin(candidates, {d}, args.ints.at(1) != 0).view(out.shape);
}

template <bool kMax>
std::vector<OpStrategy> arg_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(arg_dim<kMax>(args, in[0]->shape()));
  const bool keep = args.ints.at(1) != 0;
  return derived_strategies(in, [d, keep](const Placement& p) -> std::optional<Placement> {
    if (is_partial(p) || is_shard(p, d)) return std::nullopt;
    if (const Shard* s = std::get_if<Shard>(&p); s != nullptr && s->dim > d && !keep) {
      return Shard{s->dim - 1};
    }
    return p;
  });
}

}  // namespace

const OpDef op::argmax{
    .name = "argmax",
    .meta = arg_meta<true>,
    .compute = arg_compute<true>,
    .strategies = arg_strategies<true>,
};
const OpDef op::argmin{
    .name = "argmin",
    .meta = arg_meta<false>,
    .compute = arg_compute<false>,
    .strategies = arg_strategies<false>,
};

const OpDef op::sum{
    .name = "sum",
    .meta = reduction_meta<Reduction::Sum>,
    .compute = reduction_compute<Reduction::Sum>,
    .strategies = reduction_strategies<Reduction::Sum>,
    .backward = reduction_backward<Reduction::Sum>,
    .partial_use = PartialUse::Unary,
};
const OpDef op::mean{
    .name = "mean",
    .meta = reduction_meta<Reduction::Mean>,
    .compute = reduction_compute<Reduction::Mean>,
    .strategies = reduction_strategies<Reduction::Mean>,
    .backward = reduction_backward<Reduction::Mean>,
    .partial_use = PartialUse::Unary,
};
const OpDef op::amax{
    .name = "amax",
    .meta = reduction_meta<Reduction::Amax>,
    .compute = reduction_compute<Reduction::Amax>,
    .strategies = reduction_strategies<Reduction::Amax>,
    .piece = extremum_piece<Reduction::Amax>,
    .backward = reduction_backward<Reduction::Amax>,
};
const OpDef op::amin{
    .name = "amin",
    .meta = reduction_meta<Reduction::Amin>,
    .compute = reduction_compute<Reduction::Amin>,
    .strategies = reduction_strategies<Reduction::Amin>,
    .piece = extremum_piece<Reduction::Amin>,
    .backward = reduction_backward<Reduction::Amin>,
};

}  // namespace spmd
