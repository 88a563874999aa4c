// spmd/ops/sort.cpp: the entries that order, scan and count: topk_indices and sort_indices (the
// indices of topk, sort and argsort, whose values are gathered with them), cumsum, one_hot and
// bincount.
//
// Note [Ordering ties]
// sort and topk order the elements of each lane along dim by value with NaN above every number
// (as torch), and equal values (NaNs among themselves) by position, the lower index first, in
// either direction: sort is stable (torch's stable=True), and topk picks the lower index among
// equal values at the cut and lists it first. topk's `sorted = false` gives the same order (torch
// leaves the order unspecified then). The order is computed on the host (a device tensor is
// copied to the CPU and its indices back), so no device kernel is needed; values are then
// gather(x, dim, indices), whose backward carries the gradient.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace {

// The dim along which an op works, normalized (a 0-d tensor takes 0 and -1).
int64_t op_dim(int64_t d, const Shape& shape, std::string_view op) {
  return normalize_dim(d, std::max<int64_t>(static_cast<int64_t>(shape.size()), 1), op, shape);
}

// A contiguous tensor of `shape` seen as [outer, n, inner] around `dim`.
struct Lanes {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
};

Lanes lanes(const Shape& shape, int64_t dim) {
  Lanes l;
  for (int64_t k = 0; k < static_cast<int64_t>(shape.size()); ++k) {
    const int64_t s = shape[static_cast<size_t>(k)];
    if (k < dim) l.outer *= s;
    if (k == dim) l.n = s;
    if (k > dim) l.inner *= s;
  }
  return l;
}

// The strategies of an op that works along `dim` of its one input: shards of other dims pass,
// `dim` is gathered, a Partial is reduced first unless `linear` (then P(sum) and P(avg) pass).
std::vector<OpStrategy> along_dim_strategies(ShardingInputs in, int64_t dim, bool linear) {
  return derived_strategies(in, [dim, linear](const Placement& p) -> std::optional<Placement> {
    if (const Partial* q = std::get_if<Partial>(&p); q != nullptr) {
      if (linear && is_linear(q->op)) return p;
      return std::nullopt;
    }
    if (is_shard(p, static_cast<int>(dim))) return std::nullopt;
    return p;
  });
}

// ---- topk_indices and sort_indices --------------------------------------------------------------
// topk_indices: args.ints = [dim, k, largest, sorted]; sort_indices: [dim, descending].

// a before b in the order (Note [Ordering ties]): NaN is the largest value.
template <class T>
bool before(T a, T b, bool descending) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return descending ? !std::isnan(b) : !std::isnan(a);
  }
  return descending ? a > b : a < b;
}

// The first `k` positions of every lane of `x` (contiguous, host) in the order.
template <class T>
void order_lanes(const T* x, int64_t* out, Lanes l, int64_t k, bool descending) {
  std::vector<int64_t> order(static_cast<size_t>(l.n));
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      const T* lane = x + o * l.n * l.inner + i;
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return before(lane[a * l.inner], lane[b * l.inner], descending);
      });
      for (int64_t j = 0; j < k; ++j)
        out[(o * k + j) * l.inner + i] = order[static_cast<size_t>(j)];
    }
  }
}

// The I64 indices of the first k elements along dim of every lane, on x's device.
Tensor ordered_indices(const Tensor& x, int64_t dim, int64_t k, bool descending,
                       const Shape& out_shape) {
  const Lanes l = lanes(x.shape(), dim);
  Tensor out = empty(out_shape, DType::I64);
  if (is_floating(x.dtype())) {
    const Tensor host = x.to(cpu()).to(DType::F64).contiguous();
    order_lanes(host.data<double>(), out.data<int64_t>(), l, k, descending);
  } else {
    const Tensor host = x.to(cpu()).to(DType::I64).contiguous();
    order_lanes(host.data<int64_t>(), out.data<int64_t>(), l, k, descending);
  }
  return out.to(x.device());
}

OpMeta topk_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (shape.empty()) {
    throw_error<ShapeError>("topk: the input must have at least one dim (shape [])");
  }
  if (in[0].dtype == DType::Bool) {
    throw_error<Unsupported>("topk: dtype bool is not supported (shape {})", shape_str(shape));
  }
  const int64_t d = op_dim(args.ints.at(0), shape, "topk");
  const int64_t k = args.ints.at(1);
  const int64_t size = shape[static_cast<size_t>(d)];
  if (k < 0 || k > size) {
    throw_error<ShapeError>("topk: k = {} lies outside [0, {}] (dim {} of shape {})", k, size, d,
                            shape_str(shape));
  }
  Shape out = shape;
  out[static_cast<size_t>(d)] = k;
  return OpMeta{std::move(out), DType::I64};
}

Tensor topk_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const int64_t d = op_dim(args.ints.at(0), in[0].shape(), "topk");
  return ordered_indices(in[0], d, args.ints.at(1), args.ints.at(2) != 0, out.shape);
}

std::vector<OpStrategy> topk_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  return along_dim_strategies(in, op_dim(args.ints.at(0), in[0]->shape(), "topk"), false);
}

OpMeta sort_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (shape.empty()) {
    throw_error<ShapeError>("sort: the input must have at least one dim (shape [])");
  }
  op_dim(args.ints.at(0), shape, "sort");
  return OpMeta{shape, DType::I64};
}

Tensor sort_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const int64_t d = op_dim(args.ints.at(0), in[0].shape(), "sort");
  return ordered_indices(in[0], d, in[0].size(d), args.ints.at(1) != 0, out.shape);
}

std::vector<OpStrategy> sort_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  return along_dim_strategies(in, op_dim(args.ints.at(0), in[0]->shape(), "sort"), false);
}

// ---- cumsum -------------------------------------------------------------------------------------
// args.ints = [dim, reverse] (reverse: the sums from the end, the backward's). Integer and Bool
// inputs give I64; floating ones keep their dtype, summed in double and rounded once per element
// (as torch's CPU kernel). Computed on the host.

OpMeta cumsum_meta(std::span<const InputMeta> in, const OpArgs& args) {
  op_dim(args.ints.at(0), *in[0].shape, "cumsum");
  return OpMeta{*in[0].shape, is_floating(in[0].dtype) ? in[0].dtype : DType::I64};
}

template <class T>
void scan_lanes(T* x, Lanes l, bool reverse) {
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      T* lane = x + o * l.n * l.inner + i;
      T acc = 0;
      for (int64_t j = 0; j < l.n; ++j) {
        const int64_t at = (reverse ? l.n - 1 - j : j) * l.inner;
        if constexpr (std::is_integral_v<T>) {
          // Integers wrap around, as torch's (and without signed overflow).
          acc = static_cast<T>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(lane[at]));
        } else {
          acc += lane[at];
        }
        lane[at] = acc;
      }
    }
  }
}

Tensor cumsum_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& x = in[0];
  const int64_t d = x.dim() == 0 ? 0 : op_dim(args.ints.at(0), x.shape(), "cumsum");
  const Lanes l = lanes(x.shape(), d);
  const bool reverse = args.ints.at(1) != 0;
  const DType acc = is_floating(out.dtype) ? DType::F64 : DType::I64;
  // clone: the host copy is the result's own buffer even when x already is a CPU F64/I64 tensor.
  Tensor host = x.to(cpu()).to(acc).contiguous().clone();
  if (acc == DType::F64) {
    scan_lanes(host.data<double>(), l, reverse);
  } else {
    scan_lanes(host.data<int64_t>(), l, reverse);
  }
  return host.to(out.dtype).to(x.device());
}

std::vector<OpStrategy> cumsum_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  return along_dim_strategies(in, op_dim(args.ints.at(0), in[0]->shape(), "cumsum"), true);
}

// The gradient of a cumsum is the cumsum of the gradient from the other end.
void cumsum_derivative(BackwardContext& c) {
  if (c.needs_grad(0)) {
    const OpArgs reversed{{c.args().ints.at(0), 1 - c.args().ints.at(1)}, {}};
    c.set_grad(0, apply(op::cumsum, {c.grad()}, reversed));
  }
}

double cumsum_flops(std::span<const InputMeta> in, const OpMeta&) {
  return static_cast<double>(checked_numel(*in[0].shape, "cumsum"));
}

// ---- one_hot and bincount -----------------------------------------------------------------------

// The smallest and largest value of the integer tensor x (not empty), on the host.
std::pair<int64_t, int64_t> value_range(const Tensor& x) {
  return {amin(x).to(DType::I64).item<int64_t>(), amax(x).to(DType::I64).item<int64_t>()};
}

// one_hot: args.ints = [num_classes]; input I64 of any shape -> [..., num_classes] I64.
OpMeta one_hot_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (in[0].dtype != DType::I64) {
    throw_error<Unsupported>("one_hot: the indices must be I64, got {} (shape {})", in[0].dtype,
                             shape_str(shape));
  }
  const int64_t classes = args.ints.at(0);
  if (classes < 0) {
    throw_error<ConfigError>("one_hot: num_classes must be >= 0, got {} (shape {})", classes,
                             shape_str(shape));
  }
  Shape out = shape;
  out.push_back(classes);
  checked_numel(out, "one_hot");
  return OpMeta{std::move(out), DType::I64};
}

Tensor one_hot_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  const Tensor& x = in[0];
  const int64_t classes = args.ints.at(0);
  if (x.numel() > 0) {
    const auto [lo, hi] = value_range(x);
    if (lo < 0) {
      throw_error<ShapeError>("one_hot: class {} is negative (shape {}, num_classes {})", lo,
                              shape_str(x.shape()), classes);
    }
    if (hi >= classes) {
      throw_error<ShapeError>("one_hot: class {} lies outside [0, {}) (shape {})", hi, classes,
                              shape_str(x.shape()));
    }
  }
  const Tensor classes_along = arange(classes, DType::I64).to(x.device());
  return eq(x.unsqueeze(-1), classes_along).to(DType::I64);
}

std::vector<OpStrategy> one_hot_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  return derived_strategies(in, [](const Placement& p) -> std::optional<Placement> {
    if (is_partial(p)) return std::nullopt;
    return p;
  });
}

// bincount: args.ints = [length]; input a 1-D integer tensor of values in [0, length) -> [length]
// I64 counts (bincount_length gives torch's length, max(minlength, max + 1)).
OpMeta bincount_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (!is_integral(in[0].dtype)) {
    throw_error<Unsupported>("bincount: the input must be an integer tensor, got {} (shape {})",
                             in[0].dtype, shape_str(shape));
  }
  if (shape.size() != 1) {
    throw_error<ShapeError>("bincount: the input must be 1-D, got shape {}", shape_str(shape));
  }
  const int64_t length = args.ints.at(0);
  if (length < 0) {
    throw_error<ConfigError>("bincount: minlength must be >= 0, got {} (shape {})", length,
                             shape_str(shape));
  }
  return OpMeta{{length}, DType::I64};
}

void check_bincount_values(const Tensor& x, int64_t length) {
  if (x.numel() == 0) return;
  const auto [lo, hi] = value_range(x);
  if (lo < 0) {
    throw_error<ConfigError>("bincount: the input must be non-negative, got {} (shape {})", lo,
                             shape_str(x.shape()));
  }
  if (hi >= length) {
    throw_error<ShapeError>("bincount: value {} lies outside the {} bins [0, {}) (shape {})", hi,
                            length, length, shape_str(x.shape()));
  }
}

Tensor bincount_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& x = in[0];
  const int64_t length = args.ints.at(0);
  check_bincount_values(x, length);
  // Counts below 2^53 are exact in F64.
  Tensor counts = zeros(out.shape, DType::F64, x.device());
  DeviceOps& kernels = kernels_for("bincount", {&x});
  const Tensor ones_like_x = full(x.shape(), 1.0, DType::F64, x.device());
  SPMD_CHECK(kernels.scatter_add(counts, 0, x.to(DType::I64), ones_like_x, 0, length));
  return counts.to(DType::I64);
}

// Each rank counts its piece of a sharded input into every bin: the counts add up (P(sum)).
std::vector<OpStrategy> bincount_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  const Placement R = Replicate{};
  return expand_dim_options(in, {{{R}, R}, {{Shard{0}}, Partial{}}});
}

}  // namespace

int64_t bincount_length(const Tensor& x, int64_t minlength) {
  if (minlength < 0) {
    throw_error<ConfigError>("bincount: minlength must be >= 0, got {} (shape {})", minlength,
                             shape_str(x.shape()));
  }
  // A shape-only run has no values (Note [Shape-only tensors]): minlength bins.
  if (x.numel() == 0 || !is_integral(x.dtype()) || x.is_meta()) return minlength;
  const auto [lo, hi] = value_range(x);
  if (lo < 0) {
    throw_error<ConfigError>("bincount: the input must be non-negative, got {} (shape {})", lo,
                             shape_str(x.shape()));
  }
  return std::max(minlength, hi + 1);
}

int64_t one_hot_classes(const Tensor& x, int64_t num_classes) {
  if (num_classes != -1) return num_classes;
  if (x.numel() == 0) {
    throw_error<ConfigError>(
        "one_hot: cannot infer num_classes from an empty tensor (shape {}): pass num_classes",
        shape_str(x.shape()));
  }
  if (x.dtype() != DType::I64) return 0;  // the entry's meta names the dtype
  if (x.is_meta()) {
    throw_error<ConfigError>(
        "one_hot: a shape-only run has no values to infer num_classes from (shape {}): pass it",
        shape_str(x.shape()));
  }
  return std::max<int64_t>(value_range(x).second + 1, 0);
}

const OpDef op::topk_indices{
    .name = "topk_indices",
    .meta = topk_meta,
    .compute = topk_compute,
    .strategies = topk_strategies,
};
const OpDef op::sort_indices{
    .name = "sort_indices",
    .meta = sort_meta,
    .compute = sort_compute,
    .strategies = sort_strategies,
};
const OpDef op::cumsum{
    .name = "cumsum",
    .meta = cumsum_meta,
    .compute = cumsum_compute,
    .strategies = cumsum_strategies,
    .backward = cumsum_derivative,
    .partial_use = PartialUse::Unary,
    .flops = cumsum_flops,
};
const OpDef op::one_hot{
    .name = "one_hot",
    .meta = one_hot_meta,
    .compute = one_hot_compute,
    .strategies = one_hot_strategies,
};
const OpDef op::bincount{
    .name = "bincount",
    .meta = bincount_meta,
    .compute = bincount_compute,
    .strategies = bincount_strategies,
};

}  // namespace spmd
