// spmd/ops/index.cpp: the entries that pick elements by index: index_select, gather and embedding,
// and the scatter-adds of their backward; the user's scatter_add, index_add and scatter.
//
// Note [Masked lookup]
// An index op whose table is sharded along the indexed dim runs on every rank with the whole
// index: each rank looks up the indices that fall in its block of the table (its piece's offset
// along that dim, PieceContext::inputs) and writes 0 for the others, so the ranks' results add up
// to the lookup on the full table: the output is P(sum). This is Megatron-LM's vocabulary-parallel
// embedding, and the gather of the target logit in its vocabulary-parallel cross-entropy. The
// backward scatters the gradient into the rows of the rank's own block (a gradient sharded like
// the table, without communication). The table rides along as the last input of the backward
// entries, unused by the math: its placements are what the gradient's strategy follows.
//
// Indices outside [0, size of the dim) are a ShapeError naming the op, the first such index (and,
// for gather, its position in the index tensor) and the size.
#include <algorithm>
#include <cmath>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace {

void check_indices(std::string_view op, const InputMeta& index, std::string_view what) {
  if (index.dtype != DType::I64 && index.dtype != DType::I32) {
    throw_error<Unsupported>("{}: the {} must be I64 or I32, got {} (shape {})", op, what,
                             index.dtype, shape_str(*index.shape));
  }
}

// Where an op's index tensor sits in the whole index, for messages: gather's index is the user's,
// so its positions are named (offset by the piece's `origin` in the global index); the others walk
// a derived index, so only the value is.
struct IndexSource {
  bool positional = false;
  Shape origin;  // empty: the index starts at 0
};

// ShapeError naming the first index of `index` (I64) outside [0, size), and where it is.
[[noreturn]] void out_of_range(std::string_view op, int64_t dim, int64_t size, const Shape& shape,
                               const Tensor& index, const IndexSource& source) {
  const Tensor host = index.to(cpu()).contiguous();
  const int64_t* p = host.data<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (p[i] >= 0 && p[i] < size) continue;
    std::string at;
    if (source.positional) {
      std::vector<int64_t> position = unravel_index(i, host.shape());
      for (size_t d = 0; d < source.origin.size() && d < position.size(); ++d) {
        position[d] += source.origin[d];
      }
      at = fmt::format(" at {}", shape_str(position));
    }
    throw_error<ShapeError>("{}: index {}{} lies outside [0, {}) (dim {} of shape {})", op, p[i],
                            at, size, dim, shape_str(shape));
  }
  throw_error<ShapeError>("{}: an index lies outside [0, {}) (dim {} of shape {})", op, size, dim,
                          shape_str(shape));
}

// The piece's offset along `dim` of sharded input `k`, and the input's global size there (the
// Tensor op: offset 0, its own size); `shape`, the whole input's, names it in messages.
struct Block {
  int64_t offset = 0;
  int64_t limit = 0;
  Shape shape;
};

Block input_block(const PieceContext* where, size_t k, int64_t dim, const Tensor& piece) {
  if (where == nullptr || where->inputs.empty()) return {0, piece.size(dim), piece.shape()};
  const ShardingSpec& spec = *where->inputs[k];
  return {spec.local_offset(where->coordinate)[static_cast<size_t>(dim)],
          spec.shape()[static_cast<size_t>(dim)], spec.shape()};
}

Block output_block(const PieceContext* where, int64_t dim, const Shape& shape) {
  if (where == nullptr) return {0, shape[static_cast<size_t>(dim)], shape};
  return {where->output.local_offset(where->coordinate)[static_cast<size_t>(dim)],
          where->output.shape()[static_cast<size_t>(dim)], where->output.shape()};
}

// The accumulation dtype of a scatter-add into `dtype`.
DType accumulation_dtype(DType dtype) {
  return dtype == DType::F64 ? DType::F64 : DType::F32;
}

// gather of `in` along `dim` into a new tensor of `shape` (index I64 of that shape).
Tensor gather_into(std::string_view op, const Tensor& in, int64_t dim, const Tensor& index,
                   const Shape& shape, Block block, const IndexSource& source = {}) {
  DeviceOps& kernels = kernels_for(op, {&in, &index});
  Tensor out = empty(shape, in.dtype(), in.device());
  if (!kernels.gather(out, in, dim, index, block.offset, block.limit)) {
    out_of_range(op, dim, block.limit, block.shape, index, source);
  }
  return out;
}

// Zeros of `shape` plus src scattered along `dim` (index I64 of src's shape), in src's dtype.
Tensor scatter_into(std::string_view op, const Tensor& src, int64_t dim, const Tensor& index,
                    const Shape& shape, Block block, const IndexSource& source = {}) {
  DeviceOps& kernels = kernels_for(op, {&src, &index});
  const DType acc = accumulation_dtype(src.dtype());
  Tensor out = zeros(shape, acc, src.device());
  if (!kernels.scatter_add(out, dim, index, src.to(acc), block.offset, block.limit)) {
    out_of_range(op, dim, block.limit, block.shape, index, source);
  }
  return out.to(src.dtype());
}

std::vector<Placement> all_of(size_t n, Placement p) {
  return std::vector<Placement>(n, p);
}

// ---- index_select -------------------------------------------------------------------------------
// args.ints = [dim]; inputs (x, index [n]).

int64_t select_dim(const OpArgs& args, const Shape& shape, std::string_view op) {
  return normalize_dim(args.ints.at(0), std::max<int64_t>(static_cast<int64_t>(shape.size()), 1),
                       op, shape);
}

OpMeta index_select_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  if (shape.empty()) {
    throw_error<ShapeError>("index_select: the input must have at least one dim (shape [])");
  }
  check_indices("index_select", in[1], "index");
  if (in[1].shape->size() != 1) {
    throw_error<ShapeError>("index_select: the index must be 1-D, got shape {} (input shape {})",
                            shape_str(*in[1].shape), shape_str(shape));
  }
  const int64_t d = select_dim(args, shape, "index_select");
  Shape out = shape;
  out[static_cast<size_t>(d)] = (*in[1].shape)[0];
  return OpMeta{std::move(out), in[0].dtype};
}

// The 1-D index viewed along `dim` of an `out`-shaped walk.
Tensor index_along(const Tensor& index, int64_t dim, const Shape& out) {
  Shape view(out.size(), 1);
  view[static_cast<size_t>(dim)] = index.numel();
  return index.to(DType::I64).reshape(view).expand(out);
}

Tensor index_select_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                        const PieceContext* where) {
  const int64_t d = select_dim(args, in[0].shape(), "index_select");
  return gather_into("index_select", in[0], d, index_along(in[1], d, out), out,
                     input_block(where, 0, d, in[0]));
}

std::vector<OpStrategy> index_select_strategies(ShardingInputs in, const OpArgs& args,
                                                const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[0]->shape(), "index_select"));
  std::vector<DimOption> options = {{{Replicate{}, Replicate{}}, Replicate{}}};
  for (int k = 0; k < static_cast<int>(in[0]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, Replicate{}}, Shard{k}});
  }
  options.push_back({{Replicate{}, Shard{0}}, Shard{d}});
  if (in[0]->dtype() != DType::Bool) options.push_back({{Shard{d}, Replicate{}}, Partial{}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    options.push_back({{Partial{o}, Replicate{}}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

void index_select_derivative(BackwardContext& c) {
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::index_select_backward, {c.grad(), c.input(1), c.input(0)}, c.args()));
  }
}

// (grad, index, x) -> the gradient of x: grad scattered into zeros of x's shape.
OpMeta scatter_meta(std::span<const InputMeta> in, const OpArgs&) {
  return OpMeta{*in[2].shape, in[0].dtype};
}

Tensor index_select_backward_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                                 const PieceContext* where) {
  const int64_t d = select_dim(args, out, "index_select");
  return scatter_into("index_select", in[0], d, index_along(in[1], d, in[0].shape()), out,
                      output_block(where, d, out));
}

std::vector<OpStrategy> index_select_backward_strategies(ShardingInputs in, const OpArgs& args,
                                                         const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[2]->shape(), "index_select"));
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(3, R), R}};
  for (int k = 0; k < static_cast<int>(in[2]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, R, Shard{k}}, Shard{k}});
  }
  options.push_back({{Shard{d}, Shard{0}, R}, Partial{}});
  options.push_back({{R, R, Shard{d}}, Shard{d}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg})
    options.push_back({{Partial{o}, R, R}, Partial{o}});
  return expand_dim_options(in, options);
}

// ---- gather -------------------------------------------------------------------------------------
// args.ints = [dim]; inputs (x, index), the index of x's rank with x's sizes except along dim.

OpMeta gather_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const Shape& index = *in[1].shape;
  check_indices("gather", in[1], "index");
  if (shape.empty() || index.size() != shape.size()) {
    throw_error<ShapeError>(
        "gather: the index (shape {}) must have as many dims as the input (shape {}), at least 1",
        shape_str(index), shape_str(shape));
  }
  const int64_t d = select_dim(args, shape, "gather");
  for (size_t k = 0; k < shape.size(); ++k) {
    if (static_cast<int64_t>(k) != d && index[k] != shape[k]) {
      throw_error<ShapeError>(
          "gather: the index (shape {}) must have the input's sizes (shape {}) on every dim but "
          "dim {}",
          shape_str(index), shape_str(shape), d);
    }
  }
  return OpMeta{index, in[0].dtype};
}

// gather's index as messages name it: positions in the whole index.
IndexSource gather_index_source(const PieceContext* where) {
  IndexSource source{true, {}};
  if (where != nullptr && where->inputs.size() > 1) {
    source.origin = where->inputs[1]->local_offset(where->coordinate);
  }
  return source;
}

Tensor gather_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                  const PieceContext* where) {
  const int64_t d = select_dim(args, in[0].shape(), "gather");
  return gather_into("gather", in[0], d, in[1].to(DType::I64), out, input_block(where, 0, d, in[0]),
                     gather_index_source(where));
}

std::vector<OpStrategy> gather_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[0]->shape(), "gather"));
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{{R, R}, R}};
  for (int k = 0; k < static_cast<int>(in[0]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, Shard{k}}, Shard{k}});
  }
  options.push_back({{R, Shard{d}}, Shard{d}});
  if (in[0]->dtype() != DType::Bool) options.push_back({{Shard{d}, R}, Partial{}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    options.push_back({{Partial{o}, R}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

void gather_derivative(BackwardContext& c) {
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::gather_backward, {c.grad(), c.input(1), c.input(0)}, c.args()));
  }
}

Tensor gather_backward_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                           const PieceContext* where) {
  const int64_t d = select_dim(args, out, "gather");
  return scatter_into("gather", in[0], d, in[1].to(DType::I64), out, output_block(where, d, out));
}

std::vector<OpStrategy> gather_backward_strategies(ShardingInputs in, const OpArgs& args,
                                                   const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[2]->shape(), "gather"));
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(3, R), R}};
  for (int k = 0; k < static_cast<int>(in[2]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, Shard{k}, Shard{k}}, Shard{k}});
  }
  options.push_back({{Shard{d}, Shard{d}, R}, Partial{}});
  options.push_back({{R, R, Shard{d}}, Shard{d}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg})
    options.push_back({{Partial{o}, R, R}, Partial{o}});
  return expand_dim_options(in, options);
}

// ---- embedding ----------------------------------------------------------------------------------
// inputs (ids [*], weight [V, D]) -> [*, D].

OpMeta embedding_meta(std::span<const InputMeta> in, const OpArgs&) {
  check_indices("embedding", in[0], "ids");
  const Shape& weight = *in[1].shape;
  if (weight.size() != 2) {
    throw_error<ShapeError>("embedding: the table must be 2-D [rows, dim], got shape {}",
                            shape_str(weight));
  }
  Shape out = *in[0].shape;
  out.push_back(weight[1]);
  checked_numel(out, "embedding");
  return OpMeta{std::move(out), in[1].dtype};
}

// The ids as the I64 index of a gather along dim 0 of an [N, D] walk.
Tensor row_index(const Tensor& ids, int64_t width) {
  return ids.to(DType::I64).reshape({ids.numel(), 1}).expand({ids.numel(), width});
}

Tensor embedding_run(std::span<const Tensor> in, const OpArgs&, const Shape& out,
                     const PieceContext* where) {
  const Tensor& ids = in[0];
  const Tensor& weight = in[1];
  const int64_t width = weight.size(1);
  const Tensor rows = gather_into("embedding", weight, 0, row_index(ids, width),
                                  {ids.numel(), width}, input_block(where, 1, 0, weight));
  return rows.view(out);
}

std::vector<OpStrategy> embedding_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  const int nd = static_cast<int>(in[0]->ndim());
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{{R, R}, R}};
  for (int k = 0; k < nd; ++k) options.push_back({{Shard{k}, R}, Shard{k}});
  options.push_back({{R, Shard{0}}, Partial{}});
  options.push_back({{R, Shard{1}}, Shard{nd}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    options.push_back({{R, Partial{o}}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

void embedding_derivative(BackwardContext& c) {
  if (c.needs_grad(1)) {
    c.set_grad(1, apply(op::embedding_backward, {c.grad(), c.input(0), c.input(1)}));
  }
}

Tensor embedding_backward_run(std::span<const Tensor> in, const OpArgs&, const Shape& out,
                              const PieceContext* where) {
  const Tensor& grad = in[0];
  const Tensor& ids = in[1];
  const int64_t width = grad.size(-1);
  return scatter_into("embedding", grad.reshape({ids.numel(), width}), 0, row_index(ids, width),
                      out, output_block(where, 0, out));
}

std::vector<OpStrategy> embedding_backward_strategies(ShardingInputs in, const OpArgs&,
                                                      const OpMeta&) {
  const int nd = static_cast<int>(in[1]->ndim());
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(3, R), R}};
  for (int k = 0; k < nd; ++k) options.push_back({{Shard{k}, Shard{k}, R}, Partial{}});
  options.push_back({{R, R, Shard{0}}, Shard{0}});
  options.push_back({{Shard{nd}, R, Shard{1}}, Shard{1}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg})
    options.push_back({{Partial{o}, R, R}, Partial{o}});
  return expand_dim_options(in, options);
}

// The compute and piece functions of an entry from one function of (inputs, args, output shape,
// where the pieces sit: null for full tensors).
using IndexRun = Tensor (*)(std::span<const Tensor>, const OpArgs&, const Shape&,
                            const PieceContext*);

template <IndexRun run>
Tensor compute_of(std::span<const Tensor> in, const OpArgs& args, const OpMeta& out) {
  return run(in, args, out.shape, nullptr);
}
template <IndexRun run>
Tensor piece_of(std::span<const Tensor> pieces, const OpArgs& args, const PieceContext& where) {
  return run(pieces, args, where.local_shape, &where);
}

// ---- scatter_add, index_add and scatter ---------------------------------------------------------
// scatter_add and scatter: args.ints = [dim]; inputs (x, index, src), the index (integer) of src's
// shape with x's sizes on every dim but dim (torch also lets the index be smaller than src and x:
// not taken). scatter's value form: inputs (x, index), args.ints = [dim, 1], args.reals = [value].
// index_add: args.ints = [dim], args.reals = [alpha]; inputs (x, index [n], source), source of x's
// shape but n along dim. The result has x's shape and dtype. Adds accumulate in F32 for F32, BF16
// and F16, else in F64 (integers exact below 2^53), into a copy of x in index order (the CPU
// kernel; CUDA adds atomically); scatter writes in index order on the host, so of duplicate
// indices the last write wins (torch leaves it unspecified).

// The dtype a scatter-add into x computes in.
DType add_dtype(DType x) {
  return x == DType::F32 || x == DType::BF16 || x == DType::F16 ? DType::F32 : DType::F64;
}

// Checks (x, index[, src]) of scatter_add and scatter; returns the dim.
int64_t check_scatter(std::string_view op, std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const Shape& index = *in[1].shape;
  check_indices(op, in[1], "index");
  if (shape.empty() || index.size() != shape.size()) {
    throw_error<ShapeError>(
        "{}: the index (shape {}) must have as many dims as the input (shape {}), at least 1", op,
        shape_str(index), shape_str(shape));
  }
  const int64_t d = select_dim(args, shape, op);
  for (size_t k = 0; k < shape.size(); ++k) {
    if (static_cast<int64_t>(k) != d && index[k] != shape[k]) {
      throw_error<ShapeError>(
          "{}: the index (shape {}) must have the input's sizes (shape {}) on every dim but dim {}",
          op, shape_str(index), shape_str(shape), d);
    }
  }
  if (in.size() > 2) {
    if (*in[2].shape != index) {
      throw_error<ShapeError>("{}: src (shape {}) must have the index's shape {} (input shape {})",
                              op, shape_str(*in[2].shape), shape_str(index), shape_str(shape));
    }
    if (in[2].dtype != in[0].dtype) {
      throw_error<Unsupported>("{}: src ({}) must have the input's dtype {} (shape {})", op,
                               in[2].dtype, in[0].dtype, shape_str(shape));
    }
  }
  return d;
}

OpMeta scatter_add_meta(std::span<const InputMeta> in, const OpArgs& args) {
  check_scatter("scatter_add", in, args);
  if (in[0].dtype == DType::Bool) {
    throw_error<Unsupported>("scatter_add: dtype bool is not supported (shape {})",
                             shape_str(*in[0].shape));
  }
  return OpMeta{*in[0].shape, in[0].dtype};
}

// A copy of x (in its add dtype) plus src scattered along dim (index I64 of src's shape) into its
// block.
Tensor add_into(std::string_view op, const Tensor& x, int64_t dim, const Tensor& index,
                const Tensor& src, Block block, const IndexSource& source) {
  DeviceOps& kernels = kernels_for(op, {&x, &index, &src});
  const DType acc = add_dtype(x.dtype());
  Tensor out = x.to(acc).clone();
  if (!kernels.scatter_add(out, dim, index, src.to(acc), block.offset, block.limit)) {
    out_of_range(op, dim, block.limit, block.shape, index, source);
  }
  return out.to(x.dtype());
}

Tensor scatter_add_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                       const PieceContext* where) {
  const int64_t d = select_dim(args, out, "scatter_add");
  return add_into("scatter_add", in[0], d, in[1].to(DType::I64), in[2], output_block(where, d, out),
                  gather_index_source(where));
}

// (x, index, src): shards of other dims pass when all three are sharded alike; x sharded along
// dim with index and src whole: each rank adds what falls in its block; index and src sharded
// alike along dim with x a pending sum: each rank adds its own part (P(sum)); P(sum)/P(avg) of x
// and src with a whole index pass.
std::vector<OpStrategy> scatter_add_strategies(ShardingInputs in, const OpArgs& args,
                                               const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[0]->shape(), "scatter_add"));
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(3, R), R}};
  for (int k = 0; k < static_cast<int>(in[0]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, Shard{k}, Shard{k}}, Shard{k}});
  }
  options.push_back({{Shard{d}, R, R}, Shard{d}});
  options.push_back({{Partial{}, Shard{d}, Shard{d}}, Partial{}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
    options.push_back({{Partial{o}, R, Partial{o}}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

// The gradient passes to x; src's is the gradient gathered at the index.
void scatter_add_derivative(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, c.grad());
  if (c.needs_grad(2)) c.set_grad(2, apply(op::gather, {c.grad(), c.input(1)}, c.args()));
}

OpMeta index_add_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& shape = *in[0].shape;
  const Shape& source = *in[2].shape;
  if (shape.empty()) {
    throw_error<ShapeError>("index_add: the input must have at least one dim (shape [])");
  }
  check_indices("index_add", in[1], "index");
  if (in[1].shape->size() != 1) {
    throw_error<ShapeError>("index_add: the index must be 1-D, got shape {} (input shape {})",
                            shape_str(*in[1].shape), shape_str(shape));
  }
  const int64_t d = select_dim(args, shape, "index_add");
  Shape want = shape;
  want[static_cast<size_t>(d)] = (*in[1].shape)[0];
  if (source != want) {
    throw_error<ShapeError>(
        "index_add: the source (shape {}) must have the input's shape {} with the index's length "
        "{} along dim {}",
        shape_str(source), shape_str(shape), want[static_cast<size_t>(d)], d);
  }
  if (in[2].dtype != in[0].dtype || in[0].dtype == DType::Bool) {
    throw_error<Unsupported>(
        "index_add: the input ({}) and the source ({}) must have one dtype, not bool (shape {})",
        in[0].dtype, in[2].dtype, shape_str(shape));
  }
  const double alpha = args.reals.at(0);
  if (!is_floating(in[0].dtype) && alpha != std::floor(alpha)) {
    throw_error<ConfigError>("index_add: alpha {} must be an integer for dtype {} (shape {})",
                             alpha, in[0].dtype, shape_str(shape));
  }
  return OpMeta{shape, in[0].dtype};
}

Tensor index_add_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out,
                     const PieceContext* where) {
  const int64_t d = select_dim(args, out, "index_add");
  const double alpha = args.reals.at(0);
  Tensor src = in[2].to(add_dtype(in[0].dtype()));
  if (alpha != 1.0) src = call(op::mul_scalar, {src}, {{}, {alpha}});
  return add_into("index_add", in[0], d, index_along(in[1], d, in[2].shape()), src,
                  output_block(where, d, out), {});
}

// (x, index, source): as scatter_add's, with the 1-D index whole, or sharded (Shard(0)) with the
// source's rows along dim when x is a pending sum (each rank adds its own tokens).
std::vector<OpStrategy> index_add_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[0]->shape(), "index_add"));
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(3, R), R}};
  for (int k = 0; k < static_cast<int>(in[0]->ndim()); ++k) {
    if (k != d) options.push_back({{Shard{k}, R, Shard{k}}, Shard{k}});
  }
  options.push_back({{Shard{d}, R, R}, Shard{d}});
  options.push_back({{Partial{}, Shard{0}, Shard{d}}, Partial{}});
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
    options.push_back({{Partial{o}, R, Partial{o}}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

// The gradient passes to x; the source's is alpha times the gradient's slices at the index.
void index_add_derivative(BackwardContext& c) {
  if (c.needs_grad(0)) c.set_grad(0, c.grad());
  if (c.needs_grad(2)) {
    Var g = apply(op::index_select, {c.grad(), c.input(1)}, {{c.args().ints.at(0)}, {}});
    const double alpha = c.args().reals.at(0);
    if (alpha != 1.0) g = apply(op::mul_scalar, {g}, {{}, {alpha}});
    c.set_grad(2, g);
  }
}

// One add per element of src (scatter_add) or source (index_add, plus its scaling).
double scatter_add_flops(std::span<const InputMeta> in, const OpMeta&) {
  return static_cast<double>(checked_numel(*in[2].shape, "scatter_add"));
}
double index_add_flops(std::span<const InputMeta> in, const OpMeta&) {
  return 2.0 * static_cast<double>(checked_numel(*in[2].shape, "index_add"));
}

bool scatter_has_value(const OpArgs& args) {
  return args.ints.size() > 1 && args.ints[1] != 0;
}

OpMeta scatter_op_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const bool value = scatter_has_value(args);
  if (in.size() != (value ? 2u : 3u)) {
    throw_error<ConfigError>(
        "scatter: takes (x, index, src) or (x, index) and a value, got {} "
        "inputs (shape {})",
        in.size(), shape_str(*in[0].shape));
  }
  check_scatter("scatter", in, args);
  if (value) check_fill_value(args.reals.at(0), in[0].dtype, "scatter");
  return OpMeta{*in[0].shape, in[0].dtype};
}

// out[p with dim = index[p] - offset] = src[p] (or value) in row-major order of the index, where
// that lies in the block; false when an index lies outside [0, limit).
template <class T>
bool scatter_host(T* out, const Shape& out_shape, const int64_t* index, const Shape& index_shape,
                  const T* src, T value, int64_t dim, Block block) {
  const int64_t size = out_shape[static_cast<size_t>(dim)];
  const auto strides = contiguous_strides(out_shape);
  bool ok = true;
  const int64_t n = checked_numel(index_shape, "scatter");
  for (int64_t p = 0; p < n; ++p) {
    if (index[p] < 0 || index[p] >= block.limit) {
      ok = false;
      continue;
    }
    const int64_t row = index[p] - block.offset;
    if (row < 0 || row >= size) continue;
    const std::vector<int64_t> at = unravel_index(p, index_shape);
    int64_t flat = 0;
    for (size_t k = 0; k < at.size(); ++k) {
      flat += (static_cast<int64_t>(k) == dim ? row : at[k]) * strides[k];
    }
    out[flat] = src != nullptr ? src[p] : value;
  }
  return ok;
}

Tensor scatter_run(std::span<const Tensor> in, const OpArgs& args, const Shape& out_shape,
                   const PieceContext* where) {
  const int64_t d = select_dim(args, out_shape, "scatter");
  const Tensor& x = in[0];
  const DType acc = is_floating(x.dtype()) ? DType::F64 : DType::I64;
  Tensor out = x.to(cpu()).to(acc).contiguous().clone();
  const Tensor index = in[1].to(cpu()).to(DType::I64).contiguous();
  const Tensor src = in.size() > 2 ? in[2].to(cpu()).to(acc).contiguous() : Tensor();
  const Block block = output_block(where, d, out_shape);
  const double value = scatter_has_value(args) ? args.reals.at(0) : 0.0;
  const bool ok =
      acc == DType::F64
          ? scatter_host(out.data<double>(), out.shape(), index.data<int64_t>(), index.shape(),
                         src.defined() ? src.data<double>() : nullptr, value, d, block)
          : scatter_host(out.data<int64_t>(), out.shape(), index.data<int64_t>(), index.shape(),
                         src.defined() ? src.data<int64_t>() : nullptr, static_cast<int64_t>(value),
                         d, block);
  if (!ok) out_of_range("scatter", d, block.limit, block.shape, index, gather_index_source(where));
  return out.to(x.dtype()).to(x.device());
}

// (x, index[, src]): shards of other dims pass when all are sharded alike; x sharded along dim
// with the rest whole: each rank writes what falls in its block. Writing a value of 0 (the
// backward's) keeps a P(sum) or P(avg) x.
std::vector<OpStrategy> scatter_strategies(ShardingInputs in, const OpArgs& args, const OpMeta&) {
  const int d = static_cast<int>(select_dim(args, in[0]->shape(), "scatter"));
  const size_t n = in.size();
  const Placement R = Replicate{};
  std::vector<DimOption> options = {{all_of(n, R), R}};
  for (int k = 0; k < static_cast<int>(in[0]->ndim()); ++k) {
    if (k != d) options.push_back({all_of(n, Shard{k}), Shard{k}});
  }
  std::vector<Placement> rows = all_of(n, R);
  rows[0] = Shard{d};
  options.push_back({rows, Shard{d}});
  if (scatter_has_value(args) && args.reals.at(0) == 0.0) {
    for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg})
      options.push_back({{Partial{o}, R}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

// torch's: x's gradient is the gradient with the written positions zeroed (scatter of 0); src's
// the gradient gathered at the index.
void scatter_derivative(BackwardContext& c) {
  const int64_t d = c.args().ints.at(0);
  if (c.needs_grad(0)) {
    c.set_grad(0, apply(op::scatter, {c.grad(), c.input(1)}, {{d, 1}, {0.0}}));
  }
  if (c.num_inputs() > 2 && c.needs_grad(2)) {
    c.set_grad(2, apply(op::gather, {c.grad(), c.input(1)}, {{d}, {}}));
  }
}

}  // namespace

std::pair<Shape, Shape> take_along_dim_shapes(const Shape& x, const Shape& indices, int64_t d) {
  if (x.empty() || x.size() != indices.size()) {
    throw_error<ShapeError>(
        "take_along_dim: the indices (shape {}) must have as many dims as the input (shape {}), at "
        "least 1",
        shape_str(indices), shape_str(x));
  }
  const int64_t dim = normalize_dim(d, static_cast<int64_t>(x.size()), "take_along_dim", x);
  std::pair<Shape, Shape> out{x, indices};
  for (size_t k = 0; k < x.size(); ++k) {
    if (static_cast<int64_t>(k) == dim || x[k] == indices[k]) continue;
    if (x[k] != 1 && indices[k] != 1) {
      throw_error<ShapeError>(
          "take_along_dim: the input (shape {}) and the indices (shape {}) do not broadcast on "
          "dim {}",
          shape_str(x), shape_str(indices), k);
    }
    out.first[k] = out.second[k] = std::max(x[k], indices[k]);
  }
  return out;
}

const OpDef op::index_select{
    .name = "index_select",
    .meta = index_select_meta,
    .compute = compute_of<index_select_run>,
    .strategies = index_select_strategies,
    .piece = piece_of<index_select_run>,
    .backward = index_select_derivative,
};
const OpDef op::index_select_backward{
    .name = "index_select_backward",
    .meta = scatter_meta,
    .compute = compute_of<index_select_backward_run>,
    .strategies = index_select_backward_strategies,
    .piece = piece_of<index_select_backward_run>,
};
const OpDef op::gather{
    .name = "gather",
    .meta = gather_meta,
    .compute = compute_of<gather_run>,
    .strategies = gather_strategies,
    .piece = piece_of<gather_run>,
    .backward = gather_derivative,
    .saves = saves_inputs({1}),  // the input only for its shape
};
const OpDef op::gather_backward{
    .name = "gather_backward",
    .meta = scatter_meta,
    .compute = compute_of<gather_backward_run>,
    .strategies = gather_backward_strategies,
    .piece = piece_of<gather_backward_run>,
};
const OpDef op::scatter_add{
    .name = "scatter_add",
    .meta = scatter_add_meta,
    .compute = compute_of<scatter_add_run>,
    .strategies = scatter_add_strategies,
    .piece = piece_of<scatter_add_run>,
    .backward = scatter_add_derivative,
    .flops = scatter_add_flops,
};
const OpDef op::index_add{
    .name = "index_add",
    .meta = index_add_meta,
    .compute = compute_of<index_add_run>,
    .strategies = index_add_strategies,
    .piece = piece_of<index_add_run>,
    .backward = index_add_derivative,
    .flops = index_add_flops,
};
const OpDef op::scatter{
    .name = "scatter",
    .meta = scatter_op_meta,
    .compute = compute_of<scatter_run>,
    .strategies = scatter_strategies,
    .piece = piece_of<scatter_run>,
    .backward = scatter_derivative,
};
const OpDef op::embedding{
    .name = "embedding",
    .meta = embedding_meta,
    .compute = compute_of<embedding_run>,
    .strategies = embedding_strategies,
    .piece = piece_of<embedding_run>,
    .backward = embedding_derivative,
    .saves = saves_inputs({0}),
};
const OpDef op::embedding_backward{
    .name = "embedding_backward",
    .meta = scatter_meta,
    .compute = compute_of<embedding_backward_run>,
    .strategies = embedding_backward_strategies,
    .piece = piece_of<embedding_backward_run>,
};

}  // namespace spmd
