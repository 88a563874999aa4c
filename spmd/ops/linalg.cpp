// spmd/ops/linalg.cpp: the entries of matmul, matmul_weight_grad, bmm, addmm, scaled_mm and
// float8_mm, and FP8 training's float8_matmul.
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
    // Note [Folded weight gradient]: a linear's weight, one GEMM over every leading position.
    if (sb.size() == 2 && sa.size() >= 3) {
      c.set_grad(1, apply(op::matmul_weight_grad, {a, g}));
      return;
    }
    const Var gb = sum_to(apply(op::matmul, {transpose_last(a2), g}), var_shape(b2));
    c.set_grad(1, sb.size() == 1 ? apply(op::reshape, {gb}, {sb, {}}) : gb);
  }
}

// Note [Folded weight gradient]
// The gradient of matmul(x, w) for x [..., n, K] of 3 or more dims and w [K, M] is the sum over
// x's leading positions of x^T grad. Computed as matmul's batched rule has it, one product per
// batch item ([B, K, M]) and a sum over B after, it costs a [B, K, M] buffer, a reduction that
// reads it, and B small GEMMs; matmul_weight_grad instead folds the leading dims into the inner
// size and runs one [K, L] x [L, M] GEMM (L = x.numel() / K), as torch.matmul does (it folds x's
// leading dims into rows, so its weight gradient is one mm). x and grad are read in place where
// their leading dims fold (contiguous ones do) and copied once where not. The values are one
// GEMM's, so they differ from the per-item products' in the last bits. Sharding is einsum
// "...k,...m->km": a leading dim sharded alike on both operands gives Partial (as the batched rule
// and its sum did), K sharded gives Shard(0), M sharded Shard(1).
// (x and grad have passed weight_grad_meta: the same leading dims, at least one.)
Labels weight_grad_labels(size_t dims) {
  constexpr int kK = 2, kN = 3, kLead = 100;
  Labels l;
  for (size_t i = 0; i + 1 < dims; ++i) l.a.push_back(kLead + static_cast<int>(i));
  l.b = l.a;
  l.a.push_back(kK);
  l.b.push_back(kN);
  l.out = {kK, kN};
  return l;
}

OpMeta weight_grad_meta(std::span<const InputMeta> in, const OpArgs&) {
  const Shape& x = *in[0].shape;
  const Shape& g = *in[1].shape;
  if (x.size() < 2 || x.size() != g.size() || !std::equal(x.begin(), x.end() - 1, g.begin())) {
    throw_error<ShapeError>(
        "matmul_weight_grad: expects x [..., K] and grad [..., M] with the same leading dims "
        "(at least one), got shapes {} and {}",
        shape_str(x), shape_str(g));
  }
  return OpMeta{{x.back(), g.back()}, matmul_dtype("matmul_weight_grad", in)};
}

Tensor weight_grad_compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& meta) {
  DeviceOps& kernels = kernels_for("matmul_weight_grad", {&in[0], &in[1]});
  const int64_t k = in[0].size(-1);
  const int64_t m = in[1].size(-1);
  const int64_t rows =
      shape_numel(Shape(in[0].shape().begin(), in[0].shape().end() - 1));  // leading positions
  // A view where the leading dims fold, else one copy (Tensor::reshape).
  const Tensor x = in[0].to(meta.dtype).reshape({rows, k});
  const Tensor g = in[1].to(meta.dtype).reshape({rows, m});
  Tensor out = empty({k, m}, meta.dtype, in[0].device());
  if (rows == 0) {
    kernels.fill(out, 0.0);
    return out;
  }
  kernels.matmul(out.unsqueeze(0), x.transpose(0, 1).unsqueeze(0), g.unsqueeze(0), 1.0, 0.0);
  return out;
}

// x's gradient: grad [..., M] @ dW^T [M, K]; grad's: x [..., K] @ dW [K, M].
void weight_grad_backward(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, apply(op::matmul, {c.input(1), transpose_last(c.grad())}));
  if (c.needs_grad(1)) c.set_grad(1, apply(op::matmul, {c.input(0), c.grad()}));
}

// 2 L K M.
double weight_grad_flops(std::span<const InputMeta> in, const OpMeta& out) {
  return 2.0 * static_cast<double>(shape_numel(*in[0].shape)) *
         static_cast<double>(out.shape.back());
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

const OpDef op::matmul_weight_grad{
    .name = "matmul_weight_grad",
    .meta = weight_grad_meta,
    .compute = weight_grad_compute,
    .strategies =
        [](ShardingInputs in, const OpArgs&, const OpMeta&) {
          return expand_dim_options(
              in, matmul_options(weight_grad_labels(in[0]->shape().size()), nullptr));
        },
    .backward = weight_grad_backward,
    .partial_use = PartialUse::One,
    .flops = weight_grad_flops,
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

namespace {

// The FP8 GEMMs' sharding: matmul's options without a pending-sum operand (float8 values are
// not reduced), inputs 2 and 3 (the scales or amaxes) replicated, or on a mesh dim in the
// `rank_local` bit mask a pending max where their operand is sharded (Note [Float8 training]).
std::vector<OpStrategy> float8_gemm_strategies(ShardingInputs in, int64_t rank_local) {
  const auto labels = matmul_labels(in[0]->shape(), in[1]->shape());
  std::vector<DimOption> options;
  for (const DimOption& o : matmul_options(*labels, nullptr)) {
    if (is_partial(o.inputs[0]) || is_partial(o.inputs[1])) continue;
    const bool a_split = std::holds_alternative<Shard>(o.inputs[0]);
    const bool b_split = std::holds_alternative<Shard>(o.inputs[1]);
    for (bool a_local : {false, true}) {
      for (bool b_local : {false, true}) {
        if ((a_local && (!a_split || rank_local == 0)) ||
            (b_local && (!b_split || rank_local == 0))) {
          continue;
        }
        DimOption with = o;
        with.inputs.push_back(a_local ? Placement{Partial{ReduceOp::Max}} : Placement{Replicate{}});
        with.inputs.push_back(b_local ? Placement{Partial{ReduceOp::Max}} : Placement{Replicate{}});
        options.push_back(std::move(with));
      }
    }
  }
  std::vector<OpStrategy> strategies = expand_dim_options(in, options);
  if (rank_local != 0) {
    std::erase_if(strategies, [&](const OpStrategy& s) {
      for (size_t i = 0; i < s.output.size(); ++i) {
        const bool local = (rank_local >> i) & 1;
        if (!local && (is_partial(s.inputs[2][i]) || is_partial(s.inputs[3][i]))) return true;
      }
      return false;
    });
  }
  return strategies;
}

// Unsupported unless inputs 2 and 3 (`what`_a and `what`_b: the scales or amaxes) are 0-d f32
// tensors (tensorwise scaling).
void check_scales(std::string_view op, std::string_view what, std::span<const InputMeta> in) {
  for (size_t i : {size_t{2}, size_t{3}}) {
    if (!in[i].shape->empty() || in[i].dtype != DType::F32) {
      throw_error<Unsupported>("{}: {}_{} must be a 0-d f32 tensor (tensorwise scaling), got {} {}",
                               op, what, i == 2 ? "a" : "b", shape_str(*in[i].shape), in[i].dtype);
    }
  }
}

// (a @ b) * (scale_a * scale_b) of float8 a [M, K] and b [K, N], rounded once to `out`: the
// products and sums in f32 (f64 for an f64 result), the scale product in f32 (in f64, exactly, for
// an f64 result).
Tensor float8_gemm(std::string_view op, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                   const Tensor& scale_b, DType out) {
  DeviceOps& kernels = kernels_for(op, {&a, &b, &scale_a, &scale_b});
  const DType acc = out == DType::F64 ? DType::F64 : DType::F32;
  const float sa = scale_a.item<float>();
  const float sb = scale_b.item<float>();
  const double alpha = acc == DType::F64 ? static_cast<double>(sa) * static_cast<double>(sb)
                                         : static_cast<double>(sa * sb);
  Tensor result = empty({a.size(0), b.size(1)}, acc, a.device());
  kernels.matmul(result.unsqueeze(0), a.to(acc).unsqueeze(0), b.to(acc).unsqueeze(0), alpha, 0.0);
  return result.to(out);
}

}  // namespace

// Note [Scaled matmul]
// scaled_mm(a, b, scale_a, scale_b) with args.ints = [out dtype] is torch._scaled_mm with
// tensorwise scales: a [M, K] and b [K, N] float8 (not both f8e5m2, which cuBLAS refuses too),
// scale_a and scale_b 0-d f32 tensors, the factors that take a and b back to their real values
// (the inverses of the scales their casts multiplied by). The result [M, N] is
// (a @ b) * (scale_a * scale_b): the float8 values widen to f32 exactly, products and sums
// accumulate in f32, the scale product (in f32) multiplies each sum (as cuBLASLt's alpha does),
// and the f32 result rounds once to the out dtype (bf16, f16 or f32). Sharding is matmul's (S(0) @
// R, R @ S(1), S(1) @ S(0) -> P(sum)) with the scales replicated; a pending-sum operand is not
// passed (float8 tensors are not reduced). It has no derivative, like torch._scaled_mm: FP8
// training recipes write their own (float8_mm, Note [Float8 training]). Its flops count at the
// device's float8 rate in a dry run.
const OpDef op::scaled_mm{
    .name = "scaled_mm",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs& args) {
          if (in.size() != 4) {
            throw_error<Unsupported>("scaled_mm: expects a, b, scale_a, scale_b, got {} tensors",
                                     in.size());
          }
          const Shape& a = *in[0].shape;
          const Shape& b = *in[1].shape;
          if (a.size() != 2 || b.size() != 2) {
            throw_error<ShapeError>("scaled_mm: a and b must be 2-d, got shapes {} and {}",
                                    shape_str(a), shape_str(b));
          }
          if (a[1] != b[0]) inner_mismatch("scaled_mm", a, b, a[1], b[0]);
          if (!is_float8(in[0].dtype) || !is_float8(in[1].dtype)) {
            throw_error<Unsupported>(
                "scaled_mm: a and b must be float8 (f8e4m3fn or f8e5m2), got {} {} and {} {}",
                shape_str(a), in[0].dtype, shape_str(b), in[1].dtype);
          }
          if (in[0].dtype == DType::F8E5M2 && in[1].dtype == DType::F8E5M2) {
            throw_error<Unsupported>(
                "scaled_mm: a and b cannot both be f8e5m2 (cuBLAS has no such FP8 GEMM; "
                "PyTorch refuses it too), got {} and {}",
                shape_str(a), shape_str(b));
          }
          check_scales("scaled_mm", "scale", in);
          const int64_t code = args.ints.at(0);
          const DType out = static_cast<DType>(code);
          if (code < 0 || code >= static_cast<int64_t>(std::size(kAllDTypes)) ||
              (out != DType::BF16 && out != DType::F16 && out != DType::F32)) {
            throw_error<Unsupported>(
                "scaled_mm: the out dtype must be bf16, f16 or f32, got DType({}) (a {} {}, b {} "
                "{})",
                code, shape_str(a), in[0].dtype, shape_str(b), in[1].dtype);
          }
          return OpMeta{{a[0], b[1]}, out};
        },
    .compute =
        [](std::span<const Tensor> in, const OpArgs&, const OpMeta& meta) {
          return float8_gemm("scaled_mm", in[0], in[1], in[2], in[3], meta.dtype);
        },
    .strategies = [](ShardingInputs in, const OpArgs&,
                     const OpMeta&) { return float8_gemm_strategies(in, 0); },
    .flops = matmul_flops<0>,
    .saves = kSavesNone,
    .float8 = true,
};

namespace {

DType float8_format(const OpArgs& args, size_t i) {
  return static_cast<DType>(args.ints.at(i));
}

double float8_max(DType format) {
  return format == DType::F8E5M2 ? 57344.0 : 448.0;
}

// The tensorwise scale that takes values of largest magnitude `amax` (a 0-d f32 tensor) into
// `format`'s range: the format's largest value over amax (at least 1e-12), in f32.
Tensor scale_of(const Tensor& amax, DType format) {
  return float8_max(format) / clamp(amax, 1e-12, std::nullopt);
}

int64_t local_mask(const OpArgs& args) {
  return args.ints.at(2);
}

// Note [Float8 training]
// float8_mm(a, b, amax_a, amax_b), args.ints = [format of a, format of b, rank-local mesh dims as
// a bit mask], is one linear of torchao's Float8Linear with tensorwise dynamic scaling: a [..., K]
// and b [K, N] in a wider float (bf16, f16, f32, f64), amax_a and amax_b 0-d f32, their largest
// magnitudes (float8_amax). Forward: each operand times its scale (the format's largest value over
// its amax, at least 1e-12), limited to the format's range and cast (a saturated cast), then the
// FP8 GEMM with the inverse scales (float8_gemm), in the promoted dtype of a and b. Backward, as
// Float8Linear's: the output gradient g gets its own amax and is cast to f8e5m2 (more range), and
// both gradients are FP8 GEMMs of the casts: grad a = float8_mm(g, b^T), grad b = float8_mm(a^T,
// g) over a's rows. Autograd saves a and b (in their own dtype) and the amaxes, and casts again in
// backward, as torchao does; the amaxes are constants (no gradient).
// Whose amax. amax over a sharded DTensor is a pending max (P(max)); float8_mm reduces it (an
// all_reduce max) unless the mesh dim is rank-local (bit i of the mask for mesh dim i) and the
// operand is sharded there: then each rank scales its own piece by its piece's amax, the pending
// max's local value. The default (no rank-local dim) gives every rank the global amax, so a
// DTensor program casts exactly as one device does. torchao under FSDP (and context parallelism)
// scales plain per-rank activations and gradients, so its data-parallel dims are rank-local:
// float8_matmul(x, w, {.rank_local_dims = {"dp"}}) does what it does, and its result then depends
// on the batch split as torchao's does. Tensor parallelism's DTensor activations and the weights
// get global amaxes in torchao too. A LocalTensor's amax is its rank's.
void float8_mm_backward(BackwardContext& c) {
  const Var& a = c.input(0);
  const Var& b = c.input(1);
  const DType fa = float8_format(c.args(), 0);
  const DType fb = float8_format(c.args(), 1);
  const int64_t mask = local_mask(c.args());
  const Var& g = c.grad();
  const Var amax_g = float8_amax(g);
  const auto code = [](DType d) { return static_cast<int64_t>(d); };
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::float8_mm, {g, transpose_last(b), amax_g, c.input(3)},
                        {{code(DType::F8E5M2), code(fb), mask}, {}}));
  }
  if (c.needs_grad(1)) {
    const Shape& sa = var_shape(a);
    const int64_t k = sa.back();
    const int64_t n = var_shape(g).back();
    const int64_t rows = shape_numel(Shape(sa.begin(), sa.end() - 1));
    const Var a2 = apply(op::reshape, {a}, {{rows, k}, {}});
    const Var g2 = apply(op::reshape, {g}, {{rows, n}, {}});
    c.set_grad(1, apply(op::float8_mm, {transpose_last(a2), g2, c.input(2), amax_g},
                        {{code(fa), code(DType::F8E5M2), mask}, {}}));
  }
}

}  // namespace

const OpDef op::float8_mm{
    .name = "float8_mm",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs& args) {
          if (in.size() != 4) {
            throw_error<Unsupported>("float8_mm: expects a, b, amax_a, amax_b, got {} tensors",
                                     in.size());
          }
          const Shape& a = *in[0].shape;
          const Shape& b = *in[1].shape;
          if (a.size() < 2 || b.size() != 2) {
            throw_error<ShapeError>(
                "float8_mm: a must have at least 2 dims and b exactly 2, got shapes {} and {}",
                shape_str(a), shape_str(b));
          }
          if (a.back() != b[0]) inner_mismatch("float8_mm", a, b, a.back(), b[0]);
          const int64_t fa = args.ints.at(0);
          const int64_t fb = args.ints.at(1);
          for (int i : {0, 1}) {
            if (!is_floating(in[i].dtype) || (is_float8(in[i].dtype) && i == 0)) {
              throw_error<Unsupported>(
                  "float8_mm: {} must be f32, f64, bf16 or f16 (it is cast to float8 here{}), got "
                  "{} {}",
                  i == 0 ? "a" : "b", i == 0 ? "" : ", or b already cast in its format",
                  shape_str(*in[i].shape), in[i].dtype);
            }
          }
          if (is_float8(in[1].dtype) && static_cast<int64_t>(in[1].dtype) != fb) {
            throw_error<Unsupported>(
                "float8_mm: b is already float8 ({} {}), but its format is given as DType({})",
                shape_str(b), in[1].dtype, fb);
          }
          check_scales("float8_mm", "amax", in);
          auto format_ok = [](int64_t f) {
            return f == static_cast<int64_t>(DType::F8E4M3FN) ||
                   f == static_cast<int64_t>(DType::F8E5M2);
          };
          if (!format_ok(fa) || !format_ok(fb) ||
              (fa == static_cast<int64_t>(DType::F8E5M2) && fa == fb)) {
            throw_error<Unsupported>(
                "float8_mm: the formats must be f8e4m3fn or f8e5m2, not both f8e5m2; got "
                "DType({}) and DType({}) (a {}, b {})",
                fa, fb, shape_str(a), shape_str(b));
          }
          if (local_mask(args) < 0) {
            throw_error<Unsupported>("float8_mm: the rank-local mesh dims mask {} is negative",
                                     local_mask(args));
          }
          Shape out(a.begin(), a.end() - 1);
          out.push_back(b[1]);
          if (is_float8(in[1].dtype)) return OpMeta{out, in[0].dtype};
          return OpMeta{out, promote_types(in[0].dtype, in[1].dtype, "float8_mm")};
        },
    .compute =
        [](std::span<const Tensor> in, const OpArgs& args, const OpMeta& meta) {
          const DType fa = float8_format(args, 0);
          const DType fb = float8_format(args, 1);
          const Tensor sa = scale_of(in[2], fa);
          const Tensor sb = scale_of(in[3], fb);
          const Tensor a8 = float8_cast(Var(in[0]), Var(in[2]), fa).value<Tensor>();
          const Tensor b8 = is_float8(in[1].dtype())
                                ? in[1]
                                : float8_cast(Var(in[1]), Var(in[3]), fb).value<Tensor>();
          const int64_t k = in[1].size(0);
          const int64_t rows = shape_numel(Shape(in[0].shape().begin(), in[0].shape().end() - 1));
          return float8_gemm("float8_mm", a8.reshape({rows, k}), b8, spmd::reciprocal(sa),
                             spmd::reciprocal(sb), meta.dtype)
              .reshape(meta.shape);
        },
    .strategies = [](ShardingInputs in, const OpArgs& args,
                     const OpMeta&) { return float8_gemm_strategies(in, local_mask(args)); },
    .backward = float8_mm_backward,
    .flops = matmul_flops<0>,
    .saves = kSavesInputs,
    .float8 = true,  // b, already cast (Note [Float8 all-gather] in nn/parallel.h)
    .split_dependent = [](const OpArgs& args) { return local_mask(args) != 0; },
};

Var float8_amax(const Var& t) {
  const Var amax = apply(op::amax, {apply(op::abs, {t.detach()})}, {{0}, {}});
  return apply(op::to_dtype, {amax}, {{static_cast<int64_t>(DType::F32)}, {}});
}

Var float8_matmul(const Var& x, const Var& w, int64_t rank_local_mask) {
  for (const Var* v : {&x, &w}) {
    const DType dtype = v->kind().dtype(*v);
    if (!is_floating(dtype) || is_float8(dtype)) {
      throw_error<Unsupported>(
          "float8_matmul: x and w must be f32, f64, bf16 or f16 (they are cast to float8 here), "
          "got x {} and w {}",
          x.kind().describe(x), w.kind().describe(w));
    }
  }
  const int64_t e4m3 = static_cast<int64_t>(DType::F8E4M3FN);
  return apply(op::float8_mm, {x, w, float8_amax(x), float8_amax(w)},
               {{e4m3, e4m3, rank_local_mask}, {}});
}

Var float8_cast(const Var& t, const Var& amax, DType format) {
  const DType dtype = t.kind().dtype(t);
  if (!is_floating(dtype) || is_float8(dtype) || !is_float8(format)) {
    throw_error<Unsupported>(
        "float8_cast: casts an f32, f64, bf16 or f16 tensor to f8e4m3fn or f8e5m2, got {} to {}",
        t.kind().describe(t), dtype_name(format));
  }
  if (!var_shape(amax).empty() || amax.kind().dtype(amax) != DType::F32) {
    throw_error<Unsupported>("float8_cast: the amax must be a 0-d f32 tensor, got {}",
                             amax.kind().describe(amax));
  }
  // t widened to f32, times its scale, limited to the format's finite range and cast: torchao's
  // saturated cast (float8_mm's casts are this function).
  const NoGradGuard no_grad;
  const double limit = float8_max(format);
  const Var scale = apply(
      op::rdiv_scalar, {apply(op::clamp, {amax}, clamp_args(1e-12, std::nullopt))}, {{}, {limit}});
  const Var wide = apply(op::to_dtype, {t}, {{static_cast<int64_t>(DType::F32)}, {}});
  const Var clamped = apply(op::clamp, {apply(op::mul, {wide, scale})}, clamp_args(-limit, limit));
  return apply(op::to_dtype, {clamped}, {{static_cast<int64_t>(format)}, {}});
}

Var float8_matmul(const Var& x, const Var& w8, const Var& amax_w, int64_t rank_local_mask) {
  const DType xd = x.kind().dtype(x);
  const DType wd = w8.kind().dtype(w8);
  if (!is_floating(xd) || is_float8(xd) || !is_float8(wd)) {
    throw_error<Unsupported>(
        "float8_matmul: takes x in f32, f64, bf16 or f16 and w already cast to float8 (the "
        "weight's float8 form), got x {} and w {}",
        x.kind().describe(x), w8.kind().describe(w8));
  }
  return apply(
      op::float8_mm, {x, w8, float8_amax(x), amax_w},
      {{static_cast<int64_t>(DType::F8E4M3FN), static_cast<int64_t>(wd), rank_local_mask}, {}});
}

}  // namespace spmd
