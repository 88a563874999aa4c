// spmd/ops/pointwise.cpp: the shared meta and compute of the elementwise entries, the entries of
// the ops with a scalar operand (x + c, c - x, x * c, x / c, c / x, x ^ c), where, masked_fill and
// clamp.
#include <spmd/ops/pointwise.h>

#include <cmath>
#include <optional>

#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace pointwise {

Tensor as_operand(const Tensor& t, DType dtype, const Shape& shape) {
  if (t.dtype() == dtype && t.shape() == shape) return t;
  return t.to(dtype).expand(shape);
}

namespace {

DType compute_dtype(std::string_view name, element::Domain domain, DType dtype, const Shape& a,
                    const Shape* b) {
  if (domain == element::Domain::Floating && !is_floating(dtype)) return DType::F32;
  if (domain == element::Domain::Numeric && dtype == DType::Bool) {
    if (b == nullptr) {
      throw_error<Unsupported>("{}: dtype bool is not supported (shape {})", name, shape_str(a));
    }
    throw_error<Unsupported>("{}: arithmetic on bool is not supported (shapes {} and {})", name,
                             shape_str(a), shape_str(*b));
  }
  return dtype;
}

}  // namespace

OpMeta unary_meta(std::string_view name, element::Domain domain, const InputMeta& in) {
  return OpMeta{*in.shape, compute_dtype(name, domain, in.dtype, *in.shape, nullptr)};
}

Tensor unary_compute(std::string_view name, int index, const Tensor& in, const OpMeta& out) {
  DeviceOps& kernels = kernels_for(name, {&in});
  Tensor result = empty(out.shape, out.dtype, in.device());
  kernels.unary(index, result, in.to(out.dtype));
  return result;
}

OpMeta binary_meta(std::string_view name, element::Domain domain, bool predicate,
                   const InputMeta& a, const InputMeta& b) {
  Shape shape = broadcast_shapes(*a.shape, *b.shape, name);
  checked_numel(shape, name);
  const DType dtype =
      compute_dtype(name, domain, promote_types(a.dtype, b.dtype), *a.shape, b.shape);
  return OpMeta{std::move(shape), predicate ? DType::Bool : dtype};
}

Tensor binary_compute(std::string_view name, int index, bool predicate, const Tensor& a,
                      const Tensor& b, const OpMeta& out) {
  DeviceOps& kernels = kernels_for(name, {&a, &b});
  const DType dtype = predicate ? promote_types(a.dtype(), b.dtype()) : out.dtype;
  Tensor result = empty(out.shape, out.dtype, a.device());
  kernels.binary(index, result, as_operand(a, dtype, out.shape), as_operand(b, dtype, out.shape));
  return result;
}

OpMeta derivative_meta(std::span<const InputMeta> in, const OpArgs&) {
  return OpMeta{*in[0].shape, in[0].dtype};
}

std::vector<OpStrategy> derivative_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  return linear_pointwise_strategies(in, out);
}

Tensor unary_derivative(std::string_view name, int index, std::span<const Tensor> in,
                        const OpMeta& out) {
  DeviceOps& kernels = kernels_for(name, {&in[0], &in[1], &in[2]});
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  kernels.unary_backward(index, result, in[0], as_operand(in[1], out.dtype, out.shape),
                         as_operand(in[2], out.dtype, out.shape));
  return result;
}

Tensor binary_derivative(std::string_view name, int index, int wrt, std::span<const Tensor> in,
                         const OpMeta& out) {
  DeviceOps& kernels = kernels_for(name, {&in[0], &in[1], &in[2]});
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  kernels.binary_backward(index, wrt, result, in[0], as_operand(in[1], out.dtype, out.shape),
                          as_operand(in[2], out.dtype, out.shape));
  return result;
}

}  // namespace pointwise

// ---- ops with a scalar operand ------------------------------------------------------------------

namespace {

enum class ScalarOp { Add, Sub, RSub, Mul, Div, RDiv, Pow };

bool is_integral_value(double v) {
  return std::isfinite(v) && v == std::trunc(v);
}

constexpr std::string_view scalar_name(ScalarOp op) {
  switch (op) {
    case ScalarOp::Add:
      return "add";
    case ScalarOp::Sub:
    case ScalarOp::RSub:
      return "sub";
    case ScalarOp::Mul:
      return "mul";
    case ScalarOp::Div:
    case ScalarOp::RDiv:
      return "div";
    case ScalarOp::Pow:
      return "pow";
  }
  return "?";
}

// Note [Type promotion]: a scalar does not change the tensor's dtype, except that an integer or
// Bool tensor computes in F32 under true division or with a non-integral scalar.
template <ScalarOp op>
OpMeta scalar_meta(std::span<const InputMeta> in, const OpArgs& args) {
  DType dtype = in[0].dtype;
  const bool division = op == ScalarOp::Div || op == ScalarOp::RDiv || op == ScalarOp::Pow;
  if (!is_floating(dtype) && (division || !is_integral_value(args.reals.at(0)))) {
    dtype = DType::F32;
  }
  if (dtype == DType::Bool) {
    throw_error<Unsupported>("{}: arithmetic on bool is not supported (shapes {} and [])",
                             scalar_name(op), shape_str(*in[0].shape));
  }
  check_fill_value(args.reals.at(0), dtype, scalar_name(op));
  return OpMeta{*in[0].shape, dtype};
}

template <ScalarOp op>
Tensor scalar_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const double c = args.reals[0];
  const DType dtype = pointwise::scalar_compute_dtype(out.dtype);
  const Tensor x = in[0].to(dtype);
  const Tensor s = full({}, c, dtype, x.device());
  Tensor result;
  switch (op) {
    case ScalarOp::Add:
      result = add(x, s);
      break;
    case ScalarOp::Sub:
      result = sub(x, s);
      break;
    case ScalarOp::RSub:
      result = sub(s, x);
      break;
    case ScalarOp::Mul:
      result = mul(x, s);
      break;
    case ScalarOp::Div:
      result = div(x, s);
      break;
    case ScalarOp::RDiv:
      result = div(s, x);
      break;
    case ScalarOp::Pow:
      result = pow(x, s);
      break;
  }
  return result.to(out.dtype);
}

// The output Partial of `op` applied to a Partial(q) and the scalar c, or nullopt.
std::optional<Placement> scalar_partial(ScalarOp op, ReduceOp q, double c) {
  switch (op) {
    case ScalarOp::Add:
    case ScalarOp::Sub:
      // (avg|max|min)_i(x_i + c) = (avg|max|min)_i(x_i) + c.
      if (q == ReduceOp::Avg || is_min_max(q)) return Partial{q};
      return std::nullopt;
    case ScalarOp::RSub:
      // c - avg_i(x_i) = avg_i(c - x_i); c - max_i(x_i) = min_i(c - x_i).
      if (q == ReduceOp::Avg) return Partial{q};
      if (is_min_max(q)) return swap_min_max(q);
      return std::nullopt;
    case ScalarOp::Mul:
    case ScalarOp::Div:
      if (op == ScalarOp::Div && c == 0.0) return std::nullopt;
      if (is_linear(q)) return Partial{q};
      if (is_min_max(q)) return c >= 0.0 ? Partial{q} : swap_min_max(q);
      return std::nullopt;
    case ScalarOp::RDiv:
    case ScalarOp::Pow:
      return std::nullopt;
  }
  return std::nullopt;
}

template <ScalarOp op>
std::vector<OpStrategy> scalar_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const double c = args.reals.at(0);
  return derived_strategies(in, [c](const Placement& p) -> std::optional<Placement> {
    const Partial* q = std::get_if<Partial>(&p);
    if (q == nullptr) return p;
    return scalar_partial(op, q->op, c);
  });
}

// d/dx of x + c, x - c, c - x, x * c, x / c and c / x.
template <ScalarOp op>
void scalar_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const double k = c.args().reals[0];
  const Var& g = c.grad();
  switch (op) {
    case ScalarOp::Add:
    case ScalarOp::Sub:
      c.set_grad(0, g);
      break;
    case ScalarOp::RSub:
      c.set_grad(0, -g);
      break;
    case ScalarOp::Mul:
      c.set_grad(0, g * k);
      break;
    case ScalarOp::Div:
      c.set_grad(0, apply(op::div_scalar, {g}, {{}, {k}}));
      break;
    case ScalarOp::RDiv:
      // d(k / x)/dx = -k / x^2 = -y / x.
      c.set_grad(0, -(g * c.output() / c.input(0)));
      break;
    case ScalarOp::Pow:
      // d(x^k)/dx = k x^(k-1); for k = 0 zero everywhere, also at x = 0 (0 * inf otherwise).
      c.set_grad(0,
                 k == 0.0 ? g * 0.0 : g * apply(op::pow_scalar, {c.input(0)}, {{}, {k - 1.0}}) * k);
      break;
  }
}

template <ScalarOp op>
constexpr OpDef scalar_op() {
  return OpDef{
      .name = scalar_name(op),
      .meta = &scalar_meta<op>,
      .compute = &scalar_compute<op>,
      .strategies = &scalar_strategies<op>,
      .backward = &scalar_backward<op>,
      // x * c and x / c scale a pending sum's parts; x + c would add c once per part.
      .partial_use =
          op == ScalarOp::Mul || op == ScalarOp::Div ? PartialUse::Unary : PartialUse::None,
      // Only c / x and x^c read values in backward.
      .saves = op == ScalarOp::RDiv || op == ScalarOp::Pow ? kSavesAll : kSavesNone,
  };
}

}  // namespace

const OpDef op::add_scalar = scalar_op<ScalarOp::Add>();
const OpDef op::sub_scalar = scalar_op<ScalarOp::Sub>();
const OpDef op::rsub_scalar = scalar_op<ScalarOp::RSub>();
const OpDef op::mul_scalar = scalar_op<ScalarOp::Mul>();
const OpDef op::div_scalar = scalar_op<ScalarOp::Div>();
const OpDef op::rdiv_scalar = scalar_op<ScalarOp::RDiv>();
const OpDef op::pow_scalar = scalar_op<ScalarOp::Pow>();

// ---- where and masked_fill ----------------------------------------------------------------------

namespace {

void check_condition(std::string_view op, const InputMeta& cond, std::string_view what) {
  if (cond.dtype != DType::Bool) {
    throw_error<Unsupported>("{}: the {} must be bool, got {} (shape {}); compare to make one", op,
                             what, cond.dtype, shape_str(*cond.shape));
  }
}

OpMeta where_meta(std::span<const InputMeta> in, const OpArgs&) {
  check_condition("where", in[0], "condition");
  Shape shape = broadcast_shapes(broadcast_shapes(*in[0].shape, *in[1].shape, "where"),
                                 *in[2].shape, "where");
  checked_numel(shape, "where");
  return OpMeta{std::move(shape), promote_types(in[1].dtype, in[2].dtype)};
}

Tensor where_compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  DeviceOps& kernels = kernels_for("where", {&in[0], &in[1], &in[2]});
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  kernels.where(result, pointwise::as_operand(in[0], DType::Bool, out.shape),
                pointwise::as_operand(in[1], out.dtype, out.shape),
                pointwise::as_operand(in[2], out.dtype, out.shape));
  return result;
}

// Shards line up as for any elementwise op; a Partial of both branches passes (the condition
// picks, per element, the same branch on every rank): where(c, sum a_i, sum b_i) = sum where(c,
// a_i, b_i), and alike for avg, max and min.
std::vector<OpStrategy> where_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  std::vector<DimOption> options = pointwise_shard_options(in, out);
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    options.push_back({{Replicate{}, Partial{o}, Partial{o}}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

// The gradient `g` with zeros where `mask` is true (invert: where it is false).
Var zero_where(const Var& g, const Var& mask, bool invert) {
  return apply(op::masked_fill, {g, mask}, {{invert ? 1 : 0}, {0.0}});
}

void where_backward(BackwardContext& c) {
  const Var& g = c.grad();
  if (c.needs_grad(1))
    c.set_grad(1, sum_to(zero_where(g, c.input(0), true), var_shape(c.input(1))));
  if (c.needs_grad(2)) {
    c.set_grad(2, sum_to(zero_where(g, c.input(0), false), var_shape(c.input(2))));
  }
}

OpMeta masked_fill_meta(std::span<const InputMeta> in, const OpArgs&) {
  check_condition("masked_fill", in[1], "mask");
  const Shape shape = broadcast_shapes(*in[0].shape, *in[1].shape, "masked_fill");
  if (shape != *in[0].shape) {
    throw_error<ShapeError>(
        "masked_fill: the mask of shape {} does not broadcast to the input's "
        "shape {}",
        shape_str(*in[1].shape), shape_str(*in[0].shape));
  }
  if (in[0].dtype == DType::Bool) {
    throw_error<Unsupported>("masked_fill: dtype bool is not supported (shape {})",
                             shape_str(shape));
  }
  return OpMeta{shape, in[0].dtype};
}

// args.ints = [invert] (internal: fill where the mask is false), args.reals = [value].
Tensor masked_fill_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  DeviceOps& kernels = kernels_for("masked_fill", {&in[0], &in[1]});
  const bool invert = !args.ints.empty() && args.ints[0] != 0;
  const Tensor value = full({}, args.reals.at(0), out.dtype, in[0].device()).expand(out.shape);
  const Tensor x = pointwise::as_operand(in[0], out.dtype, out.shape);
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  kernels.where(result, pointwise::as_operand(in[1], DType::Bool, out.shape), invert ? x : value,
                invert ? value : x);
  return result;
}

// P(avg), P(max) and P(min) pass (every rank fills the same value: its average, max and min are
// that value); P(sum) only when filling with 0.
std::vector<OpStrategy> masked_fill_strategies(ShardingInputs in, const OpArgs& args,
                                               const OpMeta& out) {
  std::vector<DimOption> options = pointwise_shard_options(in, out);
  for (ReduceOp o : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    options.push_back({{Partial{o}, Replicate{}}, Partial{o}});
  }
  if (args.reals.at(0) == 0.0) options.push_back({{Partial{}, Replicate{}}, Partial{}});
  return expand_dim_options(in, options);
}

void masked_fill_backward(BackwardContext& c) {
  const bool invert = !c.args().ints.empty() && c.args().ints[0] != 0;
  if (c.needs_grad(0)) c.set_grad(0, zero_where(c.grad(), c.input(1), invert));
}

}  // namespace

const OpDef op::where{
    .name = "where",
    .meta = where_meta,
    .compute = where_compute,
    .strategies = where_strategies,
    .backward = where_backward,
};
const OpDef op::masked_fill{
    .name = "masked_fill",
    .meta = masked_fill_meta,
    .compute = masked_fill_compute,
    .strategies = masked_fill_strategies,
    .backward = masked_fill_backward,
    .follow_first_input = true,
};

// ---- clamp --------------------------------------------------------------------------------------

namespace {

struct ClampBounds {
  std::optional<double> min;
  std::optional<double> max;
};

// The bounds clamp_args packed into args.
ClampBounds clamp_bounds(const OpArgs& args) {
  ClampBounds b;
  if (args.ints.at(0) != 0) b.min = args.reals.at(0);
  if (args.ints.at(1) != 0) b.max = args.reals.at(1);
  return b;
}

// As for a scalar operand (Note [Type promotion]): an integer tensor keeps its dtype unless a
// bound is not an integer.
OpMeta clamp_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const ClampBounds b = clamp_bounds(args);
  const Shape& shape = *in[0].shape;
  if (!b.min && !b.max) {
    throw_error<ConfigError>("clamp: at least one of min and max must be given (shape {})",
                             shape_str(shape));
  }
  DType dtype = in[0].dtype;
  if (dtype == DType::Bool) {
    throw_error<Unsupported>("clamp: dtype bool is not supported (shape {})", shape_str(shape));
  }
  for (const std::optional<double>& bound : {b.min, b.max}) {
    if (bound && !is_floating(dtype) && !is_integral_value(*bound)) dtype = DType::F32;
  }
  for (const std::optional<double>& bound : {b.min, b.max}) {
    if (bound) check_fill_value(*bound, dtype, "clamp");
  }
  return OpMeta{shape, dtype};
}

// min(max(x, min), max), as torch: NaN in x or in a bound gives NaN, and min > max gives max.
// Rounding is monotone, so BF16/F16 computed in F32 and rounded once equal torch's comparisons
// with the bounds rounded to the dtype.
Tensor clamp_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const ClampBounds b = clamp_bounds(args);
  const DType dtype = pointwise::scalar_compute_dtype(out.dtype);
  Tensor x = in[0].to(dtype);
  if (b.min) x = maximum(x, full({}, *b.min, dtype, x.device()));
  if (b.max) x = minimum(x, full({}, *b.max, dtype, x.device()));
  return x.to(out.dtype);
}

// torch's clamp_backward (the subgradient 1 at the bounds, pytorch/pytorch#7049): (grad, x) ->
// grad where x >= min and x <= max, 0 elsewhere (at NaN too, and everywhere when min > max).
// x >= min exactly where clamp(x, min) == x, compared in x's dtype as torch compares. Each piece
// of x is compared with itself clamped (the forward's output against x reduced again from a
// Partial could differ in the last bit).
Tensor clamp_backward_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  const ClampBounds b = clamp_bounds(args);
  const Tensor& x = in[1];
  Tensor g = in[0];
  for (const ClampBounds one :
       {ClampBounds{b.min, std::nullopt}, ClampBounds{std::nullopt, b.max}}) {
    if (!one.min && !one.max) continue;
    const Tensor inside = eq(clamp(x, one.min, one.max), x);
    g = call(op::masked_fill, {g, inside}, {{1}, {0.0}});
  }
  return g;
}

void clamp_grad(BackwardContext& c) {
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::clamp_backward, {c.grad(), c.input(0)}, c.args()));
  }
}

}  // namespace

// clamp is nondecreasing: P(max) and P(min) pass, no pending sum does.
const OpDef op::clamp{
    .name = "clamp",
    .meta = clamp_meta,
    .compute = clamp_compute,
    .strategies = pointwise::unary_strategies_of<PartialRule::NonDecreasing>,
    .backward = clamp_grad,
};
// Linear in the gradient, as every elementwise derivative.
const OpDef op::clamp_backward{
    .name = "clamp_backward",
    .meta = pointwise::derivative_meta,
    .compute = clamp_backward_compute,
    .strategies = pointwise::derivative_strategies,
};

}  // namespace spmd
