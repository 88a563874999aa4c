// spmd/ops/reduction.cpp: the entries of sum, mean, amax and amin, argmax and argmin, and
// logsumexp, var, std, norm and prod.
//
// args.ints = [keepdim, dims...] (dims as the user gave them; none: every dim). Sharding: a
// reduced sharded dim becomes P(sum)/P(avg)/P(max)/P(min); mean gives P(avg) only when every
// piece of that dim has the same size (else the dim is gathered, so the result equals the
// single-device mean); a P(sum)/P(avg) input passes through sum and mean, P(max) through amax,
// P(min) through amin. An empty piece of a sharded reduced dim (Note [Uneven sharding])
// contributes the reduction's identity to amax's and amin's Partial.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/pointwise.h>
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

// ---- logsumexp, var, std, norm and prod ---------------------------------------------------------
// args.ints = [keepdim, dims...] as above; var and std: args.reals = [correction]; norm:
// args.reals = [p]. logsumexp of integers gives F32, prod of integers and Bool I64; var, std and
// norm take floating inputs only (as torch). Sharding: the reduced dims whole on every rank, the
// other dims keep their shards; prod also turns a sharded reduced dim into P(product) (an empty
// piece contributes 1) and keeps a P(product) input; logsumexp over a sharded dim runs as table
// ops (logsumexp_composite). None is linear in a pending sum.

enum class Stat { LogSumExp, Var, Std, Norm, Prod };

constexpr std::string_view stat_name(Stat s) {
  switch (s) {
    case Stat::LogSumExp:
      return "logsumexp";
    case Stat::Var:
      return "var";
    case Stat::Std:
      return "std";
    case Stat::Norm:
      return "norm";
    case Stat::Prod:
      return "prod";
  }
  return "?";
}

// var and std's correction (default 1), norm's p (default 2).
double stat_real(const OpArgs& args, Stat s) {
  if (!args.reals.empty()) return args.reals[0];
  return s == Stat::Norm ? 2.0 : 1.0;
}

// The number of elements each output element reduces.
int64_t group_size(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[static_cast<size_t>(d)];
  return n;
}

template <Stat s>
OpMeta stat_meta(std::span<const InputMeta> in, const OpArgs& args) {
  constexpr std::string_view name = stat_name(s);
  const Shape& shape = *in[0].shape;
  const std::vector<int64_t> dims = reduced_dims(name, args, shape);
  DType dtype = in[0].dtype;
  if (!is_floating(dtype)) {
    if constexpr (s == Stat::Prod) {
      dtype = DType::I64;
    } else if constexpr (s == Stat::LogSumExp) {
      dtype = DType::F32;
    } else {
      throw_error<Unsupported>(
          "{}: dtype {} is not supported (shape {}); only floating dtypes, convert with "
          "to(DType::F32)",
          name, dtype, shape_str(shape));
    }
  }
  if constexpr (s == Stat::Var || s == Stat::Std || s == Stat::Norm) {
    if (std::isnan(stat_real(args, s))) {
      throw_error<ConfigError>("{}: {} is NaN (shape {})", name,
                               s == Stat::Norm ? "p" : "correction", shape_str(shape));
    }
  }
  if constexpr (s == Stat::Norm) {
    const double p = stat_real(args, s);
    if (std::isinf(p) && group_size(shape, dims) == 0 &&
        shape_numel(reduced_shape(shape, dims, true)) > 0) {
      throw_error<ShapeError>(
          "norm: the {}inf norm of zero elements (dims {} of shape {}) has no "
          "identity",
          p < 0 ? "-" : "", shape_str(dims), shape_str(shape));
    }
  }
  return OpMeta{reduced_shape(shape, dims, keepdim(args)), dtype};
}

// The product over `dims` (kept as size 1) by halving: the pairs of the first and second halves
// multiplied, log2(n) table multiplications on any device. No element: 1.
Tensor product(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> order;
  Shape merged;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      order.push_back(d);
      merged.push_back(x.size(d));
    }
  }
  order.insert(order.end(), dims.begin(), dims.end());
  int64_t n = group_size(x.shape(), dims);
  merged.push_back(n);
  const Shape kept = reduced_shape(x.shape(), dims, true);
  if (n == 0) return ones(kept, x.dtype(), x.device());
  Tensor t = x.permute(order).contiguous().reshape(merged);
  const int64_t last = t.dim() - 1;
  while (n > 1) {
    const int64_t half = n / 2;
    Tensor p = t.narrow(last, 0, half) * t.narrow(last, half, half);
    if (n % 2 != 0) p = cat({p, t.narrow(last, n - 1, 1)}, last);
    t = p;
    n = half + n % 2;
  }
  return t.reshape(kept);
}

template <Stat s>
Tensor stat_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor x = in[0].to(out.dtype);
  const std::vector<int64_t> dims = reduced_dims(stat_name(s), args, x.shape());
  Tensor r;  // with the reduced dims kept as 1
  if constexpr (s == Stat::LogSumExp) {
    if (group_size(x.shape(), dims) == 0) {
      return full(out.shape, -std::numeric_limits<double>::infinity(), out.dtype, x.device());
    }
    // torch's: the maximum as the shift, 0 where it is infinite (all -inf, or an inf).
    const Tensor m = amax(x, dims, true);
    const Tensor shift = masked_fill(
        m, eq(abs(m), full({}, std::numeric_limits<double>::infinity(), m.dtype(), m.device())),
        0.0);
    r = log(sum(exp(x - shift), dims, true)) + shift;
  } else if constexpr (s == Stat::Var || s == Stat::Std) {
    const double divisor =
        std::max(0.0, static_cast<double>(group_size(x.shape(), dims)) - stat_real(args, s));
    const Tensor centered = x - mean(x, dims, true);
    r = sum(centered * centered, dims, true) / divisor;
    if constexpr (s == Stat::Std) r = sqrt(r);
  } else if constexpr (s == Stat::Norm) {
    const double p = stat_real(args, s);
    if (p == 2.0) {
      r = sqrt(sum(x * x, dims, true));
    } else if (p == 1.0) {
      r = sum(abs(x), dims, true);
    } else if (std::isinf(p)) {
      if (group_size(x.shape(), dims) == 0) return zeros(out.shape, out.dtype, x.device());
      r = p > 0 ? amax(abs(x), dims, true) : amin(abs(x), dims, true);
    } else if (p == 0.0) {
      r = sum(ne(x, zeros({}, x.dtype(), x.device())).to(x.dtype()), dims, true);
    } else {
      r = pow(sum(pow(abs(x), p), dims, true), 1.0 / p);
    }
  } else {
    r = product(x, dims);
  }
  return r.reshape(out.shape);
}

// The reduced dims whole on every rank, the other dims keep their shards (renumbered without the
// reduced dims unless keepdim); prod: a sharded reduced dim gives P(product), which also passes.
template <Stat s>
std::vector<OpStrategy> stat_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const std::vector<int64_t> dims = reduced_dims(stat_name(s), args, in[0]->shape());
  const bool keep = keepdim(args);
  return derived_strategies(in, [&dims, keep](const Placement& p) -> std::optional<Placement> {
    if (const Partial* q = std::get_if<Partial>(&p)) {
      if (s == Stat::Prod && q->op == ReduceOp::Product) return p;
      return std::nullopt;
    }
    if (const Shard* sh = std::get_if<Shard>(&p)) {
      if (std::find(dims.begin(), dims.end(), sh->dim) != dims.end()) {
        if (s == Stat::Prod) return Partial{ReduceOp::Product};
        return std::nullopt;
      }
      int below = 0;
      for (int64_t d : dims) below += !keep && d < sh->dim ? 1 : 0;
      return Shard{sh->dim - below};
    }
    return p;
  });
}

Var zero_mask(const Var& v) {
  return apply(op::eq, {v, apply(op::mul_scalar, {v}, {{}, {0.0}})});
}

Var masked_zero(const Var& v, const Var& mask) {
  return apply(op::masked_fill, {v, mask}, {{0}, {0.0}});
}

// g * sign(x).
Var times_sign(const Var& g, const Var& x) {
  return apply(pointwise::kUnaryDerivative<element::Abs>, {g, x, apply(op::abs, {x})});
}

// logsumexp: g exp(x - out) (the softmax). var: g 2 (x - mean) / max(0, n - correction); std: var's
// with g / (2 std), 0 where std is 0 (torch's std_backward). norm (torch's): p = 2: g x / norm, 0
// where the norm is 0; p = 1: g sign(x); p = +-inf: g sign(x) shared equally by the ties of the
// largest (smallest) |x|; p = 0: 0; else g sign(x) |x|^(p-1) / norm^(p-1), 0 where the norm is 0.
// prod: g times the product of the other elements, without dividing by a zero: with z zeros in
// the group, an element gets g prod(nonzeros) / x when z = 0, g prod(nonzeros) at the zero when
// z = 1, and 0 otherwise (torch's prod_backward). Each product starts with a factor of x's
// placements, so the gradient keeps them (Note [Following the first input]).
template <Stat s>
void stat_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const Var& x = c.input(0);
  const Shape& shape = var_shape(x);
  const std::vector<int64_t> dims = reduced_dims(stat_name(s), c.args(), shape);
  const bool keep = keepdim(c.args());
  auto back = [&](const Var& v) { return expand_back(v, dims, keep, shape); };
  const Var& g = c.grad();
  const Var& out = c.output();
  if constexpr (s == Stat::LogSumExp) {
    c.set_grad(0, apply(op::exp, {x - back(out)}) * back(g));
  } else if constexpr (s == Stat::Var || s == Stat::Std) {
    const double divisor =
        std::max(0.0, static_cast<double>(group_size(shape, dims)) - stat_real(c.args(), s));
    Var gv = g;
    if constexpr (s == Stat::Std) gv = masked_zero(g / (out * 2.0), zero_mask(out));
    const Var centered = x - apply(op::mean, {x}, reduction_args(dims, true));
    c.set_grad(0, centered * back(gv) * (2.0 / divisor));
  } else if constexpr (s == Stat::Norm) {
    const double p = stat_real(c.args(), s);
    if (p == 2.0) {
      c.set_grad(0, x * back(masked_zero(g / out, zero_mask(out))));
    } else if (p == 1.0) {
      c.set_grad(0, times_sign(back(g), x));
    } else if (std::isinf(p)) {
      const Var ties = p > 0 ? apply(kExtremumWeights<Reduction::Amax>, {apply(op::abs, {x})},
                                     reduction_args(dims, true))
                             : apply(kExtremumWeights<Reduction::Amin>, {apply(op::abs, {x})},
                                     reduction_args(dims, true));
      c.set_grad(0, times_sign(ties * back(g), x));
    } else if (p == 0.0) {
      c.set_grad(0, times_sign(back(g) * 0.0, x));
    } else {
      const Var scale =
          masked_zero(g * apply(op::pow_scalar, {out}, {{}, {1.0 - p}}), zero_mask(out));
      c.set_grad(
          0, times_sign(back(scale) * apply(op::pow_scalar, {apply(op::abs, {x})}, {{}, {p - 1.0}}),
                        x));
    }
  } else {
    const Var zero = zero_mask(x);
    const Var safe = apply(op::masked_fill, {x, zero}, {{0}, {1.0}});
    const Var zeros_f = apply(op::to_dtype, {zero}, {{static_cast<int64_t>(var_dtype(x))}, {}});
    // 1 - (zeros among the others), clamped: 1 where no other element is 0.
    const Var alone = apply(
        op::clamp,
        {apply(op::add_scalar, {zeros_f - apply(op::sum, {zeros_f}, reduction_args(dims, true))},
               {{}, {1.0}})},
        clamp_args(0.0, 1.0));
    const Var rest =
        apply(op::reciprocal, {safe}) * apply(op::prod, {safe}, reduction_args(dims, true));
    c.set_grad(0, rest * alone * back(g));
  }
}

// logsumexp over a sharded dim, as table ops: the maximum (P(max) -> all_reduce), the sum of the
// shifted exponentials (P(sum) -> all_reduce), its log plus the shift: two all_reduces of the
// output's size instead of gathering the input. The shift is detached (its gradient cancels), 0
// where the maximum is infinite (m - m is NaN there).
bool reduced_dim_sharded(ShardingInputs in, const OpArgs& args) {
  const std::vector<int64_t> dims = reduced_dims("logsumexp", args, in[0]->shape());
  if (group_size(in[0]->shape(), dims) == 0) return false;  // -inf, no maximum to shift by
  for (const Placement& p : in[0]->placements()) {
    for (int64_t d : dims) {
      if (is_shard(p, static_cast<int>(d))) return true;
    }
  }
  return false;
}

Var logsumexp_composite(std::span<const Var> in, ShardingInputs, const OpArgs& args) {
  Var x = in[0];
  if (!is_floating(var_dtype(x))) {
    x = apply(op::to_dtype, {x}, {{static_cast<int64_t>(DType::F32)}, {}});
  }
  const std::vector<int64_t> dims = reduced_dims("logsumexp", args, var_shape(x));
  const Var m = apply(op::amax, {x}, reduction_args(dims, true)).detach();
  const Var m_minus_m = m - m;
  const Var shift =
      apply(op::masked_fill, {m, apply(op::eq, {m_minus_m, m_minus_m})}, {{1}, {0.0}});
  Var r =
      apply(op::log, {apply(op::sum, {apply(op::exp, {x - shift})}, reduction_args(dims, true))});
  r = r + shift;
  if (keepdim(args)) return r;
  for (auto d = dims.rbegin(); d != dims.rend(); ++d) r = apply(op::squeeze, {r}, {{*d}, {}});
  return r;
}

}  // namespace

OpArgs reduction_args(const std::vector<int64_t>& dims, bool keepdim, double real) {
  OpArgs args = reduction_args(dims, keepdim);
  args.reals = {real};
  return args;
}

const OpDef op::logsumexp{
    .name = "logsumexp",
    .meta = stat_meta<Stat::LogSumExp>,
    .compute = stat_compute<Stat::LogSumExp>,
    .strategies = stat_strategies<Stat::LogSumExp>,
    .backward = stat_backward<Stat::LogSumExp>,
    .composite = logsumexp_composite,
    .use_composite = reduced_dim_sharded,
};
const OpDef op::var{
    .name = "var",
    .meta = stat_meta<Stat::Var>,
    .compute = stat_compute<Stat::Var>,
    .strategies = stat_strategies<Stat::Var>,
    .backward = stat_backward<Stat::Var>,
};
const OpDef op::std{
    .name = "std",
    .meta = stat_meta<Stat::Std>,
    .compute = stat_compute<Stat::Std>,
    .strategies = stat_strategies<Stat::Std>,
    .backward = stat_backward<Stat::Std>,
};
const OpDef op::norm{
    .name = "norm",
    .meta = stat_meta<Stat::Norm>,
    .compute = stat_compute<Stat::Norm>,
    .strategies = stat_strategies<Stat::Norm>,
    .backward = stat_backward<Stat::Norm>,
};
const OpDef op::prod{
    .name = "prod",
    .meta = stat_meta<Stat::Prod>,
    .compute = stat_compute<Stat::Prod>,
    .strategies = stat_strategies<Stat::Prod>,
    .backward = stat_backward<Stat::Prod>,
};

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
    .saves = kSavesNone,
};
const OpDef op::mean{
    .name = "mean",
    .meta = reduction_meta<Reduction::Mean>,
    .compute = reduction_compute<Reduction::Mean>,
    .strategies = reduction_strategies<Reduction::Mean>,
    .backward = reduction_backward<Reduction::Mean>,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
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
