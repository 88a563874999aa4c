// spmd/ops/linalg.cpp: the entries of matmul, bmm and addmm.
//
// Sharding follows einsum: S(0)@R -> S(0), R@S(1) -> S(1), S(1)@S(0) -> P(sum), batch dims
// sharded alike; a linear Partial on one operand passes (addmm's c then must be the same
// Partial, a free local partition from R). Broadcast batch dims run replicated.
#include <algorithm>
#include <cmath>
#include <optional>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {
namespace {

DType matmul_dtype(std::string_view op, std::span<const InputMeta> in) {
  DType dtype = in[0].dtype;
  for (const InputMeta& m : in) dtype = promote_types(dtype, m.dtype);
  if (dtype == DType::Bool) throw_error<Unsupported>("{}: dtype bool is not supported", op);
  return dtype;
}

[[noreturn]] void inner_mismatch(std::string_view op, const Shape& a, const Shape& b, int64_t ka,
                                 int64_t kb) {
  throw_error<ShapeError>(
      "{}: shapes {} and {} cannot be multiplied (inner sizes {} and {} differ)", op, shape_str(a),
      shape_str(b), ka, kb);
}

// torch.matmul's output shape; a 1-d operand is a row (a) or column (b) matrix, removed after.
Shape matmul_shape(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) {
    throw_error<ShapeError>("matmul: both operands need at least 1 dim, got shapes {} and {}",
                            shape_str(a), shape_str(b));
  }
  const int64_t ka = a.back();
  const int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) inner_mismatch("matmul", a, b, ka, kb);
  const Shape batch_a(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  const Shape batch_b(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape out = broadcast_shapes(batch_a, batch_b, "matmul");
  if (a.size() > 1) out.push_back(a[a.size() - 2]);
  if (b.size() > 1) out.push_back(b.back());
  checked_numel(out, "matmul");
  return out;
}

Tensor matmul_compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& meta) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  DeviceOps& kernels = kernels_for("matmul", {&a, &b});
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t n = a2.size(-2);
  const int64_t k = a2.size(-1);
  const int64_t m = b2.size(-1);
  const Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                       Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
  const int64_t batch_numel = shape_numel(batch);
  auto batched = [&](const Tensor& t, int64_t rows, int64_t cols) {
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    return t.to(meta.dtype).expand(full).reshape({batch_numel, rows, cols});
  };
  Tensor out = empty({batch_numel, n, m}, meta.dtype, a.device());
  kernels.matmul(out, batched(a2, n, k), batched(b2, k, m), 1.0, 0.0);
  return out.view(meta.shape);
}

// Einsum labels of a matmul: per dim of a, b and the output.
struct Labels {
  std::vector<int> a, b, out;
};

// torch.matmul's labels for the cases sharding propagation handles (2-D or batched a with 2-D
// b, equal batch dims, 1-D operands); nullopt for the rest (broadcast batch dims), which run
// replicated.
std::optional<Labels> matmul_labels(const Shape& a, const Shape& b) {
  constexpr int kM = 1, kK = 2, kN = 3, kBatch = 100;
  const size_t na = a.size(), nb = b.size();
  Labels l;
  if (na == 1 && nb == 1) return Labels{{kK}, {kK}, {}};
  if (na == 1 && nb == 2) return Labels{{kK}, {kK, kN}, {kN}};
  if (na == 2 && nb == 1) return Labels{{kM, kK}, {kK}, {kM}};
  if (na >= 2 && nb == 2) {
    for (size_t i = 0; i + 2 < na; ++i) l.a.push_back(kBatch + static_cast<int>(i));
    l.out = l.a;
    l.a.insert(l.a.end(), {kM, kK});
    l.b = {kK, kN};
    l.out.insert(l.out.end(), {kM, kN});
    return l;
  }
  if (na == nb && na >= 3 && std::equal(a.begin(), a.end() - 2, b.begin())) {
    for (size_t i = 0; i + 2 < na; ++i) l.a.push_back(kBatch + static_cast<int>(i));
    l.b = l.a;
    l.out = l.a;
    l.a.insert(l.a.end(), {kM, kK});
    l.b.insert(l.b.end(), {kK, kN});
    l.out.insert(l.out.end(), {kM, kN});
    return l;
  }
  return std::nullopt;
}

int position(const std::vector<int>& labels, int label) {
  auto it = std::find(labels.begin(), labels.end(), label);
  return it == labels.end() ? -1 : static_cast<int>(it - labels.begin());
}

// Per-mesh-dim options of a @ b, plus the placement an addend c needs for each (when `c_dims`
// is given: c's dims aligned with the output, -1 where c broadcasts).
std::vector<DimOption> matmul_options(const Labels& l, const std::vector<int>* c_dims) {
  auto shard_or_r = [](int pos) {
    return pos >= 0 ? Placement{Shard{pos}} : Placement{Replicate{}};
  };
  std::vector<DimOption> options;
  auto push = [&](Placement a, Placement b, Placement out, Placement c) {
    DimOption o;
    if (c_dims) o.inputs.push_back(c);
    o.inputs.push_back(std::move(a));
    o.inputs.push_back(std::move(b));
    o.output = std::move(out);
    options.push_back(std::move(o));
  };
  push(Replicate{}, Replicate{}, Replicate{}, Replicate{});
  for (size_t o = 0; o < l.out.size(); ++o) {
    const int label = l.out[o];
    int c_pos = -1;
    if (c_dims) c_pos = (*c_dims)[o];
    push(shard_or_r(position(l.a, label)), shard_or_r(position(l.b, label)),
         Shard{static_cast<int>(o)}, shard_or_r(c_pos));
  }
  for (size_t d = 0; d < l.a.size(); ++d) {
    const int label = l.a[d];
    if (position(l.out, label) >= 0) continue;
    const int pb = position(l.b, label);
    if (pb < 0) continue;
    push(Shard{static_cast<int>(d)}, Shard{pb}, Partial{}, Partial{});
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    push(Partial{op}, Replicate{}, Partial{op}, Partial{op});
    push(Replicate{}, Partial{op}, Partial{op}, Partial{op});
  }
  return options;
}

// ---- backward -----------------------------------------------------------------------------------

Var transpose_last(const Var& v) {
  return apply(op::transpose, {v}, {{-1, -2}, {}});
}

// torch.matmul's gradients: a 1-d a is a row and a 1-d b a column (put back after), batch dims
// broadcast (summed back down to each operand's shape).
void matmul_backward(BackwardContext& c) {
  const Var& a = c.input(0);
  const Var& b = c.input(1);
  const Shape& sa = var_shape(a);
  const Shape& sb = var_shape(b);
  if (sa.size() == 1 && sb.size() == 1) {
    if (c.needs_grad(0)) c.set_grad(0, apply(op::mul, {c.grad(), b}));
    if (c.needs_grad(1)) c.set_grad(1, apply(op::mul, {c.grad(), a}));
    return;
  }
  const Var a2 = sa.size() == 1 ? apply(op::unsqueeze, {a}, {{0}, {}}) : a;
  const Var b2 = sb.size() == 1 ? apply(op::unsqueeze, {b}, {{1}, {}}) : b;
  Var g = c.grad();
  if (sa.size() == 1) g = apply(op::unsqueeze, {g}, {{-2}, {}});
  if (sb.size() == 1) g = apply(op::unsqueeze, {g}, {{-1}, {}});
  if (c.needs_grad(0)) {
    const Var ga = sum_to(apply(op::matmul, {g, transpose_last(b2)}), var_shape(a2));
    c.set_grad(0, sa.size() == 1 ? apply(op::reshape, {ga}, {sa, {}}) : ga);
  }
  if (c.needs_grad(1)) {
    const Var gb = sum_to(apply(op::matmul, {transpose_last(a2), g}), var_shape(b2));
    c.set_grad(1, sb.size() == 1 ? apply(op::reshape, {gb}, {sb, {}}) : gb);
  }
}

void bmm_backward(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, apply(op::bmm, {c.grad(), transpose_last(c.input(1))}));
  if (c.needs_grad(1)) c.set_grad(1, apply(op::bmm, {transpose_last(c.input(0)), c.grad()}));
}

// beta * c + alpha * (a @ b).
void addmm_backward(BackwardContext& c) {
  const double beta = c.args().reals[0];
  const double alpha = c.args().reals[1];
  const Var& g = c.grad();
  if (c.needs_grad(0)) c.set_grad(0, sum_to(g * beta, var_shape(c.input(0))));
  if (c.needs_grad(1)) c.set_grad(1, apply(op::matmul, {g, transpose_last(c.input(2))}) * alpha);
  if (c.needs_grad(2)) c.set_grad(2, apply(op::matmul, {transpose_last(c.input(1)), g}) * alpha);
}

// One multiply and one add per term: 2 * (output elements) * (the inner size, the last dim of
// input `a`).
template <size_t a>
double matmul_flops(std::span<const InputMeta> in, const OpMeta& out) {
  const Shape& shape = *in[a].shape;
  const double k = shape.empty() ? 1.0 : static_cast<double>(shape.back());
  return 2.0 * static_cast<double>(shape_numel(out.shape)) * k;
}

}  // namespace

const OpDef op::matmul{
    .name = "matmul",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs&) {
          return OpMeta{matmul_shape(*in[0].shape, *in[1].shape), matmul_dtype("matmul", in)};
        },
    .compute = matmul_compute,
    .strategies =
        [](ShardingInputs in, const OpArgs&, const OpMeta&) {
          auto labels = matmul_labels(in[0]->shape(), in[1]->shape());
          if (!labels) return std::vector<OpStrategy>{replicate_strategy(in)};
          return expand_dim_options(in, matmul_options(*labels, nullptr));
        },
    .backward = matmul_backward,
    .partial_use = PartialUse::One,
    .flops = matmul_flops<0>,
    .saves = kSavesInputs,
};

const OpDef op::bmm{
    .name = "bmm",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs&) {
          const Shape& a = *in[0].shape;
          const Shape& b = *in[1].shape;
          if (a.size() != 3 || b.size() != 3 || a[0] != b[0]) {
            throw_error<ShapeError>(
                "bmm: expects a [B, n, k] and b [B, k, m] with one batch size, got shapes {} "
                "and {}",
                shape_str(a), shape_str(b));
          }
          if (a[2] != b[1]) inner_mismatch("bmm", a, b, a[2], b[1]);
          return OpMeta{{a[0], a[1], b[2]}, matmul_dtype("bmm", in)};
        },
    .compute =
        [](std::span<const Tensor> in, const OpArgs&, const OpMeta& meta) {
          DeviceOps& kernels = kernels_for("bmm", {&in[0], &in[1]});
          Tensor out = empty(meta.shape, meta.dtype, in[0].device());
          kernels.matmul(out, in[0].to(meta.dtype), in[1].to(meta.dtype), 1.0, 0.0);
          return out;
        },
    .strategies =
        [](ShardingInputs in, const OpArgs&, const OpMeta&) {
          return expand_dim_options(
              in, matmul_options(*matmul_labels(in[0]->shape(), in[1]->shape()), nullptr));
        },
    .backward = bmm_backward,
    .partial_use = PartialUse::One,
    .flops = matmul_flops<0>,
    .saves = kSavesInputs,
};

const OpDef op::addmm{
    .name = "addmm",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs& args) {
          const Shape& c = *in[0].shape;
          const Shape& a = *in[1].shape;
          const Shape& b = *in[2].shape;
          if (a.size() != 2 || b.size() != 2) {
            throw_error<ShapeError>("addmm: a and b must be 2-d, got shapes {} and {}",
                                    shape_str(a), shape_str(b));
          }
          if (a[1] != b[0]) inner_mismatch("addmm", a, b, a[1], b[0]);
          const Shape shape{a[0], b[1]};
          if (broadcast_shapes(c, shape, "addmm") != shape) {
            throw_error<ShapeError>(
                "addmm: c of shape {} does not broadcast to the product's shape {}", shape_str(c),
                shape_str(shape));
          }
          const DType dtype = matmul_dtype("addmm", in);
          const double beta = args.reals.at(0);
          const double alpha = args.reals.at(1);
          auto integral = [](double v) { return std::isfinite(v) && v == std::trunc(v); };
          if (!is_floating(dtype) && (!integral(alpha) || !integral(beta))) {
            throw_error<Unsupported>("addmm: alpha {} and beta {} must be integers for dtype {}",
                                     alpha, beta, dtype);
          }
          return OpMeta{shape, dtype};
        },
    .compute =
        [](std::span<const Tensor> in, const OpArgs& args, const OpMeta& meta) {
          DeviceOps& kernels = kernels_for("addmm", {&in[0], &in[1], &in[2]});
          const double beta = args.reals[0];
          Tensor out = empty(meta.shape, meta.dtype, in[1].device());
          if (beta != 0) out.copy_(in[0]);
          kernels.matmul(out.unsqueeze(0), in[1].to(meta.dtype).unsqueeze(0),
                         in[2].to(meta.dtype).unsqueeze(0), args.reals[1], beta);
          return out;
        },
    .strategies =
        [](ShardingInputs in, const OpArgs&, const OpMeta& meta) {
          std::vector<int> c_dims;
          for (int o = 0; o < 2; ++o) c_dims.push_back(aligned_dim(in[0]->shape(), meta.shape, o));
          const auto labels = matmul_labels(in[1]->shape(), in[2]->shape());
          return expand_dim_options(in, matmul_options(*labels, &c_dims));
        },
    .backward = addmm_backward,
    .flops = matmul_flops<1>,
    .saves = saves_inputs({1, 2}),
};

}  // namespace spmd
