// spmd/ops/pointwise.cpp: the shared meta and compute of the elementwise entries, and the
// entries of the ops with a scalar operand (x + c, c - x, x * c, x / c, c / x).
#include <spmd/ops/pointwise.h>

#include <cmath>

#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace pointwise {
namespace {

// t converted to `dtype` and broadcast to `shape`; t itself (no new handle) when it already is.
Tensor as_operand(const Tensor& t, DType dtype, const Shape& shape) {
  if (t.dtype() == dtype && t.shape() == shape) return t;
  return t.to(dtype).expand(shape);
}

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

enum class ScalarOp { Add, Sub, RSub, Mul, Div, RDiv };

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
  }
  return "?";
}

// Note [Type promotion]: a scalar does not change the tensor's dtype, except that an integer or
// Bool tensor computes in F32 under true division or with a non-integral scalar.
template <ScalarOp op>
OpMeta scalar_meta(std::span<const InputMeta> in, const OpArgs& args) {
  DType dtype = in[0].dtype;
  const bool division = op == ScalarOp::Div || op == ScalarOp::RDiv;
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
  // BF16/F16 keep the scalar's F32 precision: compute in F32 and round the result once.
  const DType dtype = out.dtype == DType::BF16 || out.dtype == DType::F16 ? DType::F32 : out.dtype;
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
  }
}

template <ScalarOp op>
constexpr OpDef scalar_op() {
  return OpDef{scalar_name(op), &scalar_meta<op>, &scalar_compute<op>, &scalar_strategies<op>,
               nullptr,         nullptr,          &scalar_backward<op>};
}

}  // namespace

const OpDef op::add_scalar = scalar_op<ScalarOp::Add>();
const OpDef op::sub_scalar = scalar_op<ScalarOp::Sub>();
const OpDef op::rsub_scalar = scalar_op<ScalarOp::RSub>();
const OpDef op::mul_scalar = scalar_op<ScalarOp::Mul>();
const OpDef op::div_scalar = scalar_op<ScalarOp::Div>();
const OpDef op::rdiv_scalar = scalar_op<ScalarOp::RDiv>();

}  // namespace spmd
