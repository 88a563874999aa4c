// The op table's conformance table: one row per op (or op variant), the op written once as a
// generic lambda so the same row runs on Tensor, LocalTensor and DTensor.
//   - Elementwise rows carry a per-element reference in double: the Tensor op must match it for
//     every dtype (pair) and memory layout, with the dtype Note [Type promotion] gives.
//   - Every row: the LocalTensor op equals the Tensor op on every rank's shard (different data
//     per rank, and replicated inputs computed once).
//   - Every row: the DTensor op equals the Tensor op on the full tensors, under random meshes and
//     placements (Partial inputs from known decompositions), on F32 and on integers.
// Adding an op adds a row here (docs/design.md, "Adding an op").
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/user_op.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/local_ops.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::expect_values;
using testing::Gen;
using testing::layout_name;
using testing::round_to;

// What an elementwise op computes in (the functor's element::Domain).
enum class Kind {
  Floating,  // integer and Bool inputs give F32
  Numeric,   // any dtype but Bool (Unsupported)
  Any,       // every dtype
  Compare,   // every dtype, computed in the promoted dtype, a Bool result
};

struct OpRow {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> on_tensor;
  std::function<LocalTensor(const std::vector<LocalTensor>&)> on_local;
  std::function<DTensor(const std::vector<DTensor>&)> on_dtensor;
  bool positive = false;       // inputs must be positive (log, sqrt, divisions)
  bool floating_only = false;  // skipped on integer data
  // The op has no derivative (scaled_mm, as torch._scaled_mm): no gradient rows.
  bool no_derivative = false;
  // Its gradient is a recipe's, not the derivative (FP8 training's straight-through casts): no
  // finite differences; tests/ops/float8_test.cpp checks the recipe.
  bool straight_through = false;
  // Inputs that are not data: input k -> I64 indices in [0, bound), or a Bool mask. They take
  // Shard and Replicate placements only, and no gradient.
  std::map<size_t, int64_t> indices;
  std::set<size_t> masks;
  // Elementwise rows: the per-element reference and the dtypes the op computes in.
  std::function<double(double)> unary_ref;
  std::function<double(double, double)> binary_ref;
  Kind kind = Kind::Any;
};

// A row from one generic lambda over the inputs (a vector of Tensor, LocalTensor or DTensor).
template <class F>
OpRow row(std::string name, std::vector<Shape> shapes, F f) {
  return OpRow{std::move(name), std::move(shapes), f, f, f};
}

struct Table {
  std::vector<OpRow> rows;

  OpRow& add(OpRow r) { return rows.emplace_back(std::move(r)); }

  template <class F>
  void unary(std::string name, F f, std::function<double(double)> ref, Kind kind,
             bool positive = false) {
    OpRow& r = add(row(std::move(name), {{5, 4}}, [f](const auto& x) { return f(x[0]); }));
    r.unary_ref = std::move(ref);
    r.kind = kind;
    r.positive = positive;
  }

  template <class F>
  void binary(std::string name, F f, std::function<double(double, double)> ref, Kind kind,
              bool positive = false) {
    for (const auto& shapes : std::vector<std::vector<Shape>>{
             {{5, 4}, {5, 4}}, {{5, 4}, {4}}, {{5, 1}, {1, 4}}, {{3, 5, 4}, {5, 1}}}) {
      OpRow& r = add(row(name, shapes, [f](const auto& x) { return f(x[0], x[1]); }));
      r.binary_ref = ref;
      r.kind = kind;
      r.positive = positive;
    }
  }
};

// A user-defined elementwise op (ops/user_op.h).
struct Softplus {
  static constexpr std::string_view name = "softplus";
  static double f(double x) { return std::log1p(std::exp(x)); }
  static double df(double x, double) { return 1.0 / (1.0 + std::exp(-x)); }
};
const OpDef kSoftplus = user_unary_op<Softplus, PartialRule::NonDecreasing>();

Tensor softplus(const Tensor& x) {
  return call(kSoftplus, {x});
}
LocalTensor softplus(const LocalTensor& x) {
  return local_call(kSoftplus, {x});
}
DTensor softplus(const DTensor& x) {
  return dispatch(kSoftplus, {x});
}

// x as `dtype`: the Tensor method, the LocalTensor and DTensor functions (the entry to_dtype).
template <class T>
T cast(const T& x, DType dtype) {
  if constexpr (std::is_same_v<T, Tensor>) {
    return x.to(dtype);
  } else {
    return to(x, dtype);
  }
}

double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

Table op_table() {
  Table t;
  // ---- elementwise, one input ----
  t.unary(
      "neg", [](const auto& x) { return neg(x); }, [](double x) { return -x; }, Kind::Numeric);
  t.unary(
      "abs", [](const auto& x) { return abs(x); }, [](double x) { return std::abs(x); },
      Kind::Numeric);
  t.unary(
      "relu", [](const auto& x) { return relu(x); }, [](double x) { return x < 0 ? 0.0 : x; },
      Kind::Numeric);
  t.unary(
      "exp", [](const auto& x) { return exp(x); }, [](double x) { return std::exp(x); },
      Kind::Floating);
  t.unary(
      "log", [](const auto& x) { return log(x); }, [](double x) { return std::log(x); },
      Kind::Floating, true);
  t.unary(
      "sqrt", [](const auto& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); },
      Kind::Floating, true);
  t.unary(
      "rsqrt", [](const auto& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
      Kind::Floating, true);
  t.unary(
      "tanh", [](const auto& x) { return tanh(x); }, [](double x) { return std::tanh(x); },
      Kind::Floating);
  t.unary(
      "gelu", [](const auto& x) { return gelu(x); },
      [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, Kind::Floating);

  t.unary(
      "gelu_tanh", [](const auto& x) { return gelu(x, GeluApproximate::Tanh); },
      [](double x) {
        return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
      },
      Kind::Floating);
  t.unary(
      "erf", [](const auto& x) { return erf(x); }, [](double x) { return std::erf(x); },
      Kind::Floating);
  t.unary(
      "sigmoid", [](const auto& x) { return sigmoid(x); }, sigmoid_ref, Kind::Floating);
  t.unary(
      "silu", [](const auto& x) { return silu(x); }, [](double x) { return x * sigmoid_ref(x); },
      Kind::Floating);
  t.unary(
      "softplus (user op)", [](const auto& x) { return softplus(x); },
      [](double x) { return std::log1p(std::exp(x)); }, Kind::Floating);
  t.unary(
      "log1p", [](const auto& x) { return log1p(x); }, [](double x) { return std::log1p(x); },
      Kind::Floating, true);
  t.unary(
      "expm1", [](const auto& x) { return expm1(x); }, [](double x) { return std::expm1(x); },
      Kind::Floating);
  t.unary(
      "sin", [](const auto& x) { return sin(x); }, [](double x) { return std::sin(x); },
      Kind::Floating);
  t.unary(
      "cos", [](const auto& x) { return cos(x); }, [](double x) { return std::cos(x); },
      Kind::Floating);
  t.unary(
      "reciprocal", [](const auto& x) { return reciprocal(x); }, [](double x) { return 1 / x; },
      Kind::Floating, true);
  // Integral bounds keep integer dtypes; with min > max every element is max.
  t.unary(
      "clamp", [](const auto& x) { return clamp(x, -1.0, 2.0); },
      [](double x) { return std::min(std::max(x, -1.0), 2.0); }, Kind::Numeric);
  t.unary(
      "clamp", [](const auto& x) { return clamp(x, 1.0); },
      [](double x) { return std::max(x, 1.0); }, Kind::Numeric);
  t.unary(
      "clamp", [](const auto& x) { return clamp(x, std::nullopt, -2.0); },
      [](double x) { return std::min(x, -2.0); }, Kind::Numeric);
  t.unary(
      "clamp", [](const auto& x) { return clamp(x, 2.0, -1.0); }, [](double) { return -1.0; },
      Kind::Numeric);

  // ---- elementwise, two inputs with broadcasting ----
  t.binary(
      "add", [](const auto& a, const auto& b) { return a + b; },
      [](double a, double b) { return a + b; }, Kind::Numeric);
  t.binary(
      "sub", [](const auto& a, const auto& b) { return a - b; },
      [](double a, double b) { return a - b; }, Kind::Numeric);
  t.binary(
      "mul", [](const auto& a, const auto& b) { return a * b; },
      [](double a, double b) { return a * b; }, Kind::Numeric);
  t.binary(
      "div", [](const auto& a, const auto& b) { return a / b; },
      [](double a, double b) { return a / b; }, Kind::Floating, true);
  t.binary(
      "maximum", [](const auto& a, const auto& b) { return maximum(a, b); },
      [](double a, double b) { return std::max(a, b); }, Kind::Any);
  t.binary(
      "minimum", [](const auto& a, const auto& b) { return minimum(a, b); },
      [](double a, double b) { return std::min(a, b); }, Kind::Any);
  t.binary(
      "pow", [](const auto& a, const auto& b) { return pow(a, b); },
      [](double a, double b) { return std::pow(a, b); }, Kind::Floating, true);

  // ---- comparisons: Bool results, no gradient ----
  t.binary(
      "eq", [](const auto& a, const auto& b) { return eq(a, b); },
      [](double a, double b) { return a == b ? 1.0 : 0.0; }, Kind::Compare);
  t.binary(
      "ne", [](const auto& a, const auto& b) { return ne(a, b); },
      [](double a, double b) { return a != b ? 1.0 : 0.0; }, Kind::Compare);
  t.binary(
      "lt", [](const auto& a, const auto& b) { return lt(a, b); },
      [](double a, double b) { return a < b ? 1.0 : 0.0; }, Kind::Compare);
  t.binary(
      "le", [](const auto& a, const auto& b) { return le(a, b); },
      [](double a, double b) { return a <= b ? 1.0 : 0.0; }, Kind::Compare);
  t.binary(
      "gt", [](const auto& a, const auto& b) { return gt(a, b); },
      [](double a, double b) { return a > b ? 1.0 : 0.0; }, Kind::Compare);
  t.binary(
      "ge", [](const auto& a, const auto& b) { return ge(a, b); },
      [](double a, double b) { return a >= b ? 1.0 : 0.0; }, Kind::Compare);

  // ---- a tensor and a scalar ----
  for (double c : {2.0, -3.0}) {
    const std::string s = fmt::format("{}", c);
    t.add(row("x+" + s, {{5, 4}}, [c](const auto& x) { return x[0] + c; }));
    t.add(row(s + "+x", {{5, 4}}, [c](const auto& x) { return c + x[0]; }));
    t.add(row("x-" + s, {{5, 4}}, [c](const auto& x) { return x[0] - c; }));
    t.add(row(s + "-x", {{5, 4}}, [c](const auto& x) { return c - x[0]; }));
    t.add(row("x*" + s, {{5, 4}}, [c](const auto& x) { return x[0] * c; }));
    t.add(row(s + "*x", {{5, 4}}, [c](const auto& x) { return c * x[0]; }));
    t.add(row("x/" + s, {{5, 4}}, [c](const auto& x) { return x[0] / c; }));
    t.add(row(s + "/x", {{5, 4}}, [c](const auto& x) { return c / x[0]; })).positive = true;
  }

  t.add(row("x^3", {{5, 4}}, [](const auto& x) { return pow(x[0], 3.0); }));
  t.add(row("x^0.5", {{5, 4}}, [](const auto& x) { return pow(x[0], 0.5); })).positive = true;
  // Bounds that are not integers: integer inputs give F32.
  t.add(row("clamp -0.5 1.5", {{5, 4}}, [](const auto& x) { return clamp(x[0], -0.5, 1.5); }));

  // ---- selecting ----
  for (const auto& shapes :
       std::vector<std::vector<Shape>>{{{5, 4}, {5, 4}, {4}}, {{5, 1}, {5, 4}, {5, 4}}}) {
    t.add(row("where", shapes, [](const auto& x) { return where(x[0], x[1], x[2]); })).masks = {0};
  }
  t.add(row("masked_fill", {{5, 4}, {5, 4}}, [](const auto& x) {
     return masked_fill(x[0], x[1], -2.0);
   })).masks = {1};
  t.add(row("masked_fill 0", {{5, 4}, {4}}, [](const auto& x) {
     return masked_fill(x[0], x[1], 0.0);
   })).masks = {1};
  t.add(row("triu", {{5, 4}}, [](const auto& x) { return triu(x[0]); }));
  t.add(row("triu", {{3, 5, 6}}, [](const auto& x) { return triu(x[0], 1); }));
  t.add(row("tril", {{5, 4}}, [](const auto& x) { return tril(x[0]); }));
  t.add(row("tril", {{3, 5, 6}}, [](const auto& x) { return tril(x[0], -1); }));
  t.add(row("argmax", {{5, 6}}, [](const auto& x) { return argmax(x[0], 1); }));
  t.add(row("argmax", {{3, 4, 5}}, [](const auto& x) { return argmax(x[0], 0, true); }));
  t.add(row("index_select", {{6, 4}, {5}}, [](const auto& x) {
     return index_select(x[0], 0, x[1]);
   })).indices = {{1, 6}};
  t.add(row("index_select", {{3, 4, 2}, {6}}, [](const auto& x) {
     return index_select(x[0], 1, x[1]);
   })).indices = {{1, 4}};
  t.add(row("gather", {{5, 6}, {5, 3}}, [](const auto& x) {
     return gather(x[0], 1, x[1]);
   })).indices = {{1, 6}};
  t.add(row("gather", {{4, 3}, {6, 3}}, [](const auto& x) {
     return gather(x[0], 0, x[1]);
   })).indices = {{1, 4}};
  t.add(row("embedding", {{3, 4}, {7, 5}}, [](const auto& x) {
     return embedding(x[0], x[1]);
   })).indices = {{0, 7}};
  t.add(row("embedding", {{6}, {9, 4}}, [](const auto& x) {
     return embedding(x[0], x[1]);
   })).indices = {{0, 9}};

  // ---- ordering, scanning and counting (issue 27; integer data has ties: Note [Ordering ties])
  // ----
  t.add(row("topk", {{5, 6}}, [](const auto& x) { return topk(x[0], 2).values; }));
  t.add(
      row("topk smallest", {{5, 4}}, [](const auto& x) { return topk(x[0], 3, 0, false).values; }));
  t.add(row("topk indices", {{3, 4, 5}}, [](const auto& x) { return topk(x[0], 4, 1).indices; }));
  t.add(row("sort", {{5, 6}}, [](const auto& x) { return sort(x[0], 1).values; }));
  t.add(row("sort descending", {{3, 4, 5}},
            [](const auto& x) { return sort(x[0], 0, true).values; }));
  t.add(row("argsort", {{5, 6}}, [](const auto& x) { return argsort(x[0], -1, true); }));
  t.add(row("argmin", {{5, 6}}, [](const auto& x) { return argmin(x[0], 1); }));
  t.add(row("argmin", {{3, 4, 5}}, [](const auto& x) { return argmin(x[0], 0, true); }));
  t.add(row("max dim", {{5, 6}}, [](const auto& x) { return max(x[0], 1).values; }));
  t.add(row("max dim indices", {{3, 4, 5}}, [](const auto& x) { return max(x[0], -1).indices; }));
  t.add(
      row("min dim keepdim", {{3, 4, 5}}, [](const auto& x) { return min(x[0], 0, true).values; }));
  t.add(row("cumsum", {{5, 4}}, [](const auto& x) { return cumsum(x[0], 0); }));
  t.add(row("cumsum", {{3, 4, 5}}, [](const auto& x) { return cumsum(x[0], -1); }));
  t.add(row("one_hot", {{6}}, [](const auto& x) { return one_hot(x[0], 5); })).indices = {{0, 5}};
  t.add(row("one_hot", {{3, 4}}, [](const auto& x) { return one_hot(x[0], 6); })).indices = {
      {0, 6}};
  t.add(row("bincount", {{9}}, [](const auto& x) { return bincount(x[0], 5); })).indices = {{0, 5}};

  // Scatters (issue 27): inputs (x, index, src); scatter's indices are unique per column (a
  // permutation's first rows), so overwritten src elements (gradient without effect) do not occur.
  t.add(row("scatter_add", {{5, 4}, {7, 4}, {7, 4}}, [](const auto& x) {
     return scatter_add(x[0], 0, x[1], x[2]);
   })).indices = {{1, 5}};
  t.add(row("scatter_add", {{3, 6}, {3, 4}, {3, 4}}, [](const auto& x) {
     return scatter_add(x[0], -1, x[1], x[2]);
   })).indices = {{1, 6}};
  t.add(row("index_add", {{5, 4}, {7}, {7, 4}}, [](const auto& x) {
     return index_add(x[0], 0, x[1], x[2]);
   })).indices = {{1, 5}};
  t.add(row("index_add alpha", {{3, 6}, {4}, {3, 4}}, [](const auto& x) {
     return index_add(x[0], 1, x[1], x[2], -2.0);
   })).indices = {{1, 6}};
  t.add(row("scatter", {{5, 4}, {5, 4}, {3, 4}}, [](const auto& x) {
    return scatter(x[0], 0, narrow(argsort(x[1], 0), 0, 0, 3), x[2]);
  }));
  t.add(row("scatter value", {{5, 4}, {5, 2}}, [](const auto& x) {
     return scatter(x[0], 1, x[1], -3.0);
   })).indices = {{1, 4}};
  t.add(row("take_along_dim", {{5, 4}, {5, 3}}, [](const auto& x) {
     return take_along_dim(x[0], x[1], 1);
   })).indices = {{1, 4}};
  // ---- transformer layers ----
  for (const Shape& shape : std::vector<Shape>{{6, 8}, {2, 3, 8}}) {
    t.add(row("layer_norm", {shape, {8}, {8}}, [](const auto& x) {
       return layer_norm(x[0], x[1], x[2]);
     })).floating_only = true;
    t.add(row("rms_norm", {shape, {8}}, [](const auto& x) {
       return rms_norm(x[0], x[1]);
     })).floating_only = true;
  }
  t.add(row("dropout", {{6, 8}}, [](const auto& x) {
     return dropout(x[0], 0.3, 5);
   })).floating_only = true;
  {
    // Positive inputs: the second moment must be (tests/nn/nn_test.cpp checks the bits).
    OpRow& r = t.add(row("adamw_step", {{6, 8}, {6, 8}, {6, 8}, {6, 8}}, [](const auto& x) {
      return adamw_step(x[0], x[1], x[2], x[3], {.lr = 0.01, .weight_decay = 0.1, .step = 3});
    }));
    r.floating_only = true;
    r.positive = true;
    r.no_derivative = true;
  }
  {
    OpRow& r = t.add(row("cross_entropy", {{6, 7}, {6}},
                         [](const auto& x) { return cross_entropy(x[0], x[1]); }));
    r.indices = {{1, 7}};
    r.floating_only = true;
    OpRow& s = t.add(row("cross_entropy sum", {{5, 6}, {5}}, [](const auto& x) {
      return cross_entropy(x[0], x[1], LossReduction::Sum);
    }));
    s.indices = {{1, 6}};
    s.floating_only = true;
  }
  // Losses with torch's options (tests/ops/loss_test.cpp checks them against brute force): an
  // ignore_index that is a class (so random targets hit it), label smoothing, None, logits beyond
  // 2-D, unbatched; nll_loss; mse_loss with broadcasting.
  struct Loss {
    std::string name;
    Shape logits;
    CrossEntropyOptions o;
  };
  for (const Loss& l : std::vector<Loss>{
           {"ignore 2 smoothing 0.1", {6, 5}, {.ignore_index = 2, .label_smoothing = 0.1}},
           {"none", {6, 5}, {.reduction = LossReduction::None, .ignore_index = 1}},
           {"sum smoothing 1", {5, 4}, {.reduction = LossReduction::Sum, .label_smoothing = 1.0}},
           {"3d ignore 0", {4, 5, 3}, {.ignore_index = 0, .label_smoothing = 0.2}},
           {"3d none", {4, 5, 3}, {.reduction = LossReduction::None, .ignore_index = 3}},
           {"4d sum", {3, 4, 2, 3}, {.reduction = LossReduction::Sum, .ignore_index = 2}},
           {"unbatched", {5}, {.label_smoothing = 0.3}}}) {
    Shape target = l.logits;
    target.erase(target.begin() + (l.logits.size() == 1 ? 0 : 1));
    const int64_t classes = l.logits[l.logits.size() == 1 ? 0 : 1];
    const CrossEntropyOptions o = l.o;
    OpRow& r = t.add(row("cross_entropy " + l.name, {l.logits, target},
                         [o](const auto& x) { return cross_entropy(x[0], x[1], o); }));
    r.indices = {{1, classes}};
    r.floating_only = true;
    const NllLossOptions n{.reduction = o.reduction, .ignore_index = o.ignore_index};
    OpRow& q = t.add(row("nll_loss " + l.name, {l.logits, target},
                         [n](const auto& x) { return nll_loss(x[0], x[1], n); }));
    q.indices = {{1, classes}};
    q.floating_only = true;
  }
  for (const auto& [shapes, reduction] : std::vector<std::pair<std::vector<Shape>, LossReduction>>{
           {{{5, 4}, {5, 4}}, LossReduction::Mean},
           {{{5, 4}, {4}}, LossReduction::Sum},
           {{{3, 5, 4}, {5, 1}}, LossReduction::None},
           {{{5, 1}, {3, 5, 4}}, LossReduction::Mean}}) {
    const LossReduction red = reduction;
    t.add(row("mse_loss", shapes, [red](const auto& x) {
       return mse_loss(x[0], x[1], red);
     })).floating_only = true;
  }
  t.add(row("sdpa causal", {{2, 2, 4, 3}, {2, 2, 4, 3}, {2, 2, 4, 3}}, [](const auto& x) {
     return scaled_dot_product_attention(x[0], x[1], x[2], true);
   })).floating_only = true;
  t.add(row("sdpa", {{2, 3, 4}, {2, 5, 4}, {2, 5, 3}}, [](const auto& x) {
     return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.7);
   })).floating_only = true;
  // Grouped-query attention (H 4 over Hkv 2; H 6 over Hkv 2, causal), and masks: a Bool mask
  // (an index-like input; its first key always attended, so no row is empty) and a floating one
  // (data, with a gradient) broadcast over the heads.
  t.add(row("sdpa gqa", {{2, 4, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}}, [](const auto& x) {
     return scaled_dot_product_attention(x[0], x[1], x[2], AttentionOptions{.enable_gqa = true});
   })).floating_only = true;
  t.add(row("sdpa gqa causal", {{1, 6, 4, 2}, {1, 2, 4, 2}, {1, 2, 4, 2}}, [](const auto& x) {
     return scaled_dot_product_attention(x[0], x[1], x[2],
                                         AttentionOptions{.causal = true, .enable_gqa = true});
   })).floating_only = true;
  for (bool gqa : {false, true}) {
    OpRow& r = t.add(row(gqa ? "sdpa gqa bool mask" : "sdpa bool mask",
                         {{2, 4, 4, 3}, {2, gqa ? 2 : 4, 5, 3}, {2, gqa ? 2 : 4, 5, 3}, {4, 5}},
                         [gqa](const auto& x) {
                           const auto first = narrow(x[3], 1, 0, 1);
                           const auto mask = cat({eq(first, first), narrow(x[3], 1, 1, 4)}, 1);
                           return scaled_dot_product_attention(x[0], x[1], x[2], mask,
                                                               AttentionOptions{.enable_gqa = gqa});
                         }));
    r.masks = {3};
    r.floating_only = true;
  }
  t.add(row("sdpa float mask", {{2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}, {2, 1, 4, 5}},
            [](const auto& x) {
              return scaled_dot_product_attention(x[0], x[1], x[2], x[3],
                                                  AttentionOptions{.scale = 0.5});
            }))
      .floating_only = true;
  // Rotary embeddings: positions [S] or [B, S] (an index input), or the rows' global indices.
  {
    const RopeConfig scaled{.theta = 500000.0, .scaling = RopeScaling{}};
    const RopeConfig half{.theta = 10000.0, .interleaved = false};
    OpRow& a = t.add(row("rotary_embedding", {{2, 6, 3, 8}, {6}},
                         [](const auto& x) { return rotary_embedding(x[0], x[1]); }));
    a.indices = {{1, 9000}};
    a.floating_only = true;
    OpRow& b = t.add(row("rotary_embedding [B, S] scaled", {{2, 5, 2, 8}, {2, 5}},
                         [scaled](const auto& x) { return rotary_embedding(x[0], x[1], scaled); }));
    b.indices = {{1, 20000}};
    b.floating_only = true;
    t.add(row("rotary_embedding rows half", {{6, 2, 4}}, [half](const auto& x) {
       return rotary_embedding(x[0], half);
     })).floating_only = true;
    t.add(row("rotary_embedding rows scaled", {{2, 7, 2, 8}}, [scaled](const auto& x) {
       return rotary_embedding(x[0], scaled);
     })).floating_only = true;
  }

  // ---- linear algebra ----
  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 6}, {6, 3}},
                                                            {{2, 5, 6}, {6, 3}},
                                                            {{6}, {6, 3}},
                                                            {{5, 6}, {6}},
                                                            {{6}, {6}},
                                                            {{2, 3, 4}, {2, 4, 5}},
                                                            {{2, 1, 3, 4}, {5, 4, 2}}}) {
    t.add(row("matmul", shapes, [](const auto& x) { return matmul(x[0], x[1]); }));
  }
  // matmul's weight gradient (Note [Folded weight gradient]): leading dims of 1, 2 and 3 dims.
  for (const auto& shapes : std::vector<std::vector<Shape>>{
           {{5, 6}, {5, 3}}, {{2, 5, 6}, {2, 5, 3}}, {{2, 3, 2, 4}, {2, 3, 2, 5}}}) {
    t.add(row("matmul_weight_grad", shapes, [](const auto& x) {
      using T = std::decay_t<decltype(x[0])>;
      return apply(op::matmul_weight_grad, {to_var(x[0]), to_var(x[1])}).template value<T>();
    }));
  }
  t.add(row("bmm", {{3, 4, 5}, {3, 5, 2}}, [](const auto& x) { return bmm(x[0], x[1]); }));
  // Float8 operands and f32 scales made from the row's data (Note [Scaled matmul]).
  OpRow& scaled = t.add(row("scaled_mm", {{5, 6}, {6, 3}, {}, {}}, [](const auto& x) {
    return scaled_mm(cast(x[0], DType::F8E4M3FN), cast(x[1], DType::F8E5M2), cast(x[2], DType::F32),
                     cast(x[3], DType::F32), DType::F32);
  }));
  scaled.floating_only = true;
  scaled.positive = true;
  scaled.no_derivative = true;
  for (const std::vector<Shape>& shapes :
       std::vector<std::vector<Shape>>{{{5, 6}, {6, 3}}, {{2, 3, 4}, {4, 5}}}) {
    OpRow& f8 = t.add(
        row("float8_matmul", shapes, [](const auto& x) { return float8_matmul(x[0], x[1]); }));
    f8.floating_only = true;
    f8.straight_through = true;
  }
  // The weight cast already (FSDP's float8 all-gather, Note [Float8 all-gather]): float8_mm with
  // a float8 b, the same values; b's cast has no gradient.
  OpRow& precast = t.add(row("float8_mm", {{5, 6}, {6, 3}}, [](const auto& x) {
    using T = std::decay_t<decltype(x[0])>;
    const Var amax = float8_amax(to_var(x[1]));
    return float8_matmul(to_var(x[0]), float8_cast(to_var(x[1]), amax), amax).template value<T>();
  }));
  precast.floating_only = true;
  precast.straight_through = true;
  // Groups of 2, 0 (an expert no token chose) and 5 rows.
  t.add(row("grouped_mm", {{7, 4}, {3, 4, 5}}, [](const auto& x) {
     return grouped_mm(x[0], x[1], from_vector<int64_t>({2, 0, 5}, {3}));
   })).floating_only = true;
  for (const Shape& c : std::vector<Shape>{{5, 3}, {3}, {5, 1}}) {
    t.add(row("addmm", {c, {5, 6}, {6, 3}}, [](const auto& x) {
       return addmm(x[0], x[1], x[2], 0.5, 2.0);
     })).floating_only = true;
  }

  // ---- reductions ----
  struct Red {
    Shape shape;
    std::vector<int64_t> dims;
    bool keep;
  };
  for (const Red& r : std::vector<Red>{{{5, 6}, {}, false},
                                       {{5, 6}, {0}, false},
                                       {{5, 6}, {1}, true},
                                       {{5, 6}, {-1, 0}, false},
                                       {{3, 4, 5}, {1}, false},
                                       {{3, 4, 5}, {0, 2}, true},
                                       {{8, 4}, {0}, false}}) {
    const auto dims = r.dims;
    const bool keep = r.keep;
    t.add(row("sum", {r.shape}, [=](const auto& x) { return sum(x[0], dims, keep); }));
    t.add(row("mean", {r.shape}, [=](const auto& x) {
       return mean(x[0], dims, keep);
     })).floating_only = true;
    t.add(row("amax", {r.shape}, [=](const auto& x) { return amax(x[0], dims, keep); }));
    t.add(row("amin", {r.shape}, [=](const auto& x) { return amin(x[0], dims, keep); }));
  }
  t.add(row("sum all", {{4, 3}}, [](const auto& x) { return sum(x[0]); }));
  // logsumexp, var, std, norm and prod (tests/ops/stats_test.cpp: against brute force).
  for (const Red& r :
       std::vector<Red>{{{5, 6}, {1}, false}, {{3, 4, 5}, {0, 2}, true}, {{4, 3}, {}, false}}) {
    const auto dims = r.dims;
    const bool keep = r.keep;
    t.add(row("logsumexp", {r.shape}, [=](const auto& x) { return logsumexp(x[0], dims, keep); }));
    t.add(row("var", {r.shape}, [=](const auto& x) {
       return var(x[0], dims, 1.0, keep);
     })).floating_only = true;
    t.add(row("std", {r.shape}, [=](const auto& x) {
       return std(x[0], dims, 0.0, keep);
     })).floating_only = true;
    t.add(row("prod", {r.shape}, [=](const auto& x) { return prod(x[0], dims, keep); }));
    for (double p : {2.0, 1.0, 3.0, 0.0, std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
      t.add(row(fmt::format("norm {}", p), {r.shape}, [=](const auto& x) {
         return norm(x[0], p, dims, keep);
       })).floating_only = true;
    }
  }

  // ---- softmax ----
  for (int64_t d : {0, 1, -1}) {
    t.add(row("softmax", {{5, 6}}, [d](const auto& x) { return softmax(x[0], d); })).floating_only =
        true;
    t.add(row("log_softmax", {{5, 6}}, [d](const auto& x) {
       return log_softmax(x[0], d);
     })).floating_only = true;
  }

  // ---- shapes, joining and padding ----
  t.add(row("transpose", {{5, 6, 3}}, [](const auto& x) { return transpose(x[0], 0, 2); }));
  t.add(row("transpose", {{5, 6}}, [](const auto& x) { return transpose(x[0], 1, -2); }));
  for (const auto& [from, to] : std::vector<std::pair<Shape, Shape>>{{{6, 4}, {24}},
                                                                     {{6, 4}, {2, 3, 4}},
                                                                     {{6, 4}, {3, 8}},
                                                                     {{6, 4}, {4, 6}},
                                                                     {{2, 3, 4}, {6, 4}},
                                                                     {{2, 3, 4}, {2, -1}},
                                                                     {{8, 4}, {32}},
                                                                     {{1, 5}, {5}},
                                                                     {{6}, {2, 3, 1}},
                                                                     {{5, 4}, {4, 5}}}) {
    const Shape target = to;
    t.add(row("reshape", {from}, [target](const auto& x) { return reshape(x[0], target); }));
  }
  for (int64_t d : {0, 1}) {
    t.add(row("cat", {{5, 4}, {3, 4}, {5, 4}}, [d](const auto& x) {
      return cat({x[0], x[2]}, d);
    }));
    t.add(row("stack", {{5, 4}, {5, 4}}, [d](const auto& x) { return stack({x[0], x[1]}, d); }));
  }
  t.add(row("cat", {{5, 4}, {3, 4}}, [](const auto& x) { return cat({x[0], x[1]}, 0); }));
  t.add(row("stack", {{5, 4}, {5, 4}, {5, 4}}, [](const auto& x) {
    return stack({x[0], x[1], x[2]}, 2);
  }));
  t.add(row("narrow", {{5, 4}}, [](const auto& x) { return narrow(x[0], 0, 1, 3); }));
  t.add(row("narrow", {{5, 4}}, [](const auto& x) { return narrow(x[0], -1, 2, 2); }));
  t.add(row("select", {{5, 4}}, [](const auto& x) { return select(x[0], 1, 2); }));
  t.add(row("select", {{5, 4, 3}}, [](const auto& x) { return select(x[0], 0, -1); }));
  t.add(row("permute", {{5, 4, 3}}, [](const auto& x) { return permute(x[0], {2, 0, 1}); }));
  t.add(row("unsqueeze", {{5, 4}}, [](const auto& x) { return unsqueeze(x[0], 1); }));
  t.add(row("squeeze", {{5, 1, 4}}, [](const auto& x) { return squeeze(x[0], 1); }));
  t.add(row("expand", {{5, 1}}, [](const auto& x) { return expand(x[0], {2, 5, 4}); }));
  t.add(row("clone", {{5, 4}}, [](const auto& x) { return clone(x[0]); }));
  t.add(row("to", {{5, 4}}, [](const auto& x) { return cast(x[0], DType::F64); }));
  t.add(
      row("contiguous", {{5, 4}}, [](const auto& x) { return contiguous(transpose(x[0], 0, 1)); }));
  t.add(row("flatten", {{2, 3, 4}}, [](const auto& x) { return flatten(x[0], 1, 2); }));
  t.add(row("view", {{6, 4}}, [](const auto& x) { return view(x[0], {2, 12}); }));
  t.add(row("split", {{5, 4}}, [](const auto& x) {
    const auto pieces = split(x[0], {2, 3}, 0);
    return cat({pieces[1], pieces[0]}, 0);
  }));
  t.add(row("chunk", {{5, 7}}, [](const auto& x) {
    const auto pieces = chunk(x[0], 3, 1);
    return cat({pieces[2], pieces[0], pieces[1]}, 1);
  }));
  t.add(row("repeat_interleave", {{4, 3}},
            [](const auto& x) { return repeat_interleave(x[0], 3, 0); }));
  t.add(row("repeat_interleave", {{2, 4, 3}},
            [](const auto& x) { return repeat_interleave(x[0], 2, -2); }));
  t.add(row("repeat_interleave", {{5, 2}},
            [](const auto& x) { return repeat_interleave(x[0], 2, 0); }));
  t.add(row("pad", {{5, 4}}, [](const auto& x) { return pad(x[0], 1, 2, 1, 0.0); }));
  t.add(row("pad", {{5, 4}}, [](const auto& x) { return pad(x[0], 0, 1, 0, 3.0); }));
  return t;
}

// ---- elementwise rows: the Tensor op against the per-element reference
// ---------------------------

DType expected_dtype(Kind kind, DType promoted) {
  if (kind == Kind::Compare) return DType::Bool;
  return kind == Kind::Floating && !is_floating(promoted) ? DType::F32 : promoted;
}

// Transcendentals round once in float (double for F64); gelu's 1 + erf(x) cancels for negative
// x, hence an absolute tolerance too.
std::pair<double, double> tolerance(Kind kind, DType dtype) {
  if (kind != Kind::Floating) return {0, 0};
  const double rtol = testing::transcendental_rtol(dtype);
  return {rtol, dtype == DType::F64 ? 1e-12 : std::max(rtol, 1e-6)};
}

TEST(OpTable, UnaryElementwiseOpsMatchTheirReferenceForEveryDTypeAndLayout) {
  Gen gen(4);
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    if (!r.unary_ref) continue;
    for (DType d : kArithmeticDTypes) {
      for (int trial = 0; trial < 6; ++trial) {
        const Shape shape = gen.shape(0, 4);
        const auto layout = gen.layout();
        const Tensor t = gen.tensor(shape, d, layout, r.positive);
        const std::string context =
            fmt::format("{}({} {} {})", r.name, d, shape_str(shape), layout_name(layout));
        if (r.kind == Kind::Numeric && d == DType::Bool) {
          expect_throws<Unsupported>([&] { r.on_tensor({t}); }, {r.name, "bool", shape_str(shape)});
          continue;
        }
        const DType want_dtype = expected_dtype(r.kind, d);
        const Tensor out = r.on_tensor({t});
        ASSERT_EQ(out.dtype(), want_dtype) << context;
        ASSERT_EQ(out.shape(), shape) << context;
        std::vector<double> want;
        for (double x : testing::values(t)) want.push_back(round_to(want_dtype, r.unary_ref(x)));
        const auto [rtol, atol] = tolerance(r.kind, want_dtype);
        expect_values(out, want, rtol, atol, context);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(OpTable, BinaryElementwiseOpsMatchTheirReferenceForEveryDTypePairAndLayout) {
  Gen gen(1);
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    if (!r.binary_ref || r.shapes[0] != r.shapes[1]) continue;  // one row per op
    for (DType da : kArithmeticDTypes) {
      for (DType db : kArithmeticDTypes) {
        for (int trial = 0; trial < 3; ++trial) {
          const Shape shape = gen.shape(0, 4);
          const Shape sa = gen.broadcastable_to(shape);
          const Shape sb = gen.broadcastable_to(shape);
          const auto la = gen.layout();
          const auto lb = gen.layout();
          const Tensor a = gen.tensor(sa, da, la, r.positive);
          const Tensor b = gen.tensor(sb, db, lb, r.positive);
          const std::string context =
              fmt::format("{}({} {} {}, {} {} {})", r.name, da, shape_str(sa), layout_name(la), db,
                          shape_str(sb), layout_name(lb));
          const DType want_dtype = expected_dtype(r.kind, promote_types(da, db));
          if (r.kind == Kind::Numeric && want_dtype == DType::Bool) {
            expect_throws<Unsupported>([&] { r.on_tensor({a, b}); }, {r.name, "bool"});
            continue;
          }
          const Tensor out = r.on_tensor({a, b});
          const Shape out_shape = testing::broadcast(sa, sb);
          ASSERT_EQ(out.shape(), out_shape) << context;
          ASSERT_EQ(out.dtype(), want_dtype) << context;
          ASSERT_TRUE(out.is_contiguous()) << context;
          std::vector<double> want;
          for (int64_t i = 0; i < out.numel(); ++i) {
            const auto index = testing::unravel(i, out_shape);
            double x = testing::element(a, testing::broadcast_index(index, sa));
            double y = testing::element(b, testing::broadcast_index(index, sb));
            if (r.kind == Kind::Compare) {  // both sides rounded to the dtype compared in
              x = round_to(promote_types(da, db), x);
              y = round_to(promote_types(da, db), y);
            }
            want.push_back(round_to(want_dtype, r.binary_ref(x, y)));
          }
          const auto [rtol, atol] = tolerance(r.kind, want_dtype);
          expect_values(out, want, rtol, atol, context);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 700);
}

// ---- every row: LocalTensor against Tensor, shard by shard --------------------------------------

// Input k of a row that is an index or a mask (else undefined).
Tensor special_input(const OpRow& r, size_t k, uint64_t seed) {
  const Shape& shape = r.shapes[k];
  if (auto it = r.indices.find(k); it != r.indices.end()) {
    return call(op::to_dtype, {rand(shape, seed, DType::F64) * static_cast<double>(it->second)},
                {{static_cast<int64_t>(DType::I64)}, {}});
  }
  if (r.masks.count(k) != 0) return lt(rand(shape, seed, DType::F64), full({}, 0.5, DType::F64));
  return Tensor();
}

bool is_data(const OpRow& r, size_t k) {
  return r.indices.count(k) == 0 && r.masks.count(k) == 0;
}

Tensor row_input(const OpRow& r, size_t k, uint64_t seed, DType dtype) {
  if (!is_data(r, k)) return special_input(r, k, seed);
  Tensor g = testing::int_valued(r.shapes[k], seed, dtype);
  return r.positive ? abs(g) + 1.0 : g;
}

TEST(OpTable, LocalTensorOpsEqualTheTensorOpOnEveryShard) {
  World world = World::sim(3);
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    SCOPED_TRACE(r.name);
    std::vector<LocalTensor> per_rank;
    std::vector<LocalTensor> replicated;
    for (size_t k = 0; k < r.shapes.size(); ++k) {
      per_rank.push_back(LocalTensor::from_fn(world, [&](int rank) {
        return row_input(r, k, 100 * k + static_cast<uint64_t>(rank), DType::F32);
      }));
      replicated.push_back(LocalTensor::replicate(world, row_input(r, k, 7 + k, DType::F32)));
    }
    const LocalTensor got = r.on_local(per_rank);
    ASSERT_EQ(got.ranks(), world.held_ranks());
    for (int rank : world.held_ranks()) {
      std::vector<Tensor> shards;
      for (const LocalTensor& t : per_rank) shards.push_back(t.shard(rank));
      EXPECT_TRUE(equal(got.shard(rank), r.on_tensor(shards))) << "rank " << rank;
    }
    const LocalTensor once = r.on_local(replicated);
    EXPECT_TRUE(once.is_replicated());
    std::vector<Tensor> values;
    for (const LocalTensor& t : replicated) values.push_back(t.shard(0));
    EXPECT_TRUE(equal(once.shard(2), r.on_tensor(values)));
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// ---- every row: DTensor against Tensor on the full tensors --------------------------------------

// The mesh shapes ops run on.
const std::vector<std::vector<int64_t>> kMeshes = {{4}, {3}, {2, 2}, {2, 3}, {1, 2}, {2, 2, 2}};

void check_dtensor_rows(DType dtype, uint64_t seed) {
  World world = testing::test_world(64);
  std::mt19937_64 rng(seed);
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    if (dtype != DType::F32 && r.floating_only) continue;
    for (const auto& mesh_shape : kMeshes) {
      auto mesh = testing::try_mesh(world, mesh_shape);
      if (!mesh) continue;
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<Tensor> globals;
        std::vector<DTensor> inputs;
        std::string placements_text;
        for (size_t k = 0; k < r.shapes.size(); ++k) {
          const Shape& shape = r.shapes[k];
          const Tensor g = row_input(r, k, rng() % 10000, dtype);
          const Placements kinds = testing::all_placement_kinds(static_cast<int>(shape.size()));
          Placements p;
          for (size_t i = 0; i < mesh_shape.size(); ++i) {
            // Partials a third of the time (data only), each kind otherwise equally likely.
            const size_t n_plain = shape.size() + 1;
            // (Integer Partial(product) pieces of a known decomposition would not be integers.)
            const size_t n_partial = dtype == DType::F32 ? 5 : 4;
            p.push_back(rng() % 3 == 0 && is_data(r, k) ? kinds[n_plain + rng() % n_partial]
                                                        : kinds[rng() % n_plain]);
          }
          placements_text += " " + to_string(p);
          globals.push_back(g);
          inputs.push_back(testing::make_dtensor(g, *mesh, p, rng()));
        }
        SCOPED_TRACE(
            fmt::format("{} {} on {} with{}", r.name, dtype, mesh->to_string(), placements_text));
        const Tensor expected = r.on_tensor(globals);
        const DTensor out = r.on_dtensor(inputs);
        EXPECT_EQ(out.shape(), expected.shape());
        EXPECT_EQ(out.dtype(), expected.dtype());
        EXPECT_TRUE(testing::pieces_match(out, expected, 1e-4));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(OpTable, DTensorOpsMatchFullTensorOpsUnderRandomPlacements) {
  check_dtensor_rows(DType::F32, 42);
}

// Integer data: exact, and an integer Partial(avg) (which truncates) is never kept by an op.
TEST(OpTable, DTensorOpsMatchFullTensorOpsOnIntegers) {
  check_dtensor_rows(DType::I64, 43);
}

// ---- gradients: every row's Tensor backward against central finite differences (F64) ------------

// Random non-integer data (no ties or kinks: relu, abs, maximum and amax are smooth there), or the
// row's index or mask input.
Tensor smooth_input(const OpRow& r, size_t k, uint64_t seed) {
  if (!is_data(r, k)) return special_input(r, k, seed);
  Tensor g = randn(r.shapes[k], seed, DType::F64);
  return r.positive ? abs(g) + 0.5 : g;
}

// `t` marked as a leaf when it is data.
Tensor leaf(const OpRow& r, size_t k, Tensor t) {
  if (is_data(r, k)) t.requires_grad_();
  return t;
}

// sum(out * w): a scalar whose gradient is w pushed back through the op.
Tensor weighted_loss(const Tensor& out, const Tensor& w) {
  return sum(out * w);
}

TEST(OpTable, TensorGradientsMatchFiniteDifferences) {
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    SCOPED_TRACE(r.name);
    std::vector<Tensor> inputs;
    for (size_t k = 0; k < r.shapes.size(); ++k) {
      inputs.push_back(leaf(r, k, smooth_input(r, k, 50 + k)));
    }
    const Tensor out = r.on_tensor(inputs);
    if (!is_floating(out.dtype()) || r.no_derivative || r.straight_through) continue;
    const Tensor w = randn(out.shape(), 99, DType::F64);
    backward(weighted_loss(out, w));
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!is_data(r, k)) continue;
      // An input the op does not use gets no gradient: zeros.
      const Tensor grad =
          inputs[k].grad().defined() ? inputs[k].grad() : zeros(inputs[k].shape(), DType::F64);
      ASSERT_EQ(grad.shape(), inputs[k].shape()) << "input " << k;
      const std::vector<double> got = testing::values(grad);
      const double h = 1e-6;
      for (int64_t i = 0; i < inputs[k].numel(); ++i) {
        auto loss_at = [&](double delta) {
          NoGradGuard no_grad;
          std::vector<Tensor> shifted;
          for (size_t j = 0; j < inputs.size(); ++j) shifted.push_back(inputs[j].detach().clone());
          Tensor flat = shifted[k].reshape({-1});
          flat.narrow(0, i, 1).fill_(testing::values(inputs[k])[static_cast<size_t>(i)] + delta);
          return weighted_loss(r.on_tensor(shifted), w).item<double>();
        };
        const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
        EXPECT_NEAR(got[static_cast<size_t>(i)], numeric, 1e-5 * (1 + std::abs(numeric)))
            << "input " << k << " element " << i;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// x^0 is 1 everywhere, so its derivative is 0 everywhere, also at x = 0 (k x^(k-1) there is
// 0 * inf = NaN; PyTorch's pow_backward returns zeros): the scalar and the tensor exponent forms.
TEST(OpTable, PowWithExponentZeroHasAZeroGradientAtZero) {
  const Tensor base = from_vector<double>({0.0, 1.0, -2.0, 3.5}, {4});
  Tensor x = base.clone();
  x.requires_grad_();
  backward(sum(pow(x, 0.0)));
  EXPECT_TRUE(equal(x.grad(), zeros({4}, DType::F64))) << x.grad();
  Tensor y = base.clone();
  Tensor k = zeros({4}, DType::F64);
  y.requires_grad_();
  k.requires_grad_();
  backward(sum(pow(y, k)));
  EXPECT_TRUE(equal(y.grad(), zeros({4}, DType::F64))) << y.grad();
  // d(x^k)/dk = x^k log x: 0 at x = 0 (the limit), log x elsewhere (NaN for x < 0, as torch).
  const std::vector<double> dk = testing::values(k.grad());
  EXPECT_EQ(dk[0], 0.0);
  EXPECT_EQ(dk[1], 0.0);
  EXPECT_TRUE(std::isnan(dk[2]));
  EXPECT_NEAR(dk[3], std::log(3.5), 1e-12);
}

// torch.clamp's subgradient 1 at the bounds (pytorch/pytorch#7049), 0 outside and at NaN, and 0
// everywhere when min > max (no x lies in [min, max], though x == max is left unchanged).
TEST(OpTable, ClampGradientPassesInsideTheBoundsIncludingThem) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor base = from_vector<double>({-1.0, 0.0, 2.0, 3.0, -2.0, nan}, {6});
  struct Case {
    std::optional<double> min, max;
    std::vector<double> values, grad;
  };
  for (const Case& c : std::vector<Case>{
           {-1.0, 2.0, {-1, 0, 2, 2, -1, nan}, {1, 1, 1, 0, 0, 0}},
           {-1.0, std::nullopt, {-1, 0, 2, 3, -1, nan}, {1, 1, 1, 1, 0, 0}},
           {std::nullopt, 2.0, {-1, 0, 2, 2, -2, nan}, {1, 1, 1, 0, 1, 0}},
           {2.0, -1.0, {-1, -1, -1, -1, -1, nan}, {0, 0, 0, 0, 0, 0}},
       }) {
    SCOPED_TRACE(fmt::format("clamp({}, {})", c.min ? fmt::format("{}", *c.min) : "none",
                             c.max ? fmt::format("{}", *c.max) : "none"));
    Tensor x = base.clone();
    x.requires_grad_();
    const Tensor y = clamp(x, c.min, c.max);
    expect_values(y, c.values, 0, 0, "clamp");
    backward(sum(y));
    EXPECT_TRUE(equal(x.grad(), from_vector<double>(c.grad, {6}))) << x.grad();
  }
  // A NaN bound makes every element NaN.
  for (double v : testing::values(clamp(base, nan, 2.0))) EXPECT_TRUE(std::isnan(v));
  expect_throws<ConfigError>([&] { clamp(base, std::nullopt, std::nullopt); },
                             {"clamp", "at least one of min and max", "[6]"});
  expect_throws<Unsupported>([&] { clamp(ones({3}, DType::Bool), 0.0, 1.0); },
                             {"clamp", "bool", "[3]"});
  expect_throws<Unsupported>([&] { clamp(ones({3}, DType::I32), 1e10); }, {"clamp", "i32"});
}

// Note [Folded weight gradient]: the weight gradient of matmul(x, w) for x of 3 and 4 dims is
// one matmul_weight_grad (no batched product and sum), equal to the brute-force sum over the
// leading positions, for a contiguous x and a transposed one (copied to fold); and its errors.
TEST(OpTable, MatmulWeightGradientIsOneProductOverTheLeadingPositions) {
  for (const bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "x transposed" : "x contiguous");
    Tensor leaf = randn({2, 3, 4, 5}, 11, DType::F64).requires_grad_();
    const Tensor x = transposed ? leaf.transpose(1, 2) : leaf;  // [2, 4, 3, 5] when transposed
    Tensor wg = randn({5, 6}, 12, DType::F64).requires_grad_();
    Shape out_shape = x.shape();
    out_shape.back() = 6;
    const Tensor g = randn(out_shape, 13, DType::F64);
    backward(matmul(x, wg), g);
    {
      // The ops its backward runs (op observers see DTensor ops).
      World world = World::sim(2);
      const DeviceMesh mesh = *testing::try_mesh(world, {2});
      const Placements replicate{Replicate{}};
      DTensor dleaf = distribute_tensor(leaf.detach(), mesh, replicate).requires_grad_();
      DTensor dw = distribute_tensor(wg.detach(), mesh, replicate).requires_grad_();
      const DTensor dy = matmul(transposed ? transpose(dleaf, 1, 2) : dleaf, dw);
      std::vector<std::string> ran;
      const int observer =
          add_op_observer([&](const OpEvent& e) { ran.emplace_back(e.def->name); });
      backward(dy, distribute_tensor(g, mesh, replicate));
      remove_op_observer(observer);
      EXPECT_EQ(std::count(ran.begin(), ran.end(), "matmul_weight_grad"), 1);
      EXPECT_EQ(std::count(ran.begin(), ran.end(), "sum"), 0);
      EXPECT_LE(max_abs_diff(dw.grad().full_tensor(), wg.grad()), 0.0);
    }
    const std::vector<double> xs = testing::values(x.contiguous()), gs = testing::values(g);
    std::vector<double> expected(30, 0.0);
    for (int64_t p = 0; p < 24; ++p) {
      for (int64_t k = 0; k < 5; ++k) {
        for (int64_t m = 0; m < 6; ++m) {
          expected[static_cast<size_t>(k * 6 + m)] +=
              xs[static_cast<size_t>(p * 5 + k)] * gs[static_cast<size_t>(p * 6 + m)];
        }
      }
    }
    expect_values(wg.grad(), expected, 1e-12, 1e-12, "matmul's weight gradient");
  }
  expect_throws<ShapeError>(
      [] {
        call(op::matmul_weight_grad, {ones({2, 3, 4}), ones({2, 4, 5})});
      },
      {"matmul_weight_grad", "same leading dims", "[2, 3, 4]", "[2, 4, 5]"});
  expect_throws<ShapeError>(
      [] {
        call(op::matmul_weight_grad, {ones({4}), ones({4})});
      },
      {"matmul_weight_grad", "[4]"});
}

// grouped_mm against a brute-force triple loop, its gradients against the per-group matmuls'
// (a group of no rows gets a zero weight gradient), and its errors.
TEST(OpTable, GroupedMatmulMultipliesEachGroupByItsWeight) {
  const std::vector<int64_t> sizes{3, 0, 1, 4};
  const Tensor x = randn({8, 5}, 7, DType::F64);
  const Tensor w = randn({4, 5, 3}, 8, DType::F64);
  const Tensor y = grouped_mm(x, w, from_vector(sizes, {4}));
  ASSERT_EQ(y.shape(), (Shape{8, 3}));
  const std::vector<double> xv = testing::values(x), wv = testing::values(w);
  std::vector<double> expected;
  int64_t group = 0, left = sizes[0];
  for (int64_t i = 0; i < 8; ++i) {
    while (left == 0) left = sizes[static_cast<size_t>(++group)];
    --left;
    for (int64_t j = 0; j < 3; ++j) {
      double v = 0.0;
      for (int64_t k = 0; k < 5; ++k) {
        v += xv[static_cast<size_t>(i * 5 + k)] * wv[static_cast<size_t>((group * 5 + k) * 3 + j)];
      }
      expected.push_back(v);
    }
  }
  expect_values(y, expected, 1e-12, 1e-12, "grouped_mm");

  Tensor xg = x.clone().requires_grad_();
  Tensor wg = w.clone().requires_grad_();
  const Tensor g = randn({8, 3}, 9, DType::F64);
  backward(grouped_mm(xg, wg, from_vector(sizes, {4})), g);
  Tensor xr = x.clone().requires_grad_();
  Tensor wr = w.clone().requires_grad_();
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t e = 0; e < 4; ++e) {
    const int64_t n = sizes[static_cast<size_t>(e)];
    if (n > 0) parts.push_back(matmul(xr.narrow(0, start, n), wr.select(0, e)));
    start += n;
  }
  backward(cat(parts, 0), g);
  EXPECT_LE(max_abs_diff(xg.grad(), xr.grad()), 1e-12);
  EXPECT_LE(max_abs_diff(wg.grad().narrow(0, 0, 1), wr.grad().narrow(0, 0, 1)), 1e-12);
  EXPECT_TRUE(equal(wg.grad().select(0, 1), zeros({5, 3}, DType::F64)));
  EXPECT_LE(max_abs_diff(wg.grad().narrow(0, 2, 2), wr.grad().narrow(0, 2, 2)), 1e-12);

  expect_throws<ShapeError>(
      [&] {
        grouped_mm(x, w, from_vector<int64_t>({3, 0, 1, 3}, {4}));
      },
      {"grouped_mm", "add up to 7", "8 rows"});
  expect_throws<ShapeError>(
      [&] {
        grouped_mm(x, w, from_vector<int64_t>({9, -1, 0, 0}, {4}));
      },
      {"grouped_mm", "negative size -1"});
  expect_throws<ShapeError>([&] { grouped_mm(x, w, from_vector<int64_t>({8}, {1})); },
                            {"grouped_mm", "one count per group (4)", "[1]"});
  expect_throws<ShapeError>(
      [&] {
        grouped_mm(x, randn({4, 6, 3}, 1), from_vector(sizes, {4}));
      },
      {"grouped_mm", "[8, 5]", "[4, 6, 3]"});
  expect_throws<Unsupported>([&] { grouped_mm(x, w, ones({4}, DType::F32)); },
                             {"grouped_mm", "integer"});
}

// clamp and expm1 are non-decreasing: P(max) and P(min) pass with no communication; reciprocal
// (as every other nonlinear op) takes a Partial input reduced first.
TEST(OpTable, NonDecreasingOpsKeepPartialMaxAndMin) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const Tensor g = randn({5, 4}, 8, DType::F64);
  for (ReduceOp q : {ReduceOp::Max, ReduceOp::Min}) {
    const DTensor x = testing::make_dtensor(g, mesh, {Partial{q}}, 9);
    const DTensor c = clamp(x, -0.5, 0.5);
    EXPECT_EQ(c.placements(), Placements{Partial{q}});
    EXPECT_TRUE(testing::pieces_match(c, clamp(g, -0.5, 0.5), 1e-12));
    const DTensor e = expm1(x);
    EXPECT_EQ(e.placements(), Placements{Partial{q}});
    EXPECT_TRUE(testing::pieces_match(e, expm1(g), 1e-12));
  }
  const DTensor s = testing::make_dtensor(abs(g) + 1.0, mesh, {Partial{}}, 10);
  const DTensor r = reciprocal(s);
  EXPECT_EQ(r.placements(), Placements{Replicate{}});
  EXPECT_TRUE(testing::pieces_match(r, reciprocal(abs(g) + 1.0), 1e-12));
}

// ---- attention with GQA and masks ----

// torch's math: query head h uses kv head h / (H / Hkv); a Bool mask hides false keys, a floating
// one is added; element by element in double. q [B, H, Sq, D], k/v [B, Hkv, Sk, D|Dv], mask
// [Sq, Sk] (mask(i, j) or null).
std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        double scale, bool causal,
                                        const std::function<double(int64_t, int64_t)>& mask) {
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const int64_t heads = qs[1], group = qs[1] / ks[1], sq = qs[2], sk = ks[2], dh = qs[3];
  const int64_t dv = v.shape()[3];
  const std::vector<double> qv = testing::values(q), kv = testing::values(k),
                            vv = testing::values(v);
  std::vector<double> out;
  for (int64_t b = 0; b < qs[0]; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> w(static_cast<size_t>(sk));
        double top = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double s = 0;
          for (int64_t d = 0; d < dh; ++d) {
            s += qv[static_cast<size_t>(((b * heads + h) * sq + i) * dh + d)] *
                 kv[static_cast<size_t>(((b * ks[1] + hk) * sk + j) * dh + d)];
          }
          s *= scale;
          if (causal && j > i) s = -INFINITY;
          if (mask) s += mask(i, j);
          w[static_cast<size_t>(j)] = s;
          top = std::max(top, s);
        }
        double total = 0;
        for (double& x : w) total += (x = std::exp(x - top));
        for (int64_t e = 0; e < dv; ++e) {
          double o = 0;
          for (int64_t j = 0; j < sk; ++j) {
            o += w[static_cast<size_t>(j)] / total *
                 vv[static_cast<size_t>(((b * ks[1] + hk) * sk + j) * dv + e)];
          }
          out.push_back(o);
        }
      }
    }
  }
  return out;
}

TEST(OpTable, AttentionWithGqaAndMasksMatchesAnElementwiseReference) {
  const Tensor q = randn({2, 6, 4, 3}, 21, DType::F64);
  const Tensor k = randn({2, 2, 5, 3}, 22, DType::F64);
  const Tensor v = randn({2, 2, 5, 2}, 23, DType::F64);
  const double scale = 1 / std::sqrt(3.0);
  const AttentionOptions gqa{.enable_gqa = true};
  expect_values(scaled_dot_product_attention(q, k, v, gqa),
                reference_attention(q, k, v, scale, false, nullptr), 1e-12, 1e-12, "gqa");
  expect_values(scaled_dot_product_attention(q, k, v, {.causal = true, .enable_gqa = true}),
                reference_attention(q, k, v, scale, true, nullptr), 1e-12, 1e-12, "gqa causal");
  // A Bool mask: true attends (key 0 always, so no row is empty).
  std::vector<bool> keep(20);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = i % 5 == 0 || (i * 7) % 3 == 1;
  const Tensor bool_mask = from_vector(keep, {4, 5});
  expect_values(scaled_dot_product_attention(q, k, v, bool_mask, gqa),
                reference_attention(q, k, v, scale, false,
                                    [&](int64_t i, int64_t j) {
                                      return keep[static_cast<size_t>(i * 5 + j)] ? 0.0 : -INFINITY;
                                    }),
                1e-12, 1e-12, "gqa bool mask");
  const Tensor float_mask = randn({4, 5}, 24, DType::F64);
  const std::vector<double> fm = testing::values(float_mask);
  expect_values(
      scaled_dot_product_attention(q, k, v, float_mask, {.scale = 0.3, .enable_gqa = true}),
      reference_attention(q, k, v, 0.3, false,
                          [&](int64_t i, int64_t j) { return fm[static_cast<size_t>(i * 5 + j)]; }),
      1e-12, 1e-12, "gqa float mask");
  // Without GQA the old overload and the options agree.
  const Tensor k6 = randn({2, 6, 5, 3}, 25, DType::F64);
  const Tensor v6 = randn({2, 6, 5, 2}, 26, DType::F64);
  EXPECT_TRUE(equal(scaled_dot_product_attention(q, k6, v6, true, 0.4),
                    scaled_dot_product_attention(q, k6, v6, {.causal = true, .scale = 0.4})));
  // The gradients against the same attention on k and v repeated per query head (autograd through
  // repeat_interleave and the plain attention), the float mask's included.
  Tensor lq = q.clone(), lk = k.clone(), lv = v.clone(), lm = float_mask.clone();
  Tensor rq = q.clone(), rk = k.clone(), rv = v.clone(), rm = float_mask.clone();
  for (Tensor* t : {&lq, &lk, &lv, &lm, &rq, &rk, &rv, &rm}) t->requires_grad_();
  const Tensor w = randn({2, 6, 4, 2}, 27, DType::F64);
  backward(sum(scaled_dot_product_attention(lq, lk, lv, lm, gqa) * w));
  backward(sum(scaled_dot_product_attention(rq, repeat_interleave(rk, 3, 1),
                                            repeat_interleave(rv, 3, 1), rm) *
               w));
  for (auto [got, want] : {std::pair{&lq, &rq}, {&lk, &rk}, {&lv, &rv}, {&lm, &rm}}) {
    EXPECT_TRUE(allclose(got->grad(), want->grad(), 1e-12, 1e-12))
        << got->grad() << " vs " << want->grad();
  }
  // Errors name the op and the shapes.
  expect_throws<ShapeError>([&] { scaled_dot_product_attention(q, k, v, AttentionOptions{}); },
                            {"scaled_dot_product_attention", "[2, 6, 4, 3]", "[2, 2, 5, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scaled_dot_product_attention(q, randn({2, 4, 5, 3}, 1, DType::F64),
                                     randn({2, 4, 5, 2}, 1, DType::F64), gqa);
      },
      {"scaled_dot_product_attention", "enable_gqa", "[2, 4, 5, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scaled_dot_product_attention(q, k, v, ones({3, 5}, DType::Bool), gqa);
      },
      {"scaled_dot_product_attention", "mask [3, 5]", "[2, 6, 4, 5]"});
  expect_throws<Unsupported>(
      [&] {
        scaled_dot_product_attention(q, k, v, ones({4, 5}, DType::I64), gqa);
      },
      {"scaled_dot_product_attention", "Bool or floating", "i64"});
  expect_throws<ConfigError>(
      [&] {
        scaled_dot_product_attention(q, k, v, bool_mask, {.causal = true, .enable_gqa = true});
      },
      {"scaled_dot_product_attention", "causal"});
}

// Note [Blocked attention]: shapes that span several query blocks (64 rows) and key blocks (128
// keys), GQA, causal with fewer queries than keys, a Bool mask with a row that hides every key, a
// floating mask: the forward against the elementwise reference, and the gradients of q, k and v
// against autograd through the composed math (matmul, softmax, repeat_interleave), in F64 and
// F32. Then the same attention as DTensors: no op of forward or backward makes a tensor of the
// scores' size, and the backward runs attention_grad (dk and dv in one call), not the
// probabilities.
TEST(OpTable, BlockedAttentionMatchesTheComposedMathWithoutAScoresBuffer) {
  const int64_t sq = 150, sk = 300, d = 8, dv = 6;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<bool> keep(static_cast<size_t>(sq * sk)), hidden(keep.size()), later(keep.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    keep[i] = (i * 7919) % 5 != 0 || i % static_cast<size_t>(sk) == 0;
    hidden[i] = !keep[i];
    later[i] = static_cast<int64_t>(i) % sk > static_cast<int64_t>(i) / sk;
  }
  const Tensor bool_mask = from_vector(keep, {sq, sk});
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype == DType::F64 ? "f64" : "f32");
    const double tol = dtype == DType::F64 ? 1e-12 : 2e-5;
    const Tensor q = randn({2, 4, sq, d}, 31, dtype);
    const Tensor k = randn({2, 2, sk, d}, 32, dtype);
    const Tensor v = randn({2, 2, sk, dv}, 33, dtype);
    const Tensor float_mask = randn({sq, sk}, 34, dtype);
    const std::vector<double> fm = testing::values(float_mask);
    struct Case {
      std::string name;
      bool causal;
      const Tensor* mask;
      std::function<double(int64_t, int64_t)> reference_mask;
    };
    const std::vector<Case> cases = {
        {"plain", false, nullptr, nullptr},
        {"causal", true, nullptr, nullptr},
        {"bool mask", false, &bool_mask,
         [&](int64_t i, int64_t j) {
           return keep[static_cast<size_t>(i * sk + j)] ? 0.0 : -INFINITY;
         }},
        {"float mask", false, &float_mask,
         [&](int64_t i, int64_t j) { return fm[static_cast<size_t>(i * sk + j)]; }}};
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const AttentionOptions o{.causal = c.causal, .enable_gqa = true};
      Tensor lq = q.clone(), lk = k.clone(), lv = v.clone();
      for (Tensor* t : {&lq, &lk, &lv}) t->requires_grad_();
      const Tensor out = c.mask != nullptr ? scaled_dot_product_attention(lq, lk, lv, *c.mask, o)
                                           : scaled_dot_product_attention(lq, lk, lv, o);
      expect_values(out,
                    reference_attention(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), scale,
                                        c.causal, c.reference_mask),
                    tol, tol, c.name);
      // The gradients against autograd through the composed math.
      const Tensor w = randn(out.shape(), 35, dtype);
      backward(sum(out * w));
      Tensor rq = q.clone(), rk = k.clone(), rv = v.clone();
      for (Tensor* t : {&rq, &rk, &rv}) t->requires_grad_();
      Tensor scores = matmul(rq, repeat_interleave(rk, 2, 1).transpose(-1, -2)) * scale;
      if (c.causal) scores = masked_fill(scores, from_vector(later, {sq, sk}), -INFINITY);
      if (c.mask == &bool_mask) {
        scores = masked_fill(scores, from_vector(hidden, {sq, sk}), -INFINITY);
      }
      if (c.mask == &float_mask) scores = scores + float_mask;
      backward(sum(matmul(softmax(scores, -1), repeat_interleave(rv, 2, 1)) * w));
      for (auto [got, want, name] :
           {std::tuple{&lq, &rq, "dq"}, {&lk, &rk, "dk"}, {&lv, &rv, "dv"}}) {
        const Tensor a = got->grad();
        const Tensor b = want->grad();
        EXPECT_TRUE(allclose(a, b, tol, tol)) << name << ": max diff " << max_abs_diff(a, b);
      }
    }
    // A row whose every key the mask hides is NaN, as softmax over no key is.
    std::vector<bool> none = keep;
    for (int64_t j = 0; j < sk; ++j) none[static_cast<size_t>(70 * sk + j)] = false;
    const std::vector<double> empty_row = testing::values(scaled_dot_product_attention(
        q, k, v, from_vector(none, {sq, sk}), AttentionOptions{.enable_gqa = true}));
    for (size_t i = 0; i < empty_row.size(); ++i) {
      ASSERT_EQ(std::isnan(empty_row[i]), (i / dv) % sq == 70) << i;
    }
  }
  // No keys at all: the empty sum p v, zeros, and a zero query gradient.
  {
    Tensor q = randn({1, 2, 3, 4}, 49, DType::F64).requires_grad_();
    const Tensor none = scaled_dot_product_attention(q, zeros({1, 2, 0, 4}, DType::F64),
                                                     zeros({1, 2, 0, 5}, DType::F64));
    EXPECT_TRUE(equal(none, zeros({1, 2, 3, 5}, DType::F64))) << none;
    backward(sum(none));
    EXPECT_TRUE(equal(q.grad(), zeros({1, 2, 3, 4}, DType::F64))) << q.grad();
  }
  // BF16 has no blocked kernel: attention and attention_grad compose it (the S^2 path), which
  // agrees with the F32 kernel to BF16's precision.
  {
    const Tensor q = randn({1, 2, 40, 8}, 41, DType::F32);
    const Tensor k = randn({1, 2, 50, 8}, 42, DType::F32);
    const Tensor v = randn({1, 2, 50, 4}, 43, DType::F32);
    const Tensor w = randn({1, 2, 40, 4}, 44, DType::F32);
    std::vector<Tensor> wide = {q.clone(), k.clone(), v.clone()};
    std::vector<Tensor> narrow = {q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16)};
    for (Tensor& t : wide) t.requires_grad_();
    for (Tensor& t : narrow) t.requires_grad_();
    const Tensor a = scaled_dot_product_attention(wide[0], wide[1], wide[2], true);
    const Tensor b = scaled_dot_product_attention(narrow[0], narrow[1], narrow[2], true);
    EXPECT_EQ(b.dtype(), DType::BF16);
    EXPECT_TRUE(allclose(b.to(DType::F32), a, 3e-2, 3e-2)) << max_abs_diff(b.to(DType::F32), a);
    backward(sum(a * w));
    backward(sum(b * w.to(DType::BF16)));
    for (size_t i = 0; i < 3; ++i) {
      const Tensor g = narrow[i].grad().to(DType::F32);
      EXPECT_TRUE(allclose(g, wide[i].grad(), 5e-2, 5e-2))
          << i << ": " << max_abs_diff(g, wide[i].grad());
    }
  }
  // attention_grad's own inputs: the gradient asked for, and the output gradient's shape.
  {
    const Tensor q = randn({2, 4, 3}, 45, DType::F64);
    const Tensor k = randn({2, 5, 3}, 46, DType::F64);
    const Tensor v = randn({2, 5, 2}, 47, DType::F64);
    const Tensor g = randn({2, 4, 2}, 48, DType::F64);
    expect_throws<ConfigError>(
        [&] {
          call(op::attention_grad, {q, k, v, g}, {{0, 0, 0, 7}, {0.5}});
        },
        {"attention_grad", "which gradient", "7"});
    expect_throws<ShapeError>(
        [&] {
          call(op::attention_grad, {q, k, v, q}, {{0, 0, 0, 0}, {0.5}});
        },
        {"attention_grad", "gradient", "[2, 4, 2]", "[2, 4, 3]"});
    EXPECT_EQ(call(op::attention_grad, {q, k, v, g}, {{0, 0, 0, 1}, {0.5}}).shape(),
              (Shape{2, 5, 5}));  // dk and dv side by side
  }
  // As DTensors (replicated on 2 ranks): the ops' outputs, forward and backward.
  World world = World::sim(2);
  const DeviceMesh mesh = *testing::try_mesh(world, {2});
  const Placements r{Replicate{}};
  std::vector<std::string> ran;
  int64_t largest = 0;
  const int observer = add_op_observer([&](const OpEvent& e) {
    ran.emplace_back(e.op);
    largest = std::max(largest, e.output.to_local().shard(0).numel());
  });
  DTensor q = distribute_tensor(randn({1, 4, sq, d}, 36, DType::F64), mesh, r).requires_grad_();
  DTensor k = distribute_tensor(randn({1, 2, sk, d}, 37, DType::F64), mesh, r).requires_grad_();
  DTensor v = distribute_tensor(randn({1, 2, sk, dv}, 38, DType::F64), mesh, r).requires_grad_();
  backward(sum(
      scaled_dot_product_attention(q, k, v, AttentionOptions{.causal = true, .enable_gqa = true})));
  remove_op_observer(observer);
  EXPECT_LT(largest, sq * sk) << "an op made a tensor of the scores' size";
  EXPECT_EQ(std::count(ran.begin(), ran.end(), "attention_grad"), 2);  // dq, then dk and dv
  EXPECT_EQ(std::count(ran.begin(), ran.end(), "attention_probs"), 0);
}

// GQA under tensor parallelism: 8 query heads over 4 ranks with 2 kv heads (fewer than the ranks)
// run with q's heads sharded and k, v whole, each piece picking the kv heads of its global query
// heads; with 4 kv heads all three shard alike. The query rows shard with a mask sharded alike
// (context parallelism). Forward and gradients against the Tensor op.
TEST(OpTable, AttentionWithGqaShardsQueryHeadsAndRows) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  std::vector<bool> keep(48);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = i % 8 == 0 || (i * 5) % 3 != 0;
  const Tensor mask = from_vector(keep, {6, 8});
  for (int64_t kv_heads : {2, 4}) {
    const Tensor q = randn({2, 8, 6, 4}, 31, DType::F64);
    const Tensor k = randn({2, kv_heads, 8, 4}, 32, DType::F64);
    const Tensor v = randn({2, kv_heads, 8, 3}, 33, DType::F64);
    const Tensor w = randn({2, 8, 6, 3}, 34, DType::F64);
    for (bool rows : {false, true}) {
      SCOPED_TRACE(fmt::format("{} kv heads, {}", kv_heads, rows ? "rows" : "heads"));
      const Placements qp{Shard{rows ? 2 : 1}};
      const Placements kvp{rows ? Placement{Replicate{}} : Placement{Shard{1}}};
      DTensor dq = testing::make_dtensor(q, mesh, qp, 1);
      DTensor dk = testing::make_dtensor(k, mesh, kvp, 2);
      DTensor dv = testing::make_dtensor(v, mesh, kvp, 3);
      const DTensor dm = testing::make_dtensor(
          mask, mesh, {rows ? Placement{Shard{0}} : Placement{Replicate{}}}, 4);
      for (DTensor* t : {&dq, &dk, &dv}) t->requires_grad_();
      const AttentionOptions gqa{.enable_gqa = true};
      const DTensor out = scaled_dot_product_attention(dq, dk, dv, dm, gqa);
      EXPECT_EQ(out.placements(), qp);
      Tensor lq = q.clone(), lk = k.clone(), lv = v.clone();
      for (Tensor* t : {&lq, &lk, &lv}) t->requires_grad_();
      const Tensor want = scaled_dot_product_attention(lq, lk, lv, mask, gqa);
      EXPECT_TRUE(testing::pieces_match(out, want, 1e-12));
      backward(out, testing::make_dtensor(w, mesh, qp, 5));
      backward(sum(want * w));
      EXPECT_TRUE(allclose(dq.grad().full_tensor(), lq.grad(), 1e-12, 1e-12));
      EXPECT_TRUE(allclose(dk.grad().full_tensor(), lk.grad(), 1e-12, 1e-12));
      EXPECT_TRUE(allclose(dv.grad().full_tensor(), lv.grad(), 1e-12, 1e-12));
      if (!rows && kv_heads == 4) EXPECT_EQ(dk.grad().placements(), kvp);
    }
  }
}

// ---- rotary embeddings ----

// Meta's Llama 3 frequencies (apply_scaling), written out again: theta^(-2i/D), and with the
// scaling, wavelengths above original / low_freq_factor divided by the factor, those between
// original / high_freq_factor and that blended.
std::vector<double> reference_rope_frequencies(int64_t dim, const RopeConfig& c) {
  std::vector<double> out;
  for (int64_t i = 0; i < dim; i += 2) {
    const double freq = 1.0 / std::pow(c.theta, static_cast<double>(i) / static_cast<double>(dim));
    if (!c.scaling) {
      out.push_back(freq);
      continue;
    }
    const RopeScaling& s = *c.scaling;
    const double low_freq_wavelen = s.original_max_position / s.low_freq_factor;
    const double high_freq_wavelen = s.original_max_position / s.high_freq_factor;
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_freq_wavelen) {
      out.push_back(freq);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(freq / s.factor);
    } else {
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      out.push_back((1 - smooth) * freq / s.factor + smooth * freq);
    }
  }
  return out;
}

// Element by element: x [B, S, H, D], positions [B, S] (pos(b, s)).
std::vector<double> reference_rope(const Tensor& x,
                                   const std::function<int64_t(int64_t, int64_t)>& pos,
                                   const RopeConfig& c, double sign = 1.0) {
  const Shape& shape = x.shape();
  const int64_t dim = shape[3];
  const std::vector<double> f = reference_rope_frequencies(dim, c);
  const std::vector<double> v = testing::values(x);
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto index = testing::unravel(i, shape);
    const int64_t d = index[3];
    // The pair (a, b) that d belongs to, the frequency's index and whether d is a or b.
    const int64_t pair = c.interleaved ? d / 2 : d % (dim / 2);
    const bool first = c.interleaved ? d % 2 == 0 : d < dim / 2;
    const int64_t da = c.interleaved ? 2 * pair : pair;
    const int64_t db = c.interleaved ? 2 * pair + 1 : pair + dim / 2;
    const int64_t base = i - d;
    const double xa = v[static_cast<size_t>(base + da)];
    const double xb = v[static_cast<size_t>(base + db)];
    const double angle =
        sign * static_cast<double>(pos(index[0], index[1])) * f[static_cast<size_t>(pair)];
    out[static_cast<size_t>(i)] = first ? xa * std::cos(angle) - xb * std::sin(angle)
                                        : xa * std::sin(angle) + xb * std::cos(angle);
  }
  return out;
}

TEST(OpTable, RotaryEmbeddingMatchesAnElementwiseReference) {
  const Tensor x = randn({2, 5, 3, 8}, 3, DType::F64);
  const Tensor pos_s = from_vector<int64_t>({0, 7, 3, 9000, 123456}, {5});
  const Tensor pos_bs =
      from_vector<int64_t>({4, 5, 6, 7, 8, 100, 2000, 30000, 65535, 131071}, {2, 5});
  for (bool interleaved : {true, false}) {
    for (bool scaled : {false, true}) {
      RopeConfig c{.theta = 500000.0, .interleaved = interleaved};
      if (scaled) c.scaling = RopeScaling{};
      SCOPED_TRACE(fmt::format("interleaved {} scaled {}", interleaved, scaled));
      const std::vector<double> ps = testing::values(pos_s);
      const std::vector<double> pbs = testing::values(pos_bs);
      const auto at_s = [&](int64_t, int64_t s) {
        return static_cast<int64_t>(ps[static_cast<size_t>(s)]);
      };
      const auto at_bs = [&](int64_t b, int64_t s) {
        return static_cast<int64_t>(pbs[static_cast<size_t>(b * 5 + s)]);
      };
      expect_values(rotary_embedding(x, pos_s, c), reference_rope(x, at_s, c), 1e-12, 1e-12,
                    "positions [S]");
      expect_values(rotary_embedding(x, pos_bs, c), reference_rope(x, at_bs, c), 1e-12, 1e-12,
                    "positions [B, S]");
      expect_values(rotary_embedding(x, c),
                    reference_rope(
                        x, [](int64_t, int64_t s) { return s; }, c),
                    1e-12, 1e-12, "row indices");
      // The gradient of sum(y * w) is w turned back.
      Tensor leaf = x.clone();
      leaf.requires_grad_();
      const Tensor w = randn(x.shape(), 4, DType::F64);
      backward(sum(rotary_embedding(leaf, pos_bs, c) * w));
      expect_values(leaf.grad(), reference_rope(w, at_bs, c, -1.0), 1e-12, 1e-12, "gradient");
    }
  }
  // The scaled frequencies cover the three bands at D = 8 (wavelengths 6.3, 167, 4443, 118000).
  const std::vector<double> f = rope_frequencies(8, RopeConfig{.scaling = RopeScaling{}});
  const std::vector<double> plain = rope_frequencies(8, RopeConfig{});
  EXPECT_EQ(f[0], plain[0]);
  EXPECT_EQ(f[1], plain[1]);
  EXPECT_LT(f[2], plain[2]);
  EXPECT_GT(f[2], plain[2] / 8);
  EXPECT_NEAR(f[3], plain[3] / 8, 1e-18);
  // F32 rounds the double result once.
  expect_values(
      rotary_embedding(x.to(DType::F32), pos_s),
      reference_rope(x.to(DType::F32).to(DType::F64),
                     [](int64_t, int64_t s) {
                       return std::vector<int64_t>{0, 7, 3, 9000, 123456}[static_cast<size_t>(s)];
                     },
                     {}),
      1e-5, 1e-5, "f32");
  expect_throws<ShapeError>(
      [&] {
        rotary_embedding(randn({2, 5, 3, 7}, 1), pos_s);
      },
      {"rotary_embedding", "even head dim", "[2, 5, 3, 7]"});
  expect_throws<ShapeError>(
      [&] {
        rotary_embedding(randn({5, 8}, 1));
      },
      {"rotary_embedding", "[5, 8]"});
  expect_throws<ShapeError>(
      [&] {
        rotary_embedding(x, from_vector<int64_t>({1, 2}, {2}));
      },
      {"rotary_embedding", "positions [2]", "[2, 5, 3, 8]"});
  expect_throws<Unsupported>([&] { rotary_embedding(x, pos_s.to(DType::F32)); },
                             {"rotary_embedding", "I64 or I32"});
  expect_throws<Unsupported>(
      [&] {
        rotary_embedding(ones({2, 5, 3, 8}, DType::I64));
      },
      {"rotary_embedding", "floating"});
  expect_throws<ConfigError>([&] { rotary_embedding(x, RopeConfig{.theta = 0.0}); },
                             {"rotary_embedding", "theta"});
  expect_throws<ConfigError>(
      [&] {
        rotary_embedding(
            x, RopeConfig{.scaling = RopeScaling{.low_freq_factor = 4, .high_freq_factor = 4}});
      },
      {"rotary_embedding", "low_freq_factor < high_freq_factor"});
}

// Context parallelism: a sequence-sharded x rotates its rows by their global positions, with or
// without a positions input (sharded alike: no communication), and so does its gradient. A piece
// that used its local row indices would differ on every rank but the first: checked too.
TEST(OpTable, RotaryEmbeddingOnSequenceShardsUsesGlobalPositions) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const RopeConfig c{.scaling = RopeScaling{}};
  const Tensor x = randn({2, 8, 2, 8}, 5, DType::F64);
  const Tensor positions = arange(8, DType::I64);
  const Tensor want = rotary_embedding(x, positions, c);
  expect_values(want,
                reference_rope(
                    x, [](int64_t, int64_t s) { return s; }, c),
                1e-12, 1e-12, "global");
  DTensor dx = testing::make_dtensor(x, mesh, {Shard{1}}, 1);
  dx.requires_grad_();
  const DTensor dpos = testing::make_dtensor(positions, mesh, {Shard{0}}, 2);
  for (const DTensor& y : {rotary_embedding(dx, c), rotary_embedding(dx, dpos, c)}) {
    EXPECT_EQ(y.placements(), Placements{Shard{1}});
    EXPECT_TRUE(testing::pieces_match(y, want, 1e-12));
    // The planted bug: local positions 0, 1 on rank 1 (rows 2, 3) give other values.
    const Tensor local = rotary_embedding(dx.local().shard(1), c);
    EXPECT_FALSE(allclose(y.local().shard(1), local, 1e-6, 1e-6));
  }
  const Tensor w = randn(x.shape(), 6, DType::F64);
  backward(rotary_embedding(dx, c), testing::make_dtensor(w, mesh, {Shard{1}}, 3));
  EXPECT_EQ(dx.grad().placements(), Placements{Shard{1}});
  expect_values(dx.grad().full_tensor(),
                reference_rope(
                    w, [](int64_t, int64_t s) { return s; }, c, -1.0),
                1e-12, 1e-12, "gradient");
}

// ---- repeat_interleave ----

// out[..., j, ...] = x[..., j / r, ...] along d, element by element; the gradient of sum(out * w)
// sums w over each group of r copies.
TEST(OpTable, RepeatInterleaveMatchesAnElementwiseReference) {
  const Tensor x = randn({3, 4, 2}, 11, DType::F64);
  const std::vector<double> xv = testing::values(x);
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t r : {0, 1, 3}) {
      SCOPED_TRACE(fmt::format("dim {} repeats {}", d, r));
      Tensor leaf = x.clone();
      leaf.requires_grad_();
      const Tensor y = repeat_interleave(leaf, r, d - 3);
      Shape want_shape = x.shape();
      want_shape[static_cast<size_t>(d)] *= r;
      ASSERT_EQ(y.shape(), want_shape);
      std::vector<double> want;
      std::vector<double> want_grad(xv.size(), 0.0);
      const Tensor w = randn(want_shape, 12, DType::F64);
      const std::vector<double> wv = testing::values(w);
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto index = testing::unravel(i, want_shape);
        index[static_cast<size_t>(d)] /= r;
        int64_t flat = 0;
        for (size_t k = 0; k < index.size(); ++k) flat = flat * x.shape()[k] + index[k];
        want.push_back(xv[static_cast<size_t>(flat)]);
        want_grad[static_cast<size_t>(flat)] += wv[static_cast<size_t>(i)];
      }
      expect_values(y, want, 0, 0, "repeat_interleave");
      backward(sum(y * w));
      expect_values(leaf.grad(), want_grad, 1e-12, 1e-12, "gradient");
    }
  }
  expect_throws<ShapeError>([&] { repeat_interleave(x, -1, 0); },
                            {"repeat_interleave", "repeats must be >= 0", "[3, 4, 2]"});
  expect_throws<ShapeError>([&] { repeat_interleave(x, 2, 3); }, {"repeat_interleave"});
}

// The repeated dim stays sharded when its size divides evenly over the mesh dims sharding it
// (block c of the output is then the copies of block c of x), forward and backward; an uneven
// split (6 rows over 4 ranks: 2, 2, 2, 0, but 18 rows split 5, 5, 5, 3) is redistributed and
// still correct.
TEST(OpTable, RepeatInterleaveKeepsEvenShardsOfItsDim) {
  World world = World::sim(4);
  for (const std::vector<int64_t>& mesh_shape : std::vector<std::vector<int64_t>>{{4}, {2, 2}}) {
    const DeviceMesh mesh = *testing::try_mesh(world, mesh_shape);
    const Placements sharded(mesh_shape.size(), Shard{0});
    for (int64_t rows : {8, 6}) {
      SCOPED_TRACE(fmt::format("{} rows on {}", rows, mesh.to_string()));
      const Tensor x = randn({rows, 3}, 13, DType::F64);
      DTensor dx = testing::make_dtensor(x, mesh, sharded, 1);
      dx.requires_grad_();
      const DTensor y = repeat_interleave(dx, 3, 0);
      EXPECT_TRUE(testing::pieces_match(y, repeat_interleave(x, 3, 0)));
      if (rows % 4 == 0) EXPECT_EQ(y.placements(), sharded);
      const Tensor w = randn({rows * 3, 3}, 14, DType::F64);
      backward(y, testing::make_dtensor(w, mesh, sharded, 2));
      Tensor leaf = x.clone();
      leaf.requires_grad_();
      backward(sum(repeat_interleave(leaf, 3, 0) * w));
      EXPECT_TRUE(allclose(dx.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12));
      if (rows % 4 == 0) EXPECT_EQ(dx.grad().placements(), sharded);
    }
  }
}

// ---- ordering, scanning and counting against brute-force references (issue 27) -----------------

// a > b with NaN above every number (Note [Ordering ties]).
bool nan_greater(double a, double b) {
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// Contiguous data of `shape` seen as lanes [outer, n, inner] along dim d.
struct RefLanes {
  int64_t outer = 1, n = 1, inner = 1;
  RefLanes(const Shape& shape, int64_t d) {
    for (int64_t k = 0; k < static_cast<int64_t>(shape.size()); ++k) {
      const int64_t s = shape[static_cast<size_t>(k)];
      (k < d ? outer : k == d ? n : inner) *= s;
    }
  }
  size_t at(int64_t o, int64_t j, int64_t i, int64_t len) const {
    return static_cast<size_t>((o * len + j) * inner + i);
  }
};

// The first k positions of each lane by repeated selection: the best value not yet taken, the
// lower position on ties. Returned in the [outer, k, inner] layout.
std::vector<int64_t> select_ref(const std::vector<double>& v, const RefLanes& l, int64_t k,
                                bool largest) {
  std::vector<int64_t> out(static_cast<size_t>(l.outer * k * l.inner));
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      std::vector<bool> taken(static_cast<size_t>(l.n), false);
      for (int64_t r = 0; r < k; ++r) {
        int64_t best = -1;
        for (int64_t j = 0; j < l.n; ++j) {
          if (taken[static_cast<size_t>(j)]) continue;
          const double a = v[l.at(o, j, i, l.n)];
          if (best < 0) {
            best = j;
            continue;
          }
          const double b = v[l.at(o, best, i, l.n)];
          if (largest ? nan_greater(a, b) : nan_greater(b, a)) best = j;
        }
        taken[static_cast<size_t>(best)] = true;
        out[l.at(o, r, i, k)] = best;
      }
    }
  }
  return out;
}

// Small integers with many ties, and a NaN or two when floating.
Tensor tied_values(const Shape& shape, uint64_t seed, DType dtype, bool nan = true) {
  std::vector<double> v = testing::values(testing::int_valued(shape, seed, DType::F64));
  for (double& x : v) x = std::floor(x / 4);
  if (nan && is_floating(dtype)) {
    v[3 % v.size()] = std::numeric_limits<double>::quiet_NaN();
    v[v.size() - 2] = std::numeric_limits<double>::quiet_NaN();
  }
  return from_vector(v, shape).to(dtype);
}

void expect_ordered(const ValuesIndices<Tensor>& got, const std::vector<double>& x,
                    const RefLanes& l, int64_t k, const std::vector<int64_t>& want) {
  const std::vector<double> values = testing::values(got.values);
  const std::vector<double> indices = testing::values(got.indices);
  ASSERT_EQ(indices.size(), want.size());
  EXPECT_EQ(got.indices.dtype(), DType::I64);
  for (size_t p = 0; p < want.size(); ++p) {
    EXPECT_EQ(indices[p], static_cast<double>(want[p])) << "position " << p;
    const int64_t o = static_cast<int64_t>(p) / (k * l.inner);
    const int64_t i = static_cast<int64_t>(p) % l.inner;
    EXPECT_TRUE(same_value(values[p], x[l.at(o, want[p], i, l.n)])) << "position " << p;
  }
}

TEST(OpTable, TopkSortArgminMaxMinMatchABruteForceReference) {
  struct Case {
    Shape shape;
    int64_t d;
  };
  uint64_t seed = 300;
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::I64, DType::I32}) {
    for (const Case& c : std::vector<Case>{{{4, 7}, 1}, {{6, 3}, 0}, {{2, 5, 3}, -2}, {{9}, 0}}) {
      SCOPED_TRACE(fmt::format("{} {} dim {}", dtype, shape_str(c.shape), c.d));
      const Tensor x = tied_values(c.shape, ++seed, dtype);
      const std::vector<double> v = testing::values(x);
      const int64_t d = c.d < 0 ? c.d + static_cast<int64_t>(c.shape.size()) : c.d;
      const RefLanes l(c.shape, d);
      for (bool largest : {true, false}) {
        for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, l.n}) {
          SCOPED_TRACE(fmt::format("k {} largest {}", k, largest));
          const auto got = topk(x, k, c.d, largest);
          expect_ordered(got, v, l, k, select_ref(v, l, k, largest));
          // sorted = false gives the same order.
          EXPECT_TRUE(equal(topk(x, k, c.d, largest, false).indices, got.indices));
        }
        // A stable sort is the full selection; descending is largest first.
        const auto sorted = sort(x, c.d, largest);
        expect_ordered(sorted, v, l, l.n, select_ref(v, l, l.n, largest));
        EXPECT_TRUE(equal(argsort(x, c.d, largest), sorted.indices));
        // max/min along d: the first best, as topk with k = 1, except that NaN propagates
        // through min too (torch.min): the first NaN of a lane that has one.
        std::vector<int64_t> first = select_ref(v, l, 1, largest);
        for (int64_t o = 0; o < l.outer; ++o) {
          for (int64_t i = 0; i < l.inner; ++i) {
            for (int64_t j = l.n - 1; j >= 0; --j) {
              if (std::isnan(v[l.at(o, j, i, l.n)])) first[l.at(o, 0, i, 1)] = j;
            }
          }
        }
        for (bool keep : {false, true}) {
          const auto m = largest ? max(x, c.d, keep) : min(x, c.d, keep);
          Shape reduced = c.shape;
          if (keep) {
            reduced[static_cast<size_t>(d)] = 1;
          } else {
            reduced.erase(reduced.begin() + d);
          }
          EXPECT_EQ(m.values.shape(), reduced);
          EXPECT_EQ(m.indices.shape(), reduced);
          expect_ordered({m.values.reshape({-1}), m.indices.reshape({-1})}, v, l, 1, first);
          const Tensor a = largest ? argmax(x, c.d, keep) : argmin(x, c.d, keep);
          EXPECT_TRUE(equal(a, m.indices));
        }
      }
    }
  }
}

// topk's and max's gradient goes to the picked elements only, the tie's lower index.
TEST(OpTable, TopkAndMaxGradientsGoToThePickedElements) {
  Tensor x = from_vector<double>({1, 5, 3, 5, 2, 0, 0, 4}, {2, 4});
  x.requires_grad_();
  const auto [values, indices] = topk(x, 2);
  expect_values(values, {5, 5, 4, 2}, 0, 0, "topk");
  expect_values(indices, {1, 3, 3, 0}, 0, 0, "topk");
  backward(sum(values * from_vector<double>({1, 10, 100, 1000}, {2, 2})));
  expect_values(x.grad(), {0, 1, 0, 10, 1000, 0, 0, 100}, 0, 0, "topk grad");
  Tensor y = from_vector<double>({1, 5, 3, 5, 2, 0, 0, 4}, {2, 4});
  y.requires_grad_();
  backward(sum(min(y, 1).values * from_vector<double>({1, 10}, {2})));
  expect_values(y.grad(), {1, 0, 0, 0, 0, 10, 0, 0}, 0, 0, "min grad");
}

TEST(OpTable, CumsumMatchesABruteForceReferenceAndItsGradientSumsFromTheEnd) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::I32, DType::I64, DType::Bool}) {
    for (const auto& [shape, d] : std::vector<std::pair<Shape, int64_t>>{
             {{4, 7}, 1}, {{6, 3}, 0}, {{2, 5, 3}, -2}, {{9}, 0}, {{}, 0}}) {
      SCOPED_TRACE(fmt::format("{} {} dim {}", dtype, shape_str(shape), d));
      const Tensor x = testing::int_valued(shape, 400 + static_cast<uint64_t>(d), DType::F64)
                           .to(dtype == DType::Bool ? DType::F64 : dtype);
      const Tensor in = dtype == DType::Bool ? gt(x, full({}, 0.0, DType::F64)) : x;
      const std::vector<double> v = testing::values(in);
      const int64_t nd = static_cast<int64_t>(shape.size());
      const RefLanes l(shape, shape.empty() ? 0 : (d + nd) % nd);
      std::vector<double> want(v.size());
      for (int64_t o = 0; o < l.outer; ++o) {
        for (int64_t i = 0; i < l.inner; ++i) {
          double acc = 0;
          for (int64_t j = 0; j < l.n; ++j) {
            acc += v[l.at(o, j, i, l.n)];
            want[l.at(o, j, i, l.n)] = acc;
          }
        }
      }
      const Tensor got = cumsum(in, d);
      EXPECT_EQ(got.dtype(), is_floating(dtype) ? dtype : DType::I64);
      expect_values(got, want, 0, 0, "cumsum");
    }
  }
  // I64 sums wrap around (two's complement), as torch's.
  const int64_t big = std::numeric_limits<int64_t>::max();
  const Tensor wrapped = cumsum(from_vector<int64_t>({big, 1, 1}, {3}), 0);
  EXPECT_EQ(wrapped.data<int64_t>()[2], std::numeric_limits<int64_t>::min() + 1);
  // d/dx_j sum_i w_i cumsum(x)_i = sum_{i >= j} w_i.
  Tensor x = randn({3, 5}, 7, DType::F64).requires_grad_();
  const Tensor w = randn({3, 5}, 8, DType::F64);
  backward(sum(cumsum(x, 1) * w));
  const std::vector<double> wv = testing::values(w);
  std::vector<double> want(15);
  for (int r = 0; r < 3; ++r) {
    double acc = 0;
    for (int j = 4; j >= 0; --j) want[static_cast<size_t>(r * 5 + j)] = acc += wv[r * 5 + j];
  }
  expect_values(x.grad(), want, 1e-12, 1e-12, "cumsum grad");
}

TEST(OpTable, OneHotAndBincountMatchABruteForceReference) {
  const Tensor ids = from_vector<int64_t>({2, 0, 3, 3, 1, 0, 2, 2}, {2, 4});
  std::vector<double> want;
  for (double id : testing::values(ids)) {
    for (int c = 0; c < 5; ++c) want.push_back(id == c ? 1 : 0);
  }
  const Tensor h = one_hot(ids, 5);
  EXPECT_EQ(h.shape(), (Shape{2, 4, 5}));
  EXPECT_EQ(h.dtype(), DType::I64);
  expect_values(h, want, 0, 0, "one_hot");
  EXPECT_EQ(one_hot(ids).shape(), (Shape{2, 4, 4}));  // num_classes = largest + 1
  EXPECT_EQ(one_hot(zeros({0}, DType::I64), 3).shape(), (Shape{0, 3}));

  const Tensor flat = ids.reshape({-1});
  expect_values(bincount(flat), {2, 1, 3, 2}, 0, 0, "bincount");
  expect_values(bincount(flat, 6), {2, 1, 3, 2, 0, 0}, 0, 0, "bincount minlength");
  expect_values(bincount(flat.to(DType::I32), 2), {2, 1, 3, 2}, 0, 0, "bincount i32");
  const Tensor empty_counts = bincount(zeros({0}, DType::I64), 3);
  EXPECT_EQ(empty_counts.dtype(), DType::I64);
  expect_values(empty_counts, {0, 0, 0}, 0, 0, "bincount empty");
  EXPECT_EQ(bincount(zeros({0}, DType::I64)).shape(), (Shape{0}));
}

TEST(OpTable, OrderingScanningAndCountingErrorsNameTheOpAndShape) {
  const Tensor x = randn({4, 7}, 1);
  expect_throws<ShapeError>([&] { topk(x, 8); }, {"topk", "k = 8", "[4, 7]"});
  expect_throws<ShapeError>([&] { topk(x, -1, 0); }, {"topk", "k = -1", "[4, 7]"});
  expect_throws<ShapeError>([&] { topk(x, 1, 2); }, {"topk", "[4, 7]"});
  expect_throws<Unsupported>([&] { topk(ones({3}, DType::Bool), 1); }, {"topk", "bool", "[3]"});
  expect_throws<ShapeError>([&] { topk(full({}, 1.0), 1); }, {"topk", "[]"});
  expect_throws<ShapeError>([&] { sort(x, -3); }, {"sort", "[4, 7]"});
  expect_throws<ShapeError>([&] { argsort(x, 2); }, {"sort", "[4, 7]"});
  expect_throws<ShapeError>([&] { argmin(zeros({3, 0}), 1); }, {"argmin", "[3, 0]"});
  expect_throws<ShapeError>([&] { min(x, 5); }, {"argmin", "[4, 7]"});
  expect_throws<ShapeError>([&] { cumsum(x, 2); }, {"cumsum", "[4, 7]"});
  const Tensor ids = from_vector<int64_t>({1, -2, 3}, {3});
  expect_throws<ShapeError>([&] { one_hot(ids, 4); }, {"one_hot", "-2", "[3]"});
  expect_throws<ShapeError>([&] { one_hot(abs(ids), 3); }, {"one_hot", "3", "[0, 3)", "[3]"});
  expect_throws<Unsupported>([&] { one_hot(ids.to(DType::F32), 4); }, {"one_hot", "[3]"});
  expect_throws<ConfigError>([&] { one_hot(zeros({0}, DType::I64)); }, {"one_hot", "empty", "[0]"});
  expect_throws<ConfigError>([&] { one_hot(abs(ids), -3); }, {"one_hot", "-3", "[3]"});
  expect_throws<ConfigError>([&] { bincount(ids); }, {"bincount", "non-negative", "-2", "[3]"});
  expect_throws<ConfigError>([&] { bincount(abs(ids), -1); }, {"bincount", "minlength", "[3]"});
  expect_throws<ShapeError>(
      [&] {
        bincount(zeros({2, 2}, DType::I64));
      },
      {"bincount", "1-D", "[2, 2]"});
  expect_throws<Unsupported>([&] { bincount(x.reshape({-1})); }, {"bincount", "[28]"});
}

// The router of a mixture of experts on DTensors: tokens sharded, top-k over the experts and the
// counts per expert without gathering the logits; the counts are a pending sum (P(sum)).
TEST(OpTable, RouterTopkAndExpertCountsStayShardedOverTokens) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const Tensor logits = tied_values({8, 6}, 5, DType::F32, false);
  const DTensor x = distribute_tensor(logits, mesh, {Shard{0}}).requires_grad_();
  const auto [values, indices] = topk(x, 2);
  EXPECT_EQ(indices.placements(), Placements{Shard{0}});
  EXPECT_EQ(values.placements(), Placements{Shard{0}});
  const auto want = topk(logits, 2);
  EXPECT_TRUE(testing::pieces_match(indices, want.indices, 0));
  EXPECT_TRUE(testing::pieces_match(values, want.values, 0));
  const DTensor counts = bincount(reshape(indices, {-1}), 6);
  EXPECT_EQ(counts.placements(), Placements{Partial{}});
  EXPECT_TRUE(equal(counts.full_tensor(), bincount(want.indices.reshape({-1}), 6)));
  const DTensor offsets = cumsum(counts, 0);
  EXPECT_EQ(offsets.placements(), Placements{Partial{}});
  EXPECT_TRUE(equal(offsets.full_tensor(), cumsum(bincount(want.indices.reshape({-1}), 6), 0)));
  const DTensor hot = one_hot(indices, 6);
  EXPECT_EQ(hot.placements(), Placements{Shard{0}});
  EXPECT_TRUE(testing::pieces_match(hot, one_hot(want.indices, 6), 0));
  backward(sum(values));
  EXPECT_EQ(x.grad().placements(), Placements{Shard{0}});
  Tensor xt = logits.clone().requires_grad_();
  backward(sum(topk(xt, 2).values));
  EXPECT_TRUE(equal(x.grad().full_tensor(), xt.grad()));
}

// A shape-only run (Note [Shape-only tensors]) gives the shapes without values; bincount has
// minlength bins, one_hot needs num_classes.
TEST(OpTable, OrderingScanningCountingAndScattersRunShapeOnly) {
  MetaTensorsScope meta(true);
  const Tensor x = randn({4, 7}, 1);
  ASSERT_TRUE(x.is_meta());
  const auto [values, indices] = topk(x, 3);
  EXPECT_EQ(values.shape(), (Shape{4, 3}));
  EXPECT_EQ(indices.dtype(), DType::I64);
  EXPECT_EQ(sort(x, 0).values.shape(), (Shape{4, 7}));
  EXPECT_EQ(max(x, 1).values.shape(), (Shape{4}));
  EXPECT_EQ(cumsum(x, 1).shape(), (Shape{4, 7}));
  const Tensor ids = zeros({5}, DType::I64);
  EXPECT_EQ(bincount(ids, 6).shape(), (Shape{6}));
  EXPECT_EQ(one_hot(ids, 3).shape(), (Shape{5, 3}));
  expect_throws<ConfigError>([&] { one_hot(ids); }, {"one_hot", "shape-only", "[5]"});
  EXPECT_EQ(index_add(zeros({3, 7}), 0, zeros({4}, DType::I64), x).shape(), (Shape{3, 7}));
  EXPECT_EQ(scatter(x, 1, zeros({4, 2}, DType::I64), 0.0).shape(), (Shape{4, 7}));
}

// scatter_add, index_add, scatter and take_along_dim against loops over the positions, with
// duplicate indices.
TEST(OpTable, ScattersAndTakeAlongDimMatchABruteForceReference) {
  for (DType dtype : {DType::F64, DType::F32, DType::I64, DType::I32}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const Tensor x = testing::int_valued({4, 3}, 1, dtype);
    const Tensor src = testing::int_valued({5, 3}, 2, dtype);
    const Tensor index =
        from_vector<int64_t>({1, 3, 0, 1, 1, 2, 3, 3, 1, 0, 0, 2, 2, 1, 0}, {5, 3});
    const std::vector<double> xv = testing::values(x);
    const std::vector<double> sv = testing::values(src);
    const std::vector<double> iv = testing::values(index);
    // Along dim 0: out[index[i][j]][j] (+)= src[i][j].
    std::vector<double> added = xv;
    std::vector<double> written = xv;
    for (size_t i = 0; i < 5; ++i) {
      for (size_t j = 0; j < 3; ++j) {
        const size_t at = static_cast<size_t>(iv[i * 3 + j]) * 3 + j;
        added[at] += sv[i * 3 + j];
        written[at] = sv[i * 3 + j];
      }
    }
    expect_values(scatter_add(x, 0, index, src), added, 0, 0, "scatter_add");
    expect_values(scatter(x, 0, index, src), written, 0, 0, "scatter");
    // Along dim 1 with the transposes.
    expect_values(scatter_add(x.transpose(0, 1).contiguous(), 1, index.transpose(0, 1).contiguous(),
                              src.transpose(0, 1).contiguous())
                      .transpose(0, 1),
                  added, 0, 0, "scatter_add dim 1");
    std::vector<double> filled = xv;
    for (size_t p = 0; p < 15; ++p) filled[static_cast<size_t>(iv[p]) * 3 + p % 3] = 7;
    expect_values(scatter(x, 0, index, 7.0), filled, 0, 0, "scatter value");
    // index_add along dim 0 (rows) and dim 1 (columns), alpha 3.
    const Tensor rows = from_vector<int64_t>({2, 0, 2, 3, 2}, {5});
    std::vector<double> by_rows = xv;
    for (size_t i = 0; i < 5; ++i) {
      for (size_t j = 0; j < 3; ++j) {
        by_rows[static_cast<size_t>(testing::values(rows)[i]) * 3 + j] += 3 * sv[i * 3 + j];
      }
    }
    expect_values(index_add(x, 0, rows, src, 3.0), by_rows, 0, 0, "index_add");
    const Tensor cols = from_vector<int64_t>({1, 1, 0, 2, 1}, {5});
    const Tensor wide = testing::int_valued({4, 5}, 3, dtype);
    std::vector<double> by_cols = xv;
    for (size_t i = 0; i < 4; ++i) {
      for (size_t j = 0; j < 5; ++j) {
        by_cols[i * 3 + static_cast<size_t>(testing::values(cols)[j])] +=
            testing::values(wide)[i * 5 + j];
      }
    }
    expect_values(index_add(x, 1, cols, wide), by_cols, 0, 0, "index_add dim 1");
    // take_along_dim with the indices broadcast over the rows: out[i][j] = x[i][idx[0][j]].
    const Tensor picks = from_vector<int64_t>({2, 0, 2, 1}, {1, 4});
    std::vector<double> taken;
    for (size_t i = 0; i < 4; ++i) {
      for (double j : testing::values(picks)) taken.push_back(xv[i * 3 + static_cast<size_t>(j)]);
    }
    expect_values(take_along_dim(x, picks, 1), taken, 0, 0, "take_along_dim");
  }
  // Gradients: x's passes (scatter: zero where written), src's is gathered at the index.
  Tensor x = randn({4, 3}, 4, DType::F64).requires_grad_();
  Tensor src = randn({5, 3}, 5, DType::F64).requires_grad_();
  const Tensor index = from_vector<int64_t>({1, 3, 0, 1, 1, 2, 3, 3, 1, 0, 0, 2, 2, 1, 0}, {5, 3});
  const Tensor w = randn({4, 3}, 6, DType::F64);
  backward(sum(scatter_add(x, 0, index, src) * w));
  EXPECT_TRUE(equal(x.grad(), w));
  EXPECT_TRUE(equal(src.grad(), gather(w, 0, index)));
  Tensor y = randn({4, 3}, 7, DType::F64).requires_grad_();
  backward(sum(scatter(y, 0, index, 0.5) * w));
  std::vector<double> kept = testing::values(w);
  for (size_t p = 0; p < 15; ++p)
    kept[static_cast<size_t>(testing::values(index)[p]) * 3 + p % 3] = 0;
  expect_values(y.grad(), kept, 0, 0, "scatter grad");
  Tensor s = randn({5, 3}, 8, DType::F64).requires_grad_();
  const Tensor rows = from_vector<int64_t>({2, 0, 2, 3, 2}, {5});
  backward(sum(index_add(x.detach(), 0, rows, s, -0.5) * w));
  EXPECT_TRUE(allclose(s.grad(), index_select(w, 0, rows) * -0.5, 1e-15, 0));
}

TEST(OpTable, ScatterErrorsNameTheOpAndShapes) {
  const Tensor x = zeros({4, 3});
  const Tensor index = zeros({5, 3}, DType::I64);
  const Tensor src = ones({5, 3});
  expect_throws<ShapeError>([&] { scatter_add(x, 2, index, src); }, {"scatter_add", "[4, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scatter_add(x, 0, zeros({5, 2}, DType::I64), ones({5, 2}));
      },
      {"scatter_add", "[5, 2]", "[4, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scatter_add(x, 0, index, ones({6, 3}));
      },
      {"scatter_add", "[6, 3]", "[5, 3]"});
  expect_throws<Unsupported>([&] { scatter_add(x, 0, index, src.to(DType::F64)); },
                             {"scatter_add", "f64", "[4, 3]"});
  expect_throws<Unsupported>([&] { scatter_add(x, 0, index.to(DType::F32), src); },
                             {"scatter_add", "index", "[5, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scatter_add(x, 0, full({5, 3}, 4.0, DType::I64), src);
      },
      {"scatter_add", "index 4", "[0, 4)", "[4, 3]"});
  expect_throws<ShapeError>(
      [&] {
        scatter(x, 0, full({5, 3}, -1.0, DType::I64), src);
      },
      {"scatter", "index -1", "[0, 4)", "[4, 3]"});
  expect_throws<ShapeError>(
      [&] {
        index_add(x, 0, zeros({5}, DType::I64), ones({5, 2}));
      },
      {"index_add", "[5, 2]", "[4, 3]"});
  expect_throws<ShapeError>([&] { index_add(x, 0, full({5}, 9.0, DType::I64), src); },
                            {"index_add", "index 9", "[0, 4)"});
  expect_throws<ConfigError>(
      [&] {
        index_add(x.to(DType::I64), 0, index.narrow(1, 0, 1).reshape({5}), src.to(DType::I64), 0.5);
      },
      {"index_add", "alpha", "[4, 3]"});
  expect_throws<ShapeError>(
      [&] {
        take_along_dim(x, zeros({2, 3}, DType::I64), 1);
      },
      {"take_along_dim", "[2, 3]", "[4, 3]"});
  expect_throws<ShapeError>([&] { take_along_dim(x, zeros({3}, DType::I64), 0); },
                            {"take_along_dim", "[3]", "[4, 3]"});
}

// The dispatch of a mixture of experts on DTensors: tokens sharded (S(0)), each rank adds its
// tokens' vectors into the expert rows: P(sum), no communication; the tokens' gradient stays S(0).
TEST(OpTable, IndexAddOfShardedTokensIsAPendingSum) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const Tensor tokens = randn({8, 5}, 11, DType::F64);
  const Tensor experts = from_vector<int64_t>({2, 0, 2, 1, 3, 2, 0, 2}, {8});
  const DTensor t = distribute_tensor(tokens, mesh, {Shard{0}}).requires_grad_();
  const DTensor e = distribute_tensor(experts, mesh, {Shard{0}});
  const DTensor zero = distribute_tensor(zeros({4, 5}, DType::F64), mesh, {Replicate{}});
  const DTensor sums = index_add(zero, 0, e, t);
  EXPECT_EQ(sums.placements(), Placements{Partial{}});
  EXPECT_TRUE(allclose(sums.full_tensor(), index_add(zeros({4, 5}, DType::F64), 0, experts, tokens),
                       1e-12, 1e-12));
  const DTensor expanded =
      distribute_tensor(experts.reshape({8, 1}).expand({8, 5}).contiguous(), mesh, {Shard{0}});
  const DTensor also = scatter_add(zero, 0, expanded, t);
  EXPECT_EQ(also.placements(), Placements{Partial{}});
  EXPECT_TRUE(allclose(also.full_tensor(), sums.full_tensor(), 1e-12, 1e-12));
  const Tensor w = randn({4, 5}, 12, DType::F64);
  backward(sums, distribute_tensor(w, mesh, {Replicate{}}));
  EXPECT_EQ(t.grad().placements(), Placements{Shard{0}});
  EXPECT_TRUE(equal(t.grad().full_tensor(), index_select(w, 0, experts)));
}

// The Tensor methods that make new tensors are recorded too (their free-function rows above check
// the formulas): each gradient against the one the free function gives.
TEST(OpTable, TensorMethodsAreRecorded) {
  const Tensor x = randn({4, 6}, 3, DType::F64).requires_grad_();
  const Tensor w = randn({3, 8}, 4, DType::F64);
  Tensor y = x.narrow(0, 1, 3).transpose(0, 1).reshape({2, 9}).unsqueeze(0).squeeze(0);
  y = y.view({3, 6}).permute({1, 0}).expand({2, 6, 3}).contiguous().clone().to(DType::F32);
  y = y.select(0, 1).to(DType::F64);
  backward(sum(matmul(y, w)));
  ASSERT_TRUE(x.grad().defined());
  const Tensor x2 = x.detach().clone().requires_grad_();
  Tensor z = transpose(narrow(x2, 0, 1, 3), 0, 1);
  z = permute(reshape(z, {3, 6}), {1, 0});
  backward(sum(matmul(z, w)));
  EXPECT_TRUE(allclose(x.grad(), x2.grad(), 1e-6, 1e-6)) << x.grad() << x2.grad();
}

// The gradients of the row's inputs, each from its Tensor op on (detached copies of) `values`
// with output gradient `w` (zeros for an input the op does not use).
std::vector<Tensor> tensor_gradients(const OpRow& r, const std::vector<Tensor>& values,
                                     const Tensor& w) {
  std::vector<Tensor> leaves;
  for (size_t k = 0; k < values.size(); ++k) {
    leaves.push_back(leaf(r, k, values[k].detach().clone()));
  }
  backward(r.on_tensor(leaves), w);
  std::vector<Tensor> grads;
  for (const Tensor& leaf : leaves) {
    grads.push_back(leaf.grad().defined() ? leaf.grad() : zeros(leaf.shape(), leaf.dtype()));
  }
  return grads;
}

TEST(OpTable, LocalTensorGradientsEqualTheTensorGradientsOnEveryShard) {
  World world = World::sim(3);
  int checked = 0;
  for (const OpRow& r : op_table().rows) {
    SCOPED_TRACE(r.name);
    std::vector<LocalTensor> inputs;
    for (size_t k = 0; k < r.shapes.size(); ++k) {
      LocalTensor in = LocalTensor::from_fn(world, [&](int rank) {
        return smooth_input(r, k, 10 * k + static_cast<uint64_t>(rank));
      });
      inputs.push_back(is_data(r, k) ? in.requires_grad_() : in);
    }
    const LocalTensor out = r.on_local(inputs);
    if (!is_floating(out.dtype()) || r.no_derivative) continue;
    const LocalTensor w = LocalTensor::from_fn(world, [&](int rank) {
      return randn(out.shard(rank).shape(), 77 + static_cast<uint64_t>(rank), DType::F64);
    });
    backward(out, w);
    for (int rank : world.held_ranks()) {
      std::vector<Tensor> values;
      for (const LocalTensor& in : inputs) values.push_back(in.shard(rank));
      const std::vector<Tensor> want = tensor_gradients(r, values, w.shard(rank));
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (!is_data(r, k)) continue;
        const LocalTensor grad = inputs[k].grad();
        const Tensor got = grad.defined() ? grad.shard(rank) : zeros(want[k].shape(), DType::F64);
        EXPECT_TRUE(allclose(got, want[k], 1e-12, 1e-12))
            << "rank " << rank << " input " << k << ": " << got << " vs " << want[k];
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// The placements a leaf's gradient may have: the leaf's, a Partial possibly Replicate.
bool gradient_placements_fit(const Placements& leaf, const Placements& grad) {
  for (size_t i = 0; i < leaf.size(); ++i) {
    if (!(grad[i] == leaf[i]) && !(is_partial(leaf[i]) && is_replicate(grad[i]))) return false;
  }
  return true;
}

// Every row on DTensors with random placements, three trials per mesh (uneven and empty shards on
// the meshes of 3 and 4 ranks, Partial inputs from known decompositions): the full tensor of each
// input's gradient equals the Tensor gradient, and the gradient has the input's placements. Seeds
// come from the row, mesh and trial only, so every rank of a real backend builds the same inputs.
void check_dtensor_gradients(const World& world, DType dtype) {
  const auto rows = op_table().rows;
  const double tol = dtype == DType::F64 ? 1e-10 : 2e-4;
  int checked = 0;
  for (size_t row = 0; row < rows.size(); ++row) {
    const OpRow& r = rows[row];
    for (size_t m = 0; m < kMeshes.size(); ++m) {
      // Under mpi every process takes part in creating a mesh's communicators (MPI_Comm_split),
      // so only meshes over every rank are used there.
      const int64_t mesh_size = std::accumulate(kMeshes[m].begin(), kMeshes[m].end(), int64_t{1},
                                                std::multiplies<int64_t>());
      if (world.backend_name() == "mpi" && mesh_size != world.size()) continue;
      auto mesh = testing::try_mesh(world, kMeshes[m]);
      if (!mesh) continue;
      for (uint64_t trial = 0; trial < 3; ++trial) {
        const uint64_t seed = testing::mix(row * 131 + m * 7 + trial, static_cast<uint64_t>(dtype));
        std::vector<Tensor> globals;
        std::vector<DTensor> inputs;
        std::string placements_text;
        for (size_t k = 0; k < r.shapes.size(); ++k) {
          const bool data = is_data(r, k);
          Tensor g = smooth_input(r, k, testing::mix(seed, k));
          if (data) g = g.to(dtype);
          const Placements kinds = testing::all_placement_kinds(static_cast<int>(g.dim()));
          // Indices and masks: Shard or Replicate.
          const size_t n_kinds = data ? kinds.size() : static_cast<size_t>(g.dim()) + 1;
          Placements p;
          for (size_t i = 0; i < kMeshes[m].size(); ++i) {
            const uint64_t pick = testing::mix(seed, 100 + 10 * k + i);
            p.push_back(kinds[pick % n_kinds]);
          }
          placements_text += " " + to_string(p);
          globals.push_back(g);
          DTensor in = testing::make_dtensor(g, *mesh, p, testing::mix(seed, 1000 + k));
          inputs.push_back(data ? in.requires_grad_() : in);
        }
        SCOPED_TRACE(
            fmt::format("{} {} on {} with{}", r.name, dtype, mesh->to_string(), placements_text));
        const DTensor out = r.on_dtensor(inputs);
        if (!is_floating(out.dtype()) || r.no_derivative) continue;
        const Tensor w = randn(out.shape(), testing::mix(seed, 7), dtype);
        const std::vector<Tensor> want = tensor_gradients(r, globals, w);
        backward(out, distribute_tensor(w, *mesh, Placements(mesh->ndim(), Replicate{})));
        for (size_t k = 0; k < inputs.size(); ++k) {
          if (!is_data(r, k)) continue;
          const DTensor grad = inputs[k].grad();
          if (!grad.defined()) {
            EXPECT_TRUE(equal(want[k], zeros(want[k].shape(), dtype))) << "input " << k;
            continue;
          }
          EXPECT_TRUE(gradient_placements_fit(inputs[k].placements(), grad.placements()))
              << "input " << k << " " << to_string(inputs[k].placements()) << " got gradient "
              << to_string(grad.placements());
          const Tensor got = grad.full_tensor();
          EXPECT_TRUE(allclose(got, want[k], tol, tol))
              << "input " << k << ": " << got << " vs " << want[k];
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, world.backend_name() == "mpi" ? 300 : 600);
}

SPMD_TEST(OpTableGrad, DTensorGradientsMatchTensorGradientsF64) {
  check_dtensor_gradients(world, DType::F64);
}

SPMD_TEST(OpTableGrad, DTensorGradientsMatchTensorGradientsF32) {
  check_dtensor_gradients(world, DType::F32);
}

// ---- the table is covered: every entry of all_ops() has its rows
// ---------------------------------

// Every row runs on DTensors (Replicate on two ranks) with an op observer (dtensor/hooks.h) that
// notes the entries it runs, then its backward: an entry of all_ops() that no row's forward runs
// has no conformance row, unless a row's backward runs it (an entry that only computes a
// derivative, such as layer_norm_backward, is checked through its forward's gradient rows); an
// entry with a backward that no row with a floating result runs has no gradient check (rows with
// a floating result are the ones TensorGradientsMatchFiniteDifferences and the DTensor gradient
// table differentiate). tests/ops/check_op_list.py checks that all_ops() lists every entry.
TEST(OpTable, EveryOpHasAConformanceRowAndAGradientCheck) {
  World world = World::sim(2);
  const DeviceMesh mesh = *testing::try_mesh(world, {2});
  const Placements replicate{Replicate{}};
  std::set<const OpDef*> forward;
  std::set<const OpDef*> differentiated;
  std::set<const OpDef*> in_backward;
  std::set<const OpDef*> ran;
  const int observer = add_op_observer([&](const OpEvent& e) { ran.insert(e.def); });
  for (const OpRow& r : op_table().rows) {
    SCOPED_TRACE(r.name);
    std::vector<DTensor> inputs;
    for (size_t k = 0; k < r.shapes.size(); ++k) {
      DTensor in = distribute_tensor(smooth_input(r, k, 60 + k), mesh, replicate);
      inputs.push_back(is_data(r, k) ? in.requires_grad_() : in);
    }
    ran.clear();
    const DTensor out = r.on_dtensor(inputs);
    forward.insert(ran.begin(), ran.end());
    if (!is_floating(out.dtype()) || r.no_derivative) continue;
    differentiated.insert(ran.begin(), ran.end());
    ran.clear();
    backward(out, distribute_tensor(randn(out.shape(), 61, DType::F64), mesh, replicate));
    in_backward.insert(ran.begin(), ran.end());
  }
  remove_op_observer(observer);
  std::set<const OpDef*> listed;
  for (const OpDef* op : all_ops()) {
    EXPECT_TRUE(listed.insert(op).second) << "all_ops() lists '" << op->name << "' twice";
    EXPECT_TRUE(forward.count(op) != 0 || in_backward.count(op) != 0)
        << "'" << op->name << "' has no row in op_table() (docs/design.md, \"Adding an op\")";
    if (op->backward != nullptr) {
      EXPECT_TRUE(differentiated.count(op) != 0)
          << "'" << op->name << "' has a backward but no row with a floating result";
    }
  }
}

TEST(OpTable, AutogradErrors) {
  const Tensor x = randn({3}, 1).requires_grad_();
  const Tensor y = exp(x);
  backward(sum(y));
  {
    SCOPED_TRACE("backward twice");
    expect_throws<Error>([&] { backward(sum(y)); }, {"already differentiated"});
  }
  {
    SCOPED_TRACE("no grad");
    expect_throws<Error>([&] { backward(sum(randn({3}, 2))); }, {"does not require grad"});
  }
  {
    SCOPED_TRACE("integer leaf");
    expect_throws<Unsupported>([&] { arange(3, DType::I64).requires_grad_(); }, {"only floating"});
  }
  {
    SCOPED_TRACE("non-leaf");
    expect_throws<Error>([&] { exp(x).requires_grad_(); }, {"only leaves"});
  }
  {
    SCOPED_TRACE("in place");
    expect_throws<Unsupported>([&] { x.clone().fill_(1.0); }, {"fill_", "autograd"});
  }
  {
    SCOPED_TRACE("saved value written");
    const Tensor v = randn({3}, 3).requires_grad_();
    Tensor saved = randn({3}, 4);
    const Tensor p = v * saved;
    {
      NoGradGuard no_grad;
      saved.fill_(0.0);
    }
    expect_throws<Error>([&] { backward(sum(p)); }, {"written in place", "'mul'"});
    expect_throws<ShapeError>([&] { backward(exp(v)); }, {"one element"});
  }
}

// Note [Partial backward]: the input gradient first (graph kept), the weight gradient later: the
// same gradients as one full backward, and nothing computed for leaves not asked for.
TEST(OpTable, PartialBackwardSplitsInputAndWeightGradients) {
  const Tensor x0 = randn({3, 4}, 1, DType::F64);
  const Tensor w0 = randn({4, 5}, 2, DType::F64);
  auto loss_of = [](const Tensor& x, const Tensor& w) { return sum(gelu(matmul(x, w)) * 2.0); };
  Tensor x = x0.clone().requires_grad_();
  Tensor w = w0.clone().requires_grad_();
  backward(loss_of(x, w));
  Tensor xs = x0.clone().requires_grad_();
  Tensor ws = w0.clone().requires_grad_();
  const Tensor loss = loss_of(xs, ws);
  const Tensor one = ones({}, DType::F64);
  run_backward(Var(loss), Var(one), BackwardOptions{.only = {Var(xs)}, .retain_graph = true});
  EXPECT_TRUE(allclose(xs.grad(), x.grad(), 1e-14, 1e-14));
  EXPECT_FALSE(ws.grad().defined());
  run_backward(Var(loss), Var(one), BackwardOptions{.only = {Var(ws)}});
  EXPECT_TRUE(allclose(ws.grad(), w.grad(), 1e-14, 1e-14));
  EXPECT_TRUE(allclose(xs.grad(), x.grad(), 1e-14, 1e-14));  // not accumulated twice
  // The second backward released the graph.
  expect_throws<Error>([&] { run_backward(Var(loss), Var(one)); }, {"already differentiated"});
}

TEST(OpTable, NoGradGuardRecordsNothingAndGradientsAccumulate) {
  const Tensor x = randn({3}, 1).requires_grad_();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(exp(x).requires_grad());
  }
  backward(sum(x * 2.0));
  backward(sum(x * 3.0));
  EXPECT_TRUE(allclose(x.grad(), full({3}, 5.0)));
}

}  // namespace
}  // namespace spmd
