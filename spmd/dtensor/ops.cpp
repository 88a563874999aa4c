// spmd/dtensor/ops.cpp: the OpDefs of the DTensor ops (meta, strategies, local computation,
// reference) and their front ends. The rules are listed in dtensor/ops.h.
#include <spmd/dtensor/ops.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/sim/local_ops.h>
#include <spmd/tensor/ops.h>

namespace spmd {
namespace {

using Inputs = LocalInputs;
using Fulls = std::span<const Tensor>;

Placements all_replicate(int mesh_ndim) {
  return Placements(static_cast<size_t>(mesh_ndim), Replicate{});
}

// The all-Replicate strategy: always correct.
OpStrategy replicate_strategy(SpecList in) {
  OpStrategy s;
  for (size_t t = 0; t < in.size(); ++t) s.inputs.push_back(all_replicate(in[0]->mesh_ndim()));
  s.output = all_replicate(in[0]->mesh_ndim());
  return s;
}

// One input, placement by placement: `map` gives the output placement for an input placement,
// or nullopt when that mesh dim must be Replicate first. Returns that strategy and the
// all-Replicate one.
std::vector<OpStrategy> derived_strategy(
    SpecList in, const std::function<std::optional<Placement>(const Placement&)>& map) {
  OpStrategy s;
  s.inputs.push_back(in[0]->placements());
  for (Placement& p : s.inputs[0]) {
    std::optional<Placement> out = map(p);
    if (!out) {
      p = Replicate{};
      out = map(p);
      SPMD_CHECK(out.has_value());
    }
    s.output.push_back(*out);
  }
  return {std::move(s), replicate_strategy(in)};
}

Partial swap_min_max(ReduceOp op) {
  return Partial{op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max};
}
bool is_min_max(ReduceOp op) {
  return op == ReduceOp::Max || op == ReduceOp::Min;
}
bool is_linear(ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Avg;
}

OpMeta same_shape_meta(const OpDef& op, SpecList in, const OpArgs& args) {
  return OpMeta{in[0]->shape(), probe_dtype(op, in, args)};
}

// ---- unary pointwise ---------------------------------------------------------------------------

enum class UnaryRule { None, Negation, NonDecreasing };

template <UnaryRule rule>
std::vector<OpStrategy> unary_strategies(SpecList in, const OpArgs&, const OpMeta&) {
  return derived_strategy(in, [](const Placement& p) -> std::optional<Placement> {
    const Partial* q = std::get_if<Partial>(&p);
    if (q == nullptr) return p;
    if (rule == UnaryRule::Negation) {
      if (is_linear(q->op)) return p;
      if (is_min_max(q->op)) return swap_min_max(q->op);
    }
    if (rule == UnaryRule::NonDecreasing && is_min_max(q->op)) return p;
    return std::nullopt;
  });
}

#define SPMD_UNARY_OPDEF_(fn, rule)                                                               \
  const OpDef k_##fn{#fn,                                                                         \
                     [](SpecList in, const OpArgs& a) { return same_shape_meta(k_##fn, in, a); }, \
                     unary_strategies<rule>,                                                      \
                     [](Inputs in, const OpArgs&, const DTensorSpec&) { return fn(in[0]); },      \
                     [](Fulls in, const OpArgs&) { return fn(in[0]); }};
SPMD_UNARY_OPDEF_(neg, UnaryRule::Negation)
SPMD_UNARY_OPDEF_(abs, UnaryRule::None)
SPMD_UNARY_OPDEF_(exp, UnaryRule::NonDecreasing)
SPMD_UNARY_OPDEF_(log, UnaryRule::None)
SPMD_UNARY_OPDEF_(sqrt, UnaryRule::None)
SPMD_UNARY_OPDEF_(tanh, UnaryRule::NonDecreasing)
SPMD_UNARY_OPDEF_(relu, UnaryRule::NonDecreasing)
SPMD_UNARY_OPDEF_(gelu, UnaryRule::None)
#undef SPMD_UNARY_OPDEF_

// ---- pointwise with a scalar -------------------------------------------------------------------

enum class ScalarOp { Add, Sub, RSub, Mul, Div, RDiv };

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

Tensor apply_scalar(ScalarOp op, const Tensor& x, double c) {
  switch (op) {
    case ScalarOp::Add:
      return x + c;
    case ScalarOp::Sub:
      return x - c;
    case ScalarOp::RSub:
      return c - x;
    case ScalarOp::Mul:
      return x * c;
    case ScalarOp::Div:
      return x / c;
    case ScalarOp::RDiv:
      return c / x;
  }
  return x;
}

template <ScalarOp op>
std::vector<OpStrategy> scalar_strategies(SpecList in, const OpArgs& args, const OpMeta&) {
  const double c = args.reals.at(0);
  return derived_strategy(in, [c](const Placement& p) -> std::optional<Placement> {
    const Partial* q = std::get_if<Partial>(&p);
    if (q == nullptr) return p;
    return scalar_partial(op, q->op, c);
  });
}

#define SPMD_SCALAR_OPDEF_(var, name, op)                                                         \
  const OpDef var{name, [](SpecList in, const OpArgs& a) { return same_shape_meta(var, in, a); }, \
                  scalar_strategies<op>,                                                          \
                  [](Inputs in, const OpArgs& a, const DTensorSpec&) {                            \
                    const double c = a.reals[0];                                                  \
                    return in[0].apply([c](const Tensor& x) { return apply_scalar(op, x, c); });  \
                  },                                                                              \
                  [](Fulls in, const OpArgs& a) { return apply_scalar(op, in[0], a.reals[0]); }};
SPMD_SCALAR_OPDEF_(k_add_scalar, "add", ScalarOp::Add)
SPMD_SCALAR_OPDEF_(k_sub_scalar, "sub", ScalarOp::Sub)
SPMD_SCALAR_OPDEF_(k_rsub_scalar, "rsub", ScalarOp::RSub)
SPMD_SCALAR_OPDEF_(k_mul_scalar, "mul", ScalarOp::Mul)
SPMD_SCALAR_OPDEF_(k_div_scalar, "div", ScalarOp::Div)
SPMD_SCALAR_OPDEF_(k_rdiv_scalar, "rdiv", ScalarOp::RDiv)
#undef SPMD_SCALAR_OPDEF_

// ---- binary pointwise with broadcasting --------------------------------------------------------

enum class BinaryOp { Add, Sub, Mul, Div, Maximum, Minimum };

// The Partial combinations a binary op keeps: (a, b) -> out, with R as Replicate.
std::vector<DimOption> binary_partial_options(BinaryOp op) {
  const Placement R = Replicate{};
  auto P = [](ReduceOp o) { return Placement{Partial{o}}; };
  std::vector<DimOption> out;
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Sub:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{P(o), P(o)}, P(o)});
      for (ReduceOp o : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        out.push_back({{P(o), R}, P(o)});
      }
      out.push_back({{R, P(ReduceOp::Avg)}, P(ReduceOp::Avg)});
      if (op == BinaryOp::Add) {
        out.push_back({{R, P(ReduceOp::Max)}, P(ReduceOp::Max)});
        out.push_back({{R, P(ReduceOp::Min)}, P(ReduceOp::Min)});
      } else {
        out.push_back({{R, P(ReduceOp::Max)}, P(ReduceOp::Min)});
        out.push_back({{R, P(ReduceOp::Min)}, P(ReduceOp::Max)});
      }
      break;
    case BinaryOp::Mul:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
        out.push_back({{P(o), R}, P(o)});
        out.push_back({{R, P(o)}, P(o)});
      }
      break;
    case BinaryOp::Div:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{P(o), R}, P(o)});
      break;
    case BinaryOp::Maximum:
    case BinaryOp::Minimum: {
      const ReduceOp o = op == BinaryOp::Maximum ? ReduceOp::Max : ReduceOp::Min;
      out.push_back({{P(o), P(o)}, P(o)});
      out.push_back({{P(o), R}, P(o)});
      out.push_back({{R, P(o)}, P(o)});
      break;
    }
  }
  return out;
}

// The dim of input shape `in` that lines up (broadcasting, right-aligned) with dim o of the
// result shape `out`, or -1 when the input lacks it or broadcasts it from size 1.
int aligned_dim(const Shape& in, const Shape& out, int o) {
  const int d = o - static_cast<int>(out.size() - in.size());
  if (d < 0) return -1;
  if (in[static_cast<size_t>(d)] != out[static_cast<size_t>(o)]) return -1;
  return d;
}

template <BinaryOp op>
std::vector<OpStrategy> binary_strategies(SpecList in, const OpArgs&, const OpMeta& meta) {
  std::vector<DimOption> options = {{{Replicate{}, Replicate{}}, Replicate{}}};
  for (int o = 0; o < static_cast<int>(meta.shape.size()); ++o) {
    const int da = aligned_dim(in[0]->shape(), meta.shape, o);
    const int db = aligned_dim(in[1]->shape(), meta.shape, o);
    if (da < 0 && db < 0) continue;
    options.push_back({{da >= 0 ? Placement{Shard{da}} : Placement{Replicate{}},
                        db >= 0 ? Placement{Shard{db}} : Placement{Replicate{}}},
                       Shard{o}});
  }
  for (DimOption& o : binary_partial_options(op)) options.push_back(std::move(o));
  return expand_dim_options(in, options);
}

// Tensor (the full-tensor reference) or LocalTensor (the shards): both have these functions.
template <class T>
T apply_binary(BinaryOp op, const T& a, const T& b) {
  switch (op) {
    case BinaryOp::Add:
      return add(a, b);
    case BinaryOp::Sub:
      return sub(a, b);
    case BinaryOp::Mul:
      return mul(a, b);
    case BinaryOp::Div:
      return div(a, b);
    case BinaryOp::Maximum:
      return maximum(a, b);
    case BinaryOp::Minimum:
      return minimum(a, b);
  }
  return a;
}

#define SPMD_BINARY_OPDEF_(var, name, op)                                                          \
  const OpDef var{                                                                                 \
      name,                                                                                        \
      [](SpecList in, const OpArgs& a) {                                                           \
        return OpMeta{broadcast_shapes(in[0]->shape(), in[1]->shape(), name),                      \
                      probe_dtype(var, in, a)};                                                    \
      },                                                                                           \
      binary_strategies<op>,                                                                       \
      [](Inputs in, const OpArgs&, const DTensorSpec&) { return apply_binary(op, in[0], in[1]); }, \
      [](Fulls in, const OpArgs&) { return apply_binary(op, in[0], in[1]); }};
SPMD_BINARY_OPDEF_(k_add, "add", BinaryOp::Add)
SPMD_BINARY_OPDEF_(k_sub, "sub", BinaryOp::Sub)
SPMD_BINARY_OPDEF_(k_mul, "mul", BinaryOp::Mul)
SPMD_BINARY_OPDEF_(k_div, "div", BinaryOp::Div)
SPMD_BINARY_OPDEF_(k_maximum, "maximum", BinaryOp::Maximum)
SPMD_BINARY_OPDEF_(k_minimum, "minimum", BinaryOp::Minimum)
#undef SPMD_BINARY_OPDEF_

// ---- matmul, bmm, addmm ------------------------------------------------------------------------

// Einsum labels of a matmul: per dim of a, b and the output; -1 marks a dim that is not sharded.
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

Shape matmul_shape(const Shape& a, const Shape& b, const char* name) {
  auto fail = [&]() -> Shape {
    throw_error<ShapeError>("{}: shapes {} and {} cannot be multiplied", name, shape_str(a),
                            shape_str(b));
  };
  if (a.empty() || b.empty()) fail();
  const int64_t ka = a.back();
  const int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) fail();
  if (a.size() == 1 && b.size() == 1) return {};
  if (b.size() == 1) return Shape(a.begin(), a.end() - 1);
  if (a.size() == 1) {
    Shape out(b.begin(), b.end() - 2);
    out.push_back(b.back());
    return out;
  }
  Shape batch =
      broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), name);
  batch.push_back(a[a.size() - 2]);
  batch.push_back(b.back());
  return batch;
}

const OpDef k_matmul{
    "matmul",
    [](SpecList in, const OpArgs& a) {
      return OpMeta{matmul_shape(in[0]->shape(), in[1]->shape(), "matmul"),
                    probe_dtype(k_matmul, in, a)};
    },
    [](SpecList in, const OpArgs&, const OpMeta&) {
      auto labels = matmul_labels(in[0]->shape(), in[1]->shape());
      if (!labels) return std::vector<OpStrategy>{replicate_strategy(in)};
      return expand_dim_options(in, matmul_options(*labels, nullptr));
    },
    [](Inputs in, const OpArgs&, const DTensorSpec&) { return matmul(in[0], in[1]); },
    [](Fulls in, const OpArgs&) { return matmul(in[0], in[1]); }};
const OpDef k_bmm{"bmm",
                  [](SpecList in, const OpArgs& a) {
                    const Shape& x = in[0]->shape();
                    const Shape& y = in[1]->shape();
                    if (x.size() != 3 || y.size() != 3 || x[0] != y[0] || x[2] != y[1]) {
                      throw_error<ShapeError>("bmm: expects [B,n,k] @ [B,k,m], got {} and {}",
                                              shape_str(x), shape_str(y));
                    }
                    return OpMeta{{x[0], x[1], y[2]}, probe_dtype(k_bmm, in, a)};
                  },
                  [](SpecList in, const OpArgs&, const OpMeta&) {
                    return expand_dim_options(
                        in,
                        matmul_options(*matmul_labels(in[0]->shape(), in[1]->shape()), nullptr));
                  },
                  [](Inputs in, const OpArgs&, const DTensorSpec&) { return bmm(in[0], in[1]); },
                  [](Fulls in, const OpArgs&) { return bmm(in[0], in[1]); }};
const OpDef k_addmm{
    "addmm",
    [](SpecList in, const OpArgs& a) {
      const Shape& c = in[0]->shape();
      const Shape& x = in[1]->shape();
      const Shape& y = in[2]->shape();
      if (x.size() != 2 || y.size() != 2 || x[1] != y[0]) {
        throw_error<ShapeError>("addmm: expects a [n,k] and b [k,m], got {} and {}", shape_str(x),
                                shape_str(y));
      }
      const Shape out = {x[0], y[1]};
      if (broadcast_shapes(c, out, "addmm") != out) {
        throw_error<ShapeError>("addmm: c of shape {} does not broadcast to {}", shape_str(c),
                                shape_str(out));
      }
      return OpMeta{out, probe_dtype(k_addmm, in, a)};
    },
    [](SpecList in, const OpArgs&, const OpMeta& meta) {
      std::vector<int> c_dims;
      for (int o = 0; o < 2; ++o) c_dims.push_back(aligned_dim(in[0]->shape(), meta.shape, o));
      Labels labels = *matmul_labels(in[1]->shape(), in[2]->shape());
      return expand_dim_options(in, matmul_options(labels, &c_dims));
    },
    [](Inputs in, const OpArgs& a, const DTensorSpec&) {
      return addmm(in[0], in[1], in[2], a.reals[0], a.reals[1]);
    },
    [](Fulls in, const OpArgs& a) { return addmm(in[0], in[1], in[2], a.reals[0], a.reals[1]); }};

// ---- reductions --------------------------------------------------------------------------------

enum class Reduction { Sum, Mean, Amax, Amin };

// args.ints = [keepdim, dims...] with dims normalized, sorted, unique.
std::vector<int64_t> reduced_dims(const OpArgs& args) {
  return std::vector<int64_t>(args.ints.begin() + 1, args.ints.end());
}

Tensor apply_reduction(Reduction r, const Tensor& t, const std::vector<int64_t>& dims, bool keep) {
  switch (r) {
    case Reduction::Sum:
      return sum(t, dims, keep);
    case Reduction::Mean:
      return mean(t, dims, keep);
    case Reduction::Amax:
      return amax(t, dims, keep);
    case Reduction::Amin:
      return amin(t, dims, keep);
  }
  return t;
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
std::vector<OpStrategy> reduction_strategies(SpecList in, const OpArgs& args, const OpMeta&) {
  const std::vector<int64_t> dims = reduced_dims(args);
  const bool keep = args.ints[0] != 0;
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
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
      options.push_back({{Partial{op}}, Partial{op}});
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

template <Reduction r>
LocalTensor reduction_local(Inputs in, const OpArgs& args, const DTensorSpec& out) {
  const std::vector<int64_t> dims = reduced_dims(args);
  const bool keep = args.ints[0] != 0;
  return in[0].apply([&](const Tensor& t) {
    if constexpr (r == Reduction::Amax || r == Reduction::Amin) {
      // An empty piece of a sharded reduced dim (Note [Uneven sharding]) contributes the
      // reduction's identity to the Partial.
      bool empty = false;
      for (int64_t d : dims) empty = empty || t.size(d) == 0;
      if (empty) {
        return full(reduced_shape(t.shape(), dims, keep),
                    extreme(out.dtype(), r == Reduction::Amax), out.dtype(), t.device());
      }
    }
    return apply_reduction(r, t, dims, keep);
  });
}

template <Reduction r>
OpMeta reduction_meta(const OpDef& op, SpecList in, const OpArgs& args) {
  const std::vector<int64_t> dims = reduced_dims(args);
  if (r == Reduction::Amax || r == Reduction::Amin) {
    for (int64_t d : dims) {
      if (in[0]->shape()[static_cast<size_t>(d)] == 0) {
        throw_error<ShapeError>("{}: cannot reduce over dim {} of size 0 (shape {}): no identity",
                                op.name, d, shape_str(in[0]->shape()));
      }
    }
  }
  return OpMeta{reduced_shape(in[0]->shape(), dims, args.ints[0] != 0), probe_dtype(op, in, args)};
}

#define SPMD_REDUCTION_OPDEF_(fn, r)                                                      \
  const OpDef k_##fn{                                                                     \
      #fn, [](SpecList in, const OpArgs& a) { return reduction_meta<r>(k_##fn, in, a); }, \
      reduction_strategies<r>, reduction_local<r>,                                        \
      [](Fulls in, const OpArgs& a) {                                                     \
        return apply_reduction(r, in[0], reduced_dims(a), a.ints[0] != 0);                \
      }};
SPMD_REDUCTION_OPDEF_(sum, Reduction::Sum)
SPMD_REDUCTION_OPDEF_(mean, Reduction::Mean)
SPMD_REDUCTION_OPDEF_(amax, Reduction::Amax)
SPMD_REDUCTION_OPDEF_(amin, Reduction::Amin)
#undef SPMD_REDUCTION_OPDEF_

// ---- softmax -----------------------------------------------------------------------------------

std::vector<OpStrategy> softmax_strategies(SpecList in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(args.ints[0]);
  return derived_strategy(in, [d](const Placement& p) -> std::optional<Placement> {
    if (is_partial(p) || is_shard(p, d)) return std::nullopt;
    return p;
  });
}

const OpDef k_softmax{
    "softmax", [](SpecList in, const OpArgs& a) { return same_shape_meta(k_softmax, in, a); },
    softmax_strategies,
    [](Inputs in, const OpArgs& a, const DTensorSpec&) { return softmax(in[0], a.ints[0]); },
    [](Fulls in, const OpArgs& a) { return softmax(in[0], a.ints[0]); }};
const OpDef k_log_softmax{
    "log_softmax",
    [](SpecList in, const OpArgs& a) { return same_shape_meta(k_log_softmax, in, a); },
    softmax_strategies,
    [](Inputs in, const OpArgs& a, const DTensorSpec&) { return log_softmax(in[0], a.ints[0]); },
    [](Fulls in, const OpArgs& a) { return log_softmax(in[0], a.ints[0]); }};

// ---- transpose ---------------------------------------------------------------------------------

const OpDef k_transpose{
    "transpose",
    [](SpecList in, const OpArgs& a) {
      Shape s = in[0]->shape();
      std::swap(s[static_cast<size_t>(a.ints[0])], s[static_cast<size_t>(a.ints[1])]);
      return OpMeta{s, in[0]->dtype()};
    },
    [](SpecList in, const OpArgs& a, const OpMeta&) {
      const int x = static_cast<int>(a.ints[0]);
      const int y = static_cast<int>(a.ints[1]);
      return derived_strategy(in, [x, y](const Placement& p) -> std::optional<Placement> {
        if (is_shard(p, x)) return Shard{y};
        if (is_shard(p, y)) return Shard{x};
        return p;
      });
    },
    [](Inputs in, const OpArgs& a, const DTensorSpec&) {
      return in[0].transpose(a.ints[0], a.ints[1]);
    },
    [](Fulls in, const OpArgs& a) { return in[0].transpose(a.ints[0], a.ints[1]); }};

// ---- reshape -----------------------------------------------------------------------------------

struct ViewGroup {
  std::vector<int> in;
  std::vector<int> out;
};

// The dims of `in` and `out` (size-1 dims left out) in groups of equal element count, in order:
// [2, 3, 4] -> [6, 4] gives ({0, 1}, {0}), ({2}, {1}). @pre equal numel, not 0.
std::vector<ViewGroup> view_groups(const Shape& in, const Shape& out) {
  std::vector<int> a, b;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] != 1) a.push_back(static_cast<int>(d));
  }
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] != 1) b.push_back(static_cast<int>(d));
  }
  std::vector<ViewGroup> groups;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    ViewGroup g{{a[i]}, {b[j]}};
    int64_t pi = in[static_cast<size_t>(a[i++])];
    int64_t po = out[static_cast<size_t>(b[j++])];
    while (pi != po) {
      if (pi < po) {
        SPMD_CHECK_LT(i, a.size());
        pi *= in[static_cast<size_t>(a[i])];
        g.in.push_back(a[i++]);
      } else {
        SPMD_CHECK_LT(j, b.size());
        po *= out[static_cast<size_t>(b[j])];
        g.out.push_back(b[j++]);
      }
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// Whether every rank's piece of `in_spec` is, reshaped, exactly its piece of `out_spec`, for the
// group whose first input dim is sharded (checked at every mesh coordinate).
bool reshape_group_matches(const DTensorSpec& in_spec, const DTensorSpec& out_spec,
                           const ViewGroup& g) {
  int64_t inner_in = 1, inner_out = 1;
  for (size_t k = 1; k < g.in.size(); ++k)
    inner_in *= in_spec.shape()[static_cast<size_t>(g.in[k])];
  for (size_t k = 1; k < g.out.size(); ++k) {
    inner_out *= out_spec.shape()[static_cast<size_t>(g.out[k])];
  }
  const std::vector<int64_t>& mesh_shape = in_spec.mesh_shape();
  std::vector<int64_t> coordinate(mesh_shape.size(), 0);
  while (true) {
    const size_t di = static_cast<size_t>(g.in[0]);
    const size_t dout = static_cast<size_t>(g.out[0]);
    const int64_t in_off = in_spec.local_offset(coordinate)[di] * inner_in;
    const int64_t in_len = in_spec.local_shape(coordinate)[di] * inner_in;
    const int64_t out_off = out_spec.local_offset(coordinate)[dout] * inner_out;
    const int64_t out_len = out_spec.local_shape(coordinate)[dout] * inner_out;
    if (in_len != out_len || (in_len != 0 && in_off != out_off)) return false;
    int i = static_cast<int>(mesh_shape.size()) - 1;
    while (i >= 0 && ++coordinate[static_cast<size_t>(i)] == mesh_shape[static_cast<size_t>(i)]) {
      coordinate[static_cast<size_t>(i)] = 0;
      --i;
    }
    if (i < 0) return true;
  }
}

std::vector<OpStrategy> reshape_strategies(SpecList in, const OpArgs&, const OpMeta& meta) {
  const DTensorSpec& spec = *in[0];
  Placements required = spec.placements();
  if (spec.numel() == 0) return {replicate_strategy(in)};
  const std::vector<ViewGroup> groups = view_groups(spec.shape(), meta.shape);
  auto group_of = [&](int d) -> const ViewGroup* {
    for (const ViewGroup& g : groups) {
      if (std::find(g.in.begin(), g.in.end(), d) != g.in.end()) return &g;
    }
    return nullptr;
  };
  while (true) {
    Placements output;
    for (Placement& p : required) {
      if (const Shard* s = std::get_if<Shard>(&p)) {
        const ViewGroup* g = group_of(s->dim);
        if (g == nullptr || g->in[0] != s->dim) {
          p = Replicate{};
          output.push_back(Replicate{});
        } else {
          output.push_back(Shard{g->out[0]});
        }
      } else {
        output.push_back(p);
      }
    }
    DTensorSpec in_spec = spec.with_placements(required);
    DTensorSpec out_spec(spec.mesh(), output, meta.shape, meta.dtype);
    bool changed = false;
    for (const ViewGroup& g : groups) {
      const bool sharded = std::any_of(required.begin(), required.end(),
                                       [&](const Placement& p) { return is_shard(p, g.in[0]); });
      if (!sharded || reshape_group_matches(in_spec, out_spec, g)) continue;
      for (Placement& p : required) {
        if (is_shard(p, g.in[0])) p = Replicate{};
      }
      changed = true;
    }
    if (!changed) {
      OpStrategy s;
      s.inputs.push_back(required);
      s.output = output;
      return {std::move(s), replicate_strategy(in)};
    }
  }
}

const OpDef k_reshape{
    "reshape",
    [](SpecList in, const OpArgs& a) {
      const Shape& from = in[0]->shape();
      Shape to = a.ints;
      int64_t known = 1;
      int infer = -1;
      for (size_t d = 0; d < to.size(); ++d) {
        if (to[d] == -1 && infer < 0) {
          infer = static_cast<int>(d);
        } else if (to[d] < 0) {
          throw_error<ShapeError>("reshape: bad target shape {} for a tensor of shape {}",
                                  shape_str(a.ints), shape_str(from));
        } else {
          known *= to[d];
        }
      }
      const int64_t numel = shape_numel(from);
      if (infer >= 0) {
        if (known == 0 || numel % known != 0) {
          throw_error<ShapeError>("reshape: cannot infer -1 in {} for a tensor of shape {}",
                                  shape_str(a.ints), shape_str(from));
        }
        to[static_cast<size_t>(infer)] = numel / known;
      }
      if (shape_numel(to) != numel) {
        throw_error<ShapeError>("reshape: shape {} has {} elements, the tensor of shape {} has {}",
                                shape_str(a.ints), shape_numel(to), shape_str(from), numel);
      }
      return OpMeta{to, in[0]->dtype()};
    },
    reshape_strategies,
    [](Inputs in, const OpArgs&, const DTensorSpec& out) {
      const DTensorSpec::RankInfo& info = out.rank_info();
      if (info.uniform_shapes) {
        const Shape& shape = info.local_shapes.front();
        return in[0].apply([&](const Tensor& t) { return t.reshape(shape); });
      }
      return in[0].map([&](int rank, const Tensor& t) {
        return t.reshape(info.local_shapes[info.index_of(rank)]);
      });
    },
    [](Fulls in, const OpArgs& a) { return in[0].reshape(a.ints); }};

// ---- front ends --------------------------------------------------------------------------------

DTensor run(const OpDef& op, std::initializer_list<const DTensor*> inputs, OpArgs args = {}) {
  return dispatch(op, inputs, args);
}

DTensor replicated_operand(const Tensor& t, const DTensor& like, const char* op) {
  if (!like.defined()) throw_error<PlacementError>("{}: DTensor operand is undefined", op);
  if (!implicit_replication_enabled()) {
    throw_error<PlacementError>(
        "{}: mixing a DTensor ({} {} {} on {}) with a plain Tensor of shape {}; distribute_tensor "
        "the Tensor first, or treat it as Replicate within an ImplicitReplication scope",
        op, to_string(like.placements()), shape_str(like.shape()), like.dtype(),
        like.mesh().to_string(), t.defined() ? shape_str(t.shape()) : std::string("(undefined)"));
  }
  return distribute_tensor(t, like.mesh(), all_replicate(like.mesh().ndim()));
}

// d in [0, t.dim()), or ShapeError naming the op, the DTensor's placements, shape and mesh.
int64_t dim_of(const DTensor& t, int64_t d, const char* op) {
  try {
    return normalize_dim(d, t.dim(), op, t.shape());
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("{} (DTensor {} {} on {})", e.what(), to_string(t.placements()),
                                 shape_str(t.shape()), t.mesh().to_string()));
  }
}

OpArgs scalar_args(double c) {
  OpArgs args;
  args.reals.push_back(c);
  return args;
}

// Normalized [keepdim, dims...] for the reductions.
OpArgs reduction_args(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim,
                      const char* op) {
  OpArgs args;
  args.ints.push_back(keepdim ? 1 : 0);
  const int64_t nd = t.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) args.ints.push_back(d);
    return args;
  }
  std::vector<int64_t> norm;
  for (int64_t d : dims) {
    const int64_t n = dim_of(t, d, op);
    if (std::find(norm.begin(), norm.end(), n) != norm.end()) {
      throw_error<ShapeError>("{}: dim {} appears twice in {} (shape {}, placements {})", op, d,
                              shape_str(dims), shape_str(t.shape()), to_string(t.placements()));
    }
    norm.push_back(n);
  }
  std::sort(norm.begin(), norm.end());
  args.ints.insert(args.ints.end(), norm.begin(), norm.end());
  return args;
}

}  // namespace

#define SPMD_DTENSOR_BINARY_IMPL_(name)                 \
  DTensor name(const DTensor& a, const DTensor& b) {    \
    return run(k_##name, {&a, &b});                     \
  }                                                     \
  DTensor name(const DTensor& a, const Tensor& b) {     \
    const DTensor rb = replicated_operand(b, a, #name); \
    return run(k_##name, {&a, &rb});                    \
  }                                                     \
  DTensor name(const Tensor& a, const DTensor& b) {     \
    const DTensor ra = replicated_operand(a, b, #name); \
    return run(k_##name, {&ra, &b});                    \
  }
SPMD_DTENSOR_BINARY_IMPL_(add)
SPMD_DTENSOR_BINARY_IMPL_(sub)
SPMD_DTENSOR_BINARY_IMPL_(mul)
SPMD_DTENSOR_BINARY_IMPL_(div)
SPMD_DTENSOR_BINARY_IMPL_(maximum)
SPMD_DTENSOR_BINARY_IMPL_(minimum)
SPMD_DTENSOR_BINARY_IMPL_(matmul)
SPMD_DTENSOR_BINARY_IMPL_(bmm)
#undef SPMD_DTENSOR_BINARY_IMPL_

#define SPMD_DTENSOR_OPERATOR_IMPL_(op, name, scalar_right, scalar_left) \
  DTensor operator op(const DTensor& a, const DTensor& b) {              \
    return name(a, b);                                                   \
  }                                                                      \
  DTensor operator op(const DTensor& a, const Tensor& b) {               \
    return name(a, b);                                                   \
  }                                                                      \
  DTensor operator op(const Tensor& a, const DTensor& b) {               \
    return name(a, b);                                                   \
  }                                                                      \
  DTensor operator op(const DTensor& a, double b) {                      \
    return run(scalar_right, {&a}, scalar_args(b));                      \
  }                                                                      \
  DTensor operator op(double a, const DTensor& b) {                      \
    return run(scalar_left, {&b}, scalar_args(a));                       \
  }
SPMD_DTENSOR_OPERATOR_IMPL_(+, add, k_add_scalar, k_add_scalar)
SPMD_DTENSOR_OPERATOR_IMPL_(-, sub, k_sub_scalar, k_rsub_scalar)
SPMD_DTENSOR_OPERATOR_IMPL_(*, mul, k_mul_scalar, k_mul_scalar)
SPMD_DTENSOR_OPERATOR_IMPL_(/, div, k_div_scalar, k_rdiv_scalar)
#undef SPMD_DTENSOR_OPERATOR_IMPL_

DTensor operator-(const DTensor& a) {
  return neg(a);
}

DTensor addmm(const DTensor& c, const DTensor& a, const DTensor& b, double beta, double alpha) {
  OpArgs args;
  args.reals = {beta, alpha};
  return run(k_addmm, {&c, &a, &b}, std::move(args));
}

#define SPMD_DTENSOR_UNARY_IMPL_(name) \
  DTensor name(const DTensor& t) {     \
    return run(k_##name, {&t});        \
  }
SPMD_DTENSOR_UNARY_IMPL_(neg)
SPMD_DTENSOR_UNARY_IMPL_(abs)
SPMD_DTENSOR_UNARY_IMPL_(exp)
SPMD_DTENSOR_UNARY_IMPL_(log)
SPMD_DTENSOR_UNARY_IMPL_(sqrt)
SPMD_DTENSOR_UNARY_IMPL_(tanh)
SPMD_DTENSOR_UNARY_IMPL_(relu)
SPMD_DTENSOR_UNARY_IMPL_(gelu)
#undef SPMD_DTENSOR_UNARY_IMPL_

#define SPMD_DTENSOR_REDUCTION_IMPL_(name)                                         \
  DTensor name(const DTensor& t) {                                                 \
    return name(t, {}, false);                                                     \
  }                                                                                \
  DTensor name(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim) { \
    return run(k_##name, {&t}, reduction_args(t, dims, keepdim, #name));           \
  }
SPMD_DTENSOR_REDUCTION_IMPL_(sum)
SPMD_DTENSOR_REDUCTION_IMPL_(mean)
SPMD_DTENSOR_REDUCTION_IMPL_(amax)
SPMD_DTENSOR_REDUCTION_IMPL_(amin)
#undef SPMD_DTENSOR_REDUCTION_IMPL_

DTensor softmax(const DTensor& t, int64_t d) {
  OpArgs args;
  args.ints.push_back(dim_of(t, d, "softmax"));
  return run(k_softmax, {&t}, std::move(args));
}

DTensor log_softmax(const DTensor& t, int64_t d) {
  OpArgs args;
  args.ints.push_back(dim_of(t, d, "log_softmax"));
  return run(k_log_softmax, {&t}, std::move(args));
}

DTensor transpose(const DTensor& t, int64_t a, int64_t b) {
  OpArgs args;
  args.ints.push_back(dim_of(t, a, "transpose"));
  args.ints.push_back(dim_of(t, b, "transpose"));
  return run(k_transpose, {&t}, std::move(args));
}

DTensor reshape(const DTensor& t, const Shape& shape) {
  OpArgs args;
  args.ints = shape;
  return run(k_reshape, {&t}, std::move(args));
}

}  // namespace spmd
