// spmd/ops/shape.cpp: the entries of transpose, reshape, cat, stack, pad, narrow, select, permute,
// unsqueeze, squeeze, expand, repeat_interleave, clone, contiguous, triu, tril and to, and unpad.
//
// Sharding: transpose moves shards with their dims (Partial passes); reshape keeps a shard only
// when the reshape maps every rank's piece onto the piece the output placement gives it (first
// dim of a merged or split group, torch.chunk sizes agreeing), otherwise that mesh dim is
// gathered first (pytorch/pytorch#179502 let such views through silently); cat and stack keep
// shards of the other dims and Partials all inputs share; pad keeps shards of the other dims,
// P(avg), P(max) and P(min), and P(sum) only when padding with 0.
#include <algorithm>
#include <iterator>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {
namespace {

// ---- transpose ----------------------------------------------------------------------------------

OpMeta transpose_meta(std::span<const InputMeta> in, const OpArgs& args) {
  Shape shape = *in[0].shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t a = normalize_dim(args.ints.at(0), nd, "transpose", shape);
  const int64_t b = normalize_dim(args.ints.at(1), nd, "transpose", shape);
  std::swap(shape[static_cast<size_t>(a)], shape[static_cast<size_t>(b)]);
  return OpMeta{std::move(shape), in[0].dtype};
}

std::vector<OpStrategy> transpose_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int64_t nd = in[0]->ndim();
  const int x = static_cast<int>(normalize_dim(args.ints[0], nd, "transpose", in[0]->shape()));
  const int y = static_cast<int>(normalize_dim(args.ints[1], nd, "transpose", in[0]->shape()));
  return derived_strategies(in, [x, y](const Placement& p) -> std::optional<Placement> {
    if (is_shard(p, x)) return Shard{y};
    if (is_shard(p, y)) return Shard{x};
    return p;
  });
}

// ---- reshape ------------------------------------------------------------------------------------

OpMeta reshape_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& from = *in[0].shape;
  Shape to = args.ints;
  int64_t known = 1;
  int infer = -1;
  for (size_t d = 0; d < to.size(); ++d) {
    if (to[d] == -1 && infer < 0) {
      infer = static_cast<int>(d);
    } else if (to[d] < 0) {
      throw_error<ShapeError>("reshape: bad target shape {} for a tensor of shape {}",
                              shape_str(args.ints), shape_str(from));
    } else if (__builtin_mul_overflow(known, to[d], &known)) {
      throw_error<ShapeError>("reshape: target shape {} has too many elements (tensor of shape {})",
                              shape_str(args.ints), shape_str(from));
    }
  }
  const int64_t numel = shape_numel(from);
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      throw_error<ShapeError>("reshape: cannot infer -1 in {} for a tensor of shape {}",
                              shape_str(args.ints), shape_str(from));
    }
    to[static_cast<size_t>(infer)] = numel / known;
  }
  if (known != numel && infer < 0) {
    throw_error<ShapeError>("reshape: shape {} has {} elements, the tensor of shape {} has {}",
                            shape_str(args.ints), known, shape_str(from), numel);
  }
  return OpMeta{std::move(to), in[0].dtype};
}

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
bool reshape_group_matches(const ShardingSpec& in_spec, const ShardingSpec& out_spec,
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

std::vector<OpStrategy> reshape_strategies(ShardingInputs in, const OpArgs&, const OpMeta& meta) {
  const ShardingSpec& spec = *in[0];
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
    const ShardingSpec in_spec = spec.with_placements(required);
    const ShardingSpec out_spec(output, meta.shape, meta.dtype, spec.mesh_shape());
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

// One rank's piece reshaped to its own piece of the output (uneven pieces differ in shape).
Tensor reshape_piece(std::span<const Tensor> pieces, const OpArgs&, const PieceContext& where) {
  return pieces[0].reshape(where.local_shape);
}

// ---- cat and stack ------------------------------------------------------------------------------

OpMeta cat_meta(std::span<const InputMeta> in, const OpArgs& args) {
  if (in.empty()) throw_error<ShapeError>("cat: expects at least one tensor");
  const Shape& first = *in[0].shape;
  DType dtype = in[0].dtype;
  for (const InputMeta& m : in) dtype = promote_types(dtype, m.dtype, "cat");
  if (first.empty()) {
    throw_error<ShapeError>("cat: 0-d tensors cannot be concatenated (tensor 0 has shape [])");
  }
  const int64_t d =
      normalize_dim(args.ints.at(0), static_cast<int64_t>(first.size()), "cat", first);
  const auto ud = static_cast<size_t>(d);
  Shape shape = first;
  shape[ud] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = *in[i].shape;
    bool match = s.size() == shape.size();
    for (size_t j = 0; match && j < s.size(); ++j) match = j == ud || s[j] == shape[j];
    if (!match) {
      throw_error<ShapeError>(
          "cat: tensor {} has shape {} but tensor 0 has shape {} (sizes must match except along "
          "dim {})",
          i, shape_str(s), shape_str(first), d);
    }
    if (__builtin_add_overflow(shape[ud], s[ud], &shape[ud])) {
      throw_error<ShapeError>("cat: the result's dim {} overflows (tensor {} has shape {})", d, i,
                              shape_str(s));
    }
  }
  checked_numel(shape, "cat");
  return OpMeta{std::move(shape), dtype};
}

Tensor cat_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  for (const Tensor& t : in) kernels_for("cat", {&in[0], &t});
  const int64_t d = normalize_dim(args.ints[0], in[0].dim(), "cat", in[0].shape());
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  int64_t offset = 0;
  for (const Tensor& t : in) {
    result.narrow(d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }
  return result;
}

OpMeta stack_meta(std::span<const InputMeta> in, const OpArgs& args) {
  if (in.empty()) throw_error<ShapeError>("stack: expects at least one tensor");
  const Shape& first = *in[0].shape;
  DType dtype = in[0].dtype;
  for (size_t i = 0; i < in.size(); ++i) {
    if (*in[i].shape != first) {
      throw_error<ShapeError>("stack: tensor {} has shape {} but tensor 0 has shape {}", i,
                              shape_str(*in[i].shape), shape_str(first));
    }
    dtype = promote_types(dtype, in[i].dtype, "stack");
  }
  const int64_t d =
      normalize_dim(args.ints.at(0), static_cast<int64_t>(first.size()) + 1, "stack", first);
  Shape shape = first;
  shape.insert(shape.begin() + d, static_cast<int64_t>(in.size()));
  checked_numel(shape, "stack");
  return OpMeta{std::move(shape), dtype};
}

Tensor stack_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  for (const Tensor& t : in) kernels_for("stack", {&in[0], &t});
  const int64_t d = normalize_dim(args.ints[0], in[0].dim() + 1, "stack", in[0].shape());
  Tensor result = empty(out.shape, out.dtype, in[0].device());
  for (size_t i = 0; i < in.size(); ++i) result.select(d, static_cast<int64_t>(i)).copy_(in[i]);
  return result;
}

// Every input shards the same way, never along `skip` (the joined dim); `shift` maps an input dim
// to the output's (stack inserts a dim). Partial passes when every input has the same linear one.
std::vector<OpStrategy> join_strategies(ShardingInputs in, int64_t skip, int64_t inserted) {
  const size_t n = in.size();
  const int nd = static_cast<int>(in[0]->ndim());
  auto all = [&](Placement p) { return std::vector<Placement>(n, p); };
  std::vector<DimOption> options = {{all(Replicate{}), Replicate{}}};
  for (int d = 0; d < nd; ++d) {
    if (d == skip) continue;
    const int out = inserted >= 0 && d >= inserted ? d + 1 : d;
    options.push_back({all(Shard{d}), Shard{out}});
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
    options.push_back({all(Partial{op}), Partial{op}});
  return expand_dim_options(in, options);
}

// ---- pad ----------------------------------------------------------------------------------------

OpMeta pad_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const int64_t d =
      normalize_dim(args.ints.at(0), static_cast<int64_t>(shape.size()), "pad", shape);
  const int64_t before = args.ints.at(1);
  const int64_t after = args.ints.at(2);
  if (before < 0 || after < 0) {
    throw_error<ShapeError>("pad: before {} and after {} must be non-negative (dim {}, shape {})",
                            before, after, d, shape_str(shape));
  }
  Shape out = shape;
  int64_t& n = out[static_cast<size_t>(d)];
  if (__builtin_add_overflow(n, before, &n) || __builtin_add_overflow(n, after, &n)) {
    throw_error<ShapeError>("pad: dim {} of shape {} padded by {} and {} overflows", d,
                            shape_str(shape), before, after);
  }
  checked_numel(out, "pad");
  check_fill_value(args.reals.at(0), in[0].dtype, "pad");
  return OpMeta{std::move(out), in[0].dtype};
}

Tensor pad_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  const Tensor& t = in[0];
  kernels_for("pad", {&t});
  const int64_t d = normalize_dim(args.ints[0], t.dim(), "pad", t.shape());
  const int64_t before = args.ints[1];
  const int64_t after = args.ints[2];
  const double value = args.reals.at(0);
  const int64_t size = t.size(d);
  Tensor result = empty(out.shape, out.dtype, t.device());
  result.narrow(d, 0, before).fill_(value);
  result.narrow(d, before + size, after).fill_(value);
  result.narrow(d, before, size).copy_(t);
  return result;
}

std::vector<OpStrategy> pad_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(normalize_dim(args.ints[0], in[0]->ndim(), "pad", in[0]->shape()));
  const bool zero = args.reals.at(0) == 0.0;
  return derived_strategies(in, [d, zero](const Placement& p) -> std::optional<Placement> {
    if (is_shard(p, d)) return std::nullopt;
    if (const Partial* q = std::get_if<Partial>(&p)) {
      if (q->op == ReduceOp::Sum && !zero) return std::nullopt;
      if (q->op == ReduceOp::Product) return std::nullopt;
    }
    return p;
  });
}

// ---- narrow, select
// ------------------------------------------------------------------------------

int64_t dim_arg(const OpArgs& args, size_t i, int64_t ndim, std::string_view op,
                const Shape& shape) {
  return normalize_dim(args.ints.at(i), ndim, op, shape);
}

OpMeta narrow_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const int64_t d = dim_arg(args, 0, static_cast<int64_t>(shape.size()), "narrow", shape);
  const int64_t start = args.ints.at(1);
  const int64_t length = args.ints.at(2);
  const int64_t size = shape[static_cast<size_t>(d)];
  if (start < 0 || length < 0 || start > size - length) {
    throw_error<ShapeError>(
        "narrow: start {} and length {} are out of bounds for dim {} of size {} (shape {})", start,
        length, d, size, shape_str(shape));
  }
  Shape out = shape;
  out[static_cast<size_t>(d)] = length;
  return OpMeta{std::move(out), in[0].dtype};
}

OpMeta select_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const int64_t d = dim_arg(args, 0, static_cast<int64_t>(shape.size()), "select", shape);
  const int64_t size = shape[static_cast<size_t>(d)];
  const int64_t index = args.ints.at(1);
  if (index < -size || index >= size) {
    throw_error<ShapeError>("select: index {} is out of range for dim {} of size {} (shape {})",
                            index, d, size, shape_str(shape));
  }
  Shape out = shape;
  out.erase(out.begin() + d);
  return OpMeta{std::move(out), in[0].dtype};
}

// Keeps every placement but a Shard of dim d (gathered first); Partials pass (taking elements
// commutes with every elementwise reduction). `removed`: dim d disappears (select).
std::vector<OpStrategy> take_strategies(ShardingInputs in, int d, bool removed) {
  return derived_strategies(in, [d, removed](const Placement& p) -> std::optional<Placement> {
    if (const Shard* s = std::get_if<Shard>(&p)) {
      if (s->dim == d) return std::nullopt;
      if (removed && s->dim > d) return Shard{s->dim - 1};
    }
    return p;
  });
}

// ---- permute, unsqueeze, squeeze, expand --------------------------------------------------------

std::vector<int64_t> permutation(const OpArgs& args, const Shape& shape) {
  const int64_t n = static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  std::vector<bool> seen(shape.size(), false);
  bool ok = static_cast<int64_t>(args.ints.size()) == n;
  for (size_t i = 0; ok && i < args.ints.size(); ++i) {
    const int64_t d = args.ints[i] < 0 ? args.ints[i] + n : args.ints[i];
    ok = d >= 0 && d < n && !seen[static_cast<size_t>(d)];
    if (ok) {
      seen[static_cast<size_t>(d)] = true;
      dims.push_back(d);
    }
  }
  if (!ok) {
    throw_error<ShapeError>("permute: dims {} are not a permutation of the {} dims of shape {}",
                            shape_str(args.ints), n, shape_str(shape));
  }
  return dims;
}

OpMeta permute_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  Shape out;
  for (int64_t d : permutation(args, shape)) out.push_back(shape[static_cast<size_t>(d)]);
  return OpMeta{std::move(out), in[0].dtype};
}

OpMeta unsqueeze_meta(std::span<const InputMeta> in, const OpArgs& args) {
  Shape out = *in[0].shape;
  const int64_t d = dim_arg(args, 0, static_cast<int64_t>(out.size()) + 1, "unsqueeze", out);
  out.insert(out.begin() + d, 1);
  return OpMeta{std::move(out), in[0].dtype};
}

OpMeta squeeze_meta(std::span<const InputMeta> in, const OpArgs& args) {
  Shape out = *in[0].shape;
  const int64_t d =
      dim_arg(args, 0, std::max<int64_t>(static_cast<int64_t>(out.size()), 1), "squeeze", out);
  if (!out.empty() && out[static_cast<size_t>(d)] == 1) out.erase(out.begin() + d);
  return OpMeta{std::move(out), in[0].dtype};
}

OpMeta expand_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const Shape& want = args.ints;
  if (want.size() < shape.size()) {
    throw_error<ShapeError>("expand: target shape {} has fewer dims than the input's shape {}",
                            shape_str(want), shape_str(shape));
  }
  const size_t lead = want.size() - shape.size();
  Shape out(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const int64_t have = i < lead ? 1 : shape[i - lead];
    if (i >= lead && (want[i] == -1 || want[i] == have)) {
      out[i] = have;
    } else if (have == 1 && want[i] >= 0) {
      out[i] = want[i];
    } else {
      throw_error<ShapeError>("expand: cannot expand shape {} to {} (dim {}: size {} to {})",
                              shape_str(shape), shape_str(want), i, have, want[i]);
    }
  }
  checked_numel(out, "expand");
  return OpMeta{std::move(out), in[0].dtype};
}

std::vector<OpStrategy> permute_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const std::vector<int64_t> dims = permutation(args, in[0]->shape());
  return derived_strategies(in, [&dims](const Placement& p) -> std::optional<Placement> {
    if (const Shard* s = std::get_if<Shard>(&p)) {
      const auto it = std::find(dims.begin(), dims.end(), s->dim);
      return Shard{static_cast<int>(it - dims.begin())};
    }
    return p;
  });
}

std::vector<OpStrategy> unsqueeze_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int64_t d = dim_arg(args, 0, in[0]->ndim() + 1, "unsqueeze", in[0]->shape());
  return derived_strategies(in, [d](const Placement& p) -> std::optional<Placement> {
    if (const Shard* s = std::get_if<Shard>(&p); s != nullptr && s->dim >= d) {
      return Shard{s->dim + 1};
    }
    return p;
  });
}

std::vector<OpStrategy> squeeze_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  const Shape& shape = in[0]->shape();
  if (out.shape.size() == shape.size())
    return derived_strategies(in, [](const Placement& p) { return std::optional<Placement>(p); });
  // The squeezed dim: the first size-1 dim the output lacks.
  int64_t d = 0;
  while (d < static_cast<int64_t>(out.shape.size()) &&
         out.shape[static_cast<size_t>(d)] == shape[static_cast<size_t>(d)]) {
    ++d;
  }
  return take_strategies(in, static_cast<int>(d), true);
}

std::vector<OpStrategy> expand_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  const Shape& shape = in[0]->shape();
  const int lead = static_cast<int>(out.shape.size() - shape.size());
  return derived_strategies(in, [&](const Placement& p) -> std::optional<Placement> {
    if (const Shard* s = std::get_if<Shard>(&p)) {
      // A dim that grows from size 1 cannot stay sharded.
      if (shape[static_cast<size_t>(s->dim)] != out.shape[static_cast<size_t>(s->dim + lead)]) {
        return std::nullopt;
      }
      return Shard{s->dim + lead};
    }
    return p;
  });
}

// ---- clone, to_dtype
// ------------------------------------------------------------------------------

std::vector<OpStrategy> keep_placements(ShardingInputs in, const OpArgs&, const OpMeta&) {
  return derived_strategies(in, [](const Placement& p) { return std::optional<Placement>(p); });
}

OpMeta to_dtype_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const int64_t code = args.ints.at(0);
  if (code < 0 || code >= static_cast<int64_t>(std::size(kAllDTypes))) {
    throw_error<Unsupported>(
        "to: DType({}) is not a dtype (f32, f64, bf16, f16, i32, i64, bool, f8e4m3fn, f8e5m2; the "
        "input is {} {})",
        code, shape_str(*in[0].shape), in[0].dtype);
  }
  return OpMeta{*in[0].shape, static_cast<DType>(code)};
}

// A cast keeps a Partial when it is exact per element: a widening float cast, or max/min
// (monotone); a sum or average reduced in the narrower dtype would round differently.
std::vector<OpStrategy> to_dtype_strategies(ShardingInputs in, const OpArgs&, const OpMeta& out) {
  const DType from = in[0]->dtype();
  // float8 promotes with nothing (Note [Type promotion]), yet float8 to any wider float is exact.
  const bool widening = is_floating(from) && is_floating(out.dtype) && !is_float8(out.dtype) &&
                        (is_float8(from) || promote_types(from, out.dtype) == out.dtype);
  // A float8 result keeps no Partial: float8 values are not reduced (Note [Float8 ops]).
  const bool to_float8 = is_float8(out.dtype);
  return derived_strategies(in,
                            [widening, to_float8](const Placement& p) -> std::optional<Placement> {
                              if (const Partial* q = std::get_if<Partial>(&p)) {
                                if (to_float8 || (!widening && !is_min_max(q->op)))
                                  return std::nullopt;
                              }
                              return p;
                            });
}

// ---- triu, tril
// ------------------------------------------------------------------------------------
// args.ints = [diagonal]. The last two dims are a matrix (row i, column j): triu keeps j - i >= k,
// tril keeps j - i <= k, the rest becomes 0. Every placement passes: a piece knows its block's
// global row and column offsets (PieceContext), and the zeros are the same on every rank, so every
// Partial passes too.

template <bool upper>
constexpr std::string_view triangle_name() {
  return upper ? "triu" : "tril";
}

template <bool upper>
OpMeta triangle_meta(std::span<const InputMeta> in, const OpArgs&) {
  const Shape& shape = *in[0].shape;
  if (shape.size() < 2) {
    throw_error<ShapeError>("{}: the input must have at least 2 dims (a matrix), got shape {}",
                            triangle_name<upper>(), shape_str(shape));
  }
  return OpMeta{shape, in[0].dtype};
}

// The triangle of `x`, a block whose element (0, 0) is the global matrix's (row, col).
template <bool upper>
Tensor triangle_block(const Tensor& x, int64_t k, int64_t row, int64_t col) {
  DeviceOps& kernels = kernels_for(triangle_name<upper>(), {&x});
  const int64_t rows = x.size(-2);
  const int64_t cols = x.size(-1);
  std::vector<bool> keep(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t diagonal = (col + j) - (row + i);
      keep[static_cast<size_t>(i * cols + j)] = upper ? diagonal >= k : diagonal <= k;
    }
  }
  const Tensor mask = from_vector(keep, {rows, cols}).to(x.device()).expand(x.shape());
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  kernels.where(out, mask, x, full({}, 0.0, x.dtype(), x.device()).expand(x.shape()));
  return out;
}

template <bool upper>
Tensor triangle_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  return triangle_block<upper>(in[0], args.ints.at(0), 0, 0);
}

template <bool upper>
Tensor triangle_piece(std::span<const Tensor> pieces, const OpArgs& args,
                      const PieceContext& where) {
  const Shape offset = where.output.local_offset(where.coordinate);
  return triangle_block<upper>(pieces[0], args.ints.at(0), offset[offset.size() - 2],
                               offset.back());
}

// ---- backward
// --------------------------------------------------------------------------------------

Var unsqueeze_var(const Var& v, int64_t d) {
  return apply(op::unsqueeze, {v}, {{d}, {}});
}

// The gradient of a piece [start, start + length) of dim d: zeros around it.
Var pad_var(const Var& g, int64_t d, int64_t before, int64_t after) {
  return apply(op::pad, {g}, {{d, before, after}, {0.0}});
}

void transpose_backward(BackwardContext& c) {
  c.set_grad(0, apply(op::transpose, {c.grad()}, c.args()));
}

void reshape_backward(BackwardContext& c) {
  c.set_grad(0, apply(op::reshape, {c.grad()}, {var_shape(c.input(0)), {}}));
}

void narrow_backward(BackwardContext& c) {
  const Shape& shape = var_shape(c.input(0));
  const int64_t d = dim_arg(c.args(), 0, static_cast<int64_t>(shape.size()), "narrow", shape);
  const int64_t start = c.args().ints[1];
  const int64_t length = c.args().ints[2];
  c.set_grad(0, pad_var(c.grad(), d, start, shape[static_cast<size_t>(d)] - start - length));
}

void select_backward(BackwardContext& c) {
  const Shape& shape = var_shape(c.input(0));
  const int64_t d = dim_arg(c.args(), 0, static_cast<int64_t>(shape.size()), "select", shape);
  const int64_t size = shape[static_cast<size_t>(d)];
  int64_t index = c.args().ints[1];
  if (index < 0) index += size;
  c.set_grad(0, pad_var(unsqueeze_var(c.grad(), d), d, index, size - index - 1));
}

void permute_backward(BackwardContext& c) {
  const std::vector<int64_t> dims = permutation(c.args(), var_shape(c.input(0)));
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  c.set_grad(0, apply(op::permute, {c.grad()}, {inverse, {}}));
}

void unsqueeze_backward(BackwardContext& c) {
  c.set_grad(0, apply(op::reshape, {c.grad()}, {var_shape(c.input(0)), {}}));
}

void expand_backward(BackwardContext& c) {
  c.set_grad(0, sum_to(c.grad(), var_shape(c.input(0))));
}

void identity_backward(BackwardContext& c) {
  c.set_grad(0, c.grad());
}

template <bool upper>
void triangle_backward(BackwardContext& c) {
  c.set_grad(0, apply(upper ? op::triu : op::tril, {c.grad()}, c.args()));
}

void to_dtype_backward(BackwardContext& c) {
  c.set_grad(0,
             apply(op::to_dtype, {c.grad()}, {{static_cast<int64_t>(var_dtype(c.input(0)))}, {}}));
}

void cat_backward(BackwardContext& c) {
  const Shape& first = var_shape(c.input(0));
  const int64_t d = dim_arg(c.args(), 0, static_cast<int64_t>(first.size()), "cat", first);
  int64_t offset = 0;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const int64_t size = var_shape(c.input(i))[static_cast<size_t>(d)];
    if (c.needs_grad(i)) c.set_grad(i, apply(op::narrow, {c.grad()}, {{d, offset, size}, {}}));
    offset += size;
  }
}

void stack_backward(BackwardContext& c) {
  const Shape& first = var_shape(c.input(0));
  const int64_t d = dim_arg(c.args(), 0, static_cast<int64_t>(first.size()) + 1, "stack", first);
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.needs_grad(i)) {
      c.set_grad(i, apply(op::select, {c.grad()}, {{d, static_cast<int64_t>(i)}, {}}));
    }
  }
}

void pad_backward(BackwardContext& c) {
  const Shape& shape = var_shape(c.input(0));
  const int64_t d = dim_arg(c.args(), 0, static_cast<int64_t>(shape.size()), "pad", shape);
  c.set_grad(
      0, apply(op::narrow, {c.grad()}, {{d, c.args().ints[1], shape[static_cast<size_t>(d)]}, {}}));
}

}  // namespace

const OpDef op::transpose{
    .name = "transpose",
    .meta = transpose_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].transpose(args.ints[0], args.ints[1]); },
    .strategies = transpose_strategies,
    .backward = transpose_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::reshape{
    .name = "reshape",
    .meta = reshape_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs&,
                  const OpMeta& out) { return in[0].reshape(out.shape); },
    .strategies = reshape_strategies,
    .piece = reshape_piece,
    .backward = reshape_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::cat{
    .name = "cat",
    .meta = cat_meta,
    .compute = cat_compute,
    .strategies =
        [](ShardingInputs in, const OpArgs& args, const OpMeta&) {
          const int64_t d = normalize_dim(args.ints[0], in[0]->ndim(), "cat");
          return join_strategies(in, d, -1);
        },
    .backward = cat_backward,
    .partial_use = PartialUse::All,
    .float8 = true,
};

const OpDef op::stack{
    .name = "stack",
    .meta = stack_meta,
    .compute = stack_compute,
    .strategies =
        [](ShardingInputs in, const OpArgs& args, const OpMeta&) {
          const int64_t d = normalize_dim(args.ints[0], in[0]->ndim() + 1, "stack");
          return join_strategies(in, -1, d);
        },
    .backward = stack_backward,
    .partial_use = PartialUse::All,
    .float8 = true,
};

const OpDef op::pad{
    .name = "pad",
    .meta = pad_meta,
    .compute = pad_compute,
    .strategies = pad_strategies,
    .backward = pad_backward,
    .partial_use = PartialUse::Unary,
    .float8 = true,
};

const OpDef op::narrow{
    .name = "narrow",
    .meta = narrow_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].narrow(args.ints[0], args.ints[1], args.ints[2]); },
    .strategies =
        [](ShardingInputs in, const OpArgs& args, const OpMeta&) {
          return take_strategies(
              in, static_cast<int>(dim_arg(args, 0, in[0]->ndim(), "narrow", in[0]->shape())),
              false);
        },
    .backward = narrow_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::select{
    .name = "select",
    .meta = select_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].select(args.ints[0], args.ints[1]); },
    .strategies =
        [](ShardingInputs in, const OpArgs& args, const OpMeta&) {
          return take_strategies(
              in, static_cast<int>(dim_arg(args, 0, in[0]->ndim(), "select", in[0]->shape())),
              true);
        },
    .backward = select_backward,
    .partial_use = PartialUse::Unary,
    .float8 = true,
};

const OpDef op::permute{
    .name = "permute",
    .meta = permute_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].permute(args.ints); },
    .strategies = permute_strategies,
    .backward = permute_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::unsqueeze{
    .name = "unsqueeze",
    .meta = unsqueeze_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].unsqueeze(args.ints[0]); },
    .strategies = unsqueeze_strategies,
    .backward = unsqueeze_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::squeeze{
    .name = "squeeze",
    .meta = squeeze_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].squeeze(args.ints[0]); },
    .strategies = squeeze_strategies,
    .backward = unsqueeze_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::expand{
    .name = "expand",
    .meta = expand_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs& args,
                  const OpMeta&) { return in[0].expand(args.ints); },
    .strategies = expand_strategies,
    .piece =  // A piece expands to its own piece of the output (sharded dims are local).
    [](std::span<const Tensor> pieces, const OpArgs&, const PieceContext& where) {
      return pieces[0].expand(where.local_shape);
    },
    .backward = expand_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

// ---- repeat_interleave --------------------------------------------------------------------------
// torch.repeat_interleave(x, repeats, dim) for an integer repeats: out[..., j, ...] = x[..., j / r,
// ...] along dim. args.ints = [repeats, dim]; its backward entry (grad) sums each group of r rows,
// args.ints = [repeats, dim, size] (size: x's dim, so repeats 0 knows it). Sharding: other dims
// pass, every Partial passes (each element is a copy), and dim sharded passes when x's size along
// it divides evenly over the mesh dims that shard it: every block then starts at a multiple of
// the block size, so block c of the output holds exactly the copies of block c of x.

namespace {

constexpr std::string_view kRepeat = "repeat_interleave";

OpMeta repeat_interleave_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& x = *in[0].shape;
  const int64_t r = args.ints.at(0);
  if (r < 0) {
    throw_error<ShapeError>("{}: repeats must be >= 0, got {} (shape {})", kRepeat, r,
                            shape_str(x));
  }
  if (x.empty()) throw_error<ShapeError>("{}: expects at least one dim, got shape []", kRepeat);
  const int64_t d = normalize_dim(args.ints.at(1), static_cast<int64_t>(x.size()), kRepeat, x);
  Shape out = x;
  out[static_cast<size_t>(d)] *= r;
  checked_numel(out, kRepeat);
  return OpMeta{std::move(out), in[0].dtype};
}

OpMeta repeat_interleave_backward_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& g = *in[0].shape;
  const int64_t d = normalize_dim(args.ints.at(1), static_cast<int64_t>(g.size()), kRepeat, g);
  Shape out = g;
  out[static_cast<size_t>(d)] = args.ints.at(2);
  return OpMeta{std::move(out), in[0].dtype};
}

Tensor repeat_interleave_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  const Tensor& x = in[0];
  const int64_t d = normalize_dim(args.ints[1], x.dim(), kRepeat, x.shape());
  Shape expanded = x.shape();
  expanded.insert(expanded.begin() + d + 1, args.ints[0]);
  Shape out = x.shape();
  out[static_cast<size_t>(d)] *= args.ints[0];
  return x.unsqueeze(d + 1).expand(expanded).contiguous().reshape(out);
}

// The sum of each group of r rows of the gradient, into `out` (x's shape, or its piece's).
Tensor repeat_interleave_backward_run(const Tensor& g, const OpArgs& args, const Shape& out) {
  const int64_t r = args.ints[0];
  const int64_t d = normalize_dim(args.ints[1], g.dim(), kRepeat, g.shape());
  if (r == 0) return zeros(out, g.dtype(), g.device());
  Shape groups = out;
  groups.insert(groups.begin() + d + 1, r);
  return sum(g.contiguous().reshape(groups), {d + 1});
}

// Whether x's size along d divides evenly over the mesh dims whose placement shards d.
bool even_along(const ShardingSpec& spec, int64_t d, int64_t size) {
  int64_t parts = 1;
  for (size_t i = 0; i < spec.placements().size(); ++i) {
    if (is_shard(spec.placements()[i], static_cast<int>(d))) parts *= spec.mesh_shape()[i];
  }
  return size % parts == 0;
}

template <bool backward>
std::vector<OpStrategy> repeat_interleave_strategies(ShardingInputs in, const OpArgs& args,
                                                     const OpMeta&) {
  const ShardingSpec& spec = *in[0];
  const int64_t d = normalize_dim(args.ints.at(1), spec.ndim(), kRepeat, spec.shape());
  const int64_t size = backward ? args.ints.at(2) : spec.shape()[static_cast<size_t>(d)];
  const bool even = even_along(spec, d, size);
  return derived_strategies(in, [&](const Placement& p) -> std::optional<Placement> {
    if (is_shard(p, static_cast<int>(d)) && !even) return std::nullopt;
    if (const Partial* q = std::get_if<Partial>(&p);
        backward && q != nullptr && !is_linear(q->op)) {
      return std::nullopt;
    }
    return p;
  });
}

void repeat_interleave_grad(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  const Shape& x = var_shape(c.input(0));
  const int64_t d = normalize_dim(c.args().ints.at(1), static_cast<int64_t>(x.size()), kRepeat, x);
  c.set_grad(0, apply(op::repeat_interleave_backward, {c.grad()},
                      {{c.args().ints.at(0), d, x[static_cast<size_t>(d)]}, {}}));
}

}  // namespace

const OpDef op::repeat_interleave{
    .name = "repeat_interleave",
    .meta = repeat_interleave_meta,
    .compute = repeat_interleave_compute,
    .strategies = repeat_interleave_strategies<false>,
    .backward = repeat_interleave_grad,
    .partial_use = PartialUse::Unary,
};

const OpDef op::repeat_interleave_backward{
    .name = "repeat_interleave_backward",
    .meta = repeat_interleave_backward_meta,
    .compute =
        [](std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
          return repeat_interleave_backward_run(in[0], args, out.shape);
        },
    .strategies = repeat_interleave_strategies<true>,
    .piece =
        [](std::span<const Tensor> pieces, const OpArgs& args, const PieceContext& where) {
          return repeat_interleave_backward_run(pieces[0], args, where.local_shape);
        },
    .partial_use = PartialUse::Unary,
    .flops =
        [](std::span<const InputMeta> in, const OpMeta&) {
          return static_cast<double>(checked_numel(*in[0].shape, kRepeat));
        },
};

const OpDef op::clone{
    .name = "clone",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs&) {
          return OpMeta{*in[0].shape, in[0].dtype};
        },
    .compute = [](std::span<const Tensor> in, const OpArgs&,
                  const OpMeta&) { return in[0].clone(); },
    .strategies = keep_placements,
    .backward = identity_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::contiguous{
    .name = "contiguous",
    .meta =
        [](std::span<const InputMeta> in, const OpArgs&) {
          return OpMeta{*in[0].shape, in[0].dtype};
        },
    .compute = [](std::span<const Tensor> in, const OpArgs&,
                  const OpMeta&) { return in[0].contiguous(); },
    .strategies = keep_placements,
    .backward = identity_backward,
    .saves = kSavesNone,
    .float8 = true,
};

const OpDef op::triu{
    .name = "triu",
    .meta = triangle_meta<true>,
    .compute = triangle_compute<true>,
    .strategies = keep_placements,
    .piece = triangle_piece<true>,
    .backward = triangle_backward<true>,
};
const OpDef op::tril{
    .name = "tril",
    .meta = triangle_meta<false>,
    .compute = triangle_compute<false>,
    .strategies = keep_placements,
    .piece = triangle_piece<false>,
    .backward = triangle_backward<false>,
};

const OpDef op::to_dtype{
    .name = "to",
    .meta = to_dtype_meta,
    .compute = [](std::span<const Tensor> in, const OpArgs&,
                  const OpMeta& out) { return in[0].to(out.dtype); },
    .strategies = to_dtype_strategies,
    .backward = to_dtype_backward,
    .partial_use = PartialUse::Unary,
    .saves = kSavesNone,
    .float8 = true,
};

Shape flattened_shape(const Shape& shape, int64_t start, int64_t end) {
  const int64_t nd = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  start = normalize_dim(start, nd, "flatten", shape);
  end = normalize_dim(end, nd, "flatten", shape);
  if (start > end) {
    throw_error<ShapeError>("flatten: start dim {} comes after end dim {} (shape {})", start, end,
                            shape_str(shape));
  }
  if (shape.empty()) return {1};
  Shape out(shape.begin(), shape.begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= shape[static_cast<size_t>(d)];
  out.push_back(merged);
  out.insert(out.end(), shape.begin() + end + 1, shape.end());
  return out;
}

std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t size,
                                                      const std::vector<int64_t>& sizes,
                                                      std::string_view op) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int64_t n : sizes) {
    if (n < 0) break;
    out.emplace_back(start, n);
    start += n;
  }
  if (out.size() != sizes.size() || start != size) {
    throw_error<ShapeError>("{}: sizes {} do not split a dim of size {}", op, shape_str(sizes),
                            size);
  }
  return out;
}

std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t d) {
  std::vector<Tensor> out;
  for (const auto& [start, length] : split_ranges(t.size(d), sizes, "split")) {
    out.push_back(narrow(t, d, start, length));
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t d) {
  return t.chunk(chunks, d);
}

Tensor unpad(const Tensor& t, int64_t d, int64_t before, int64_t after) {
  // A view: shape-only tensors need no kernels (Note [Shape-only tensors] in tensor/meta.h).
  if (!t.is_meta()) kernels_for("unpad", {&t});
  d = normalize_dim(d, t.dim(), "unpad", t.shape());
  const int64_t size = t.size(d);
  if (before < 0 || after < 0 || before > size - after) {
    throw_error<ShapeError>(
        "unpad: cannot remove {} + {} elements from dim {} of size {} (shape {})", before, after, d,
        size, shape_str(t.shape()));
  }
  return t.narrow(d, before, size - before - after);
}

}  // namespace spmd
