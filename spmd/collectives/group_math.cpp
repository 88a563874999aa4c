// spmd/collectives/group_math.cpp: the per-group semantics of every collective.
#include <spmd/collectives/group_math.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include <spmd/collectives/blocks.h>
#include <spmd/collectives/reduce_kernels.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>
#include <spmd/ops/ops.h>

namespace spmd {
namespace {

// Contiguous versions of the inputs (the originals when already contiguous); `keep` owns copies.
std::vector<const Tensor*> contiguous_inputs(const std::vector<const Tensor*>& inputs,
                                             std::vector<Tensor>& keep) {
  keep.clear();
  keep.reserve(inputs.size());
  std::vector<const Tensor*> out;
  out.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    if (t->is_contiguous()) {
      out.push_back(t);
    } else {
      keep.push_back(t->contiguous());
      out.push_back(&keep.back());
    }
  }
  return out;
}

struct CopyPiece {
  char* dst;
  const char* src;
  std::size_t bytes;
};

// memcpy of many pieces, cut into 1 MiB parts spread over the thread pool. Small copies run
// inline: waking a pool thread costs microseconds.
void copy_pieces(const std::vector<CopyPiece>& pieces) {
  constexpr std::size_t kPart = std::size_t{1} << 20;
  constexpr std::size_t kParallelBytes = std::size_t{4} << 20;
  std::size_t total = 0;
  for (const CopyPiece& p : pieces) total += p.bytes;
  if (total < kParallelBytes) {
    for (const CopyPiece& p : pieces) {
      if (p.bytes != 0) std::memcpy(p.dst, p.src, p.bytes);
    }
    return;
  }
  std::vector<CopyPiece> parts;
  for (const CopyPiece& p : pieces) {
    for (std::size_t off = 0; off < p.bytes; off += kPart) {
      parts.push_back({p.dst + off, p.src + off, std::min(kPart, p.bytes - off)});
    }
  }
  parallel_for(static_cast<int64_t>(parts.size()), 2, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const CopyPiece& p = parts[static_cast<size_t>(i)];
      std::memcpy(p.dst, p.src, p.bytes);
    }
  });
}

const char* bytes_of(const Tensor& t) {
  return static_cast<const char*>(t.data_ptr());
}
char* bytes_of(Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

// The reduction of the group's inputs into a new tensor, in ascending group rank.
Tensor reduce_group(const std::vector<const Tensor*>& inputs, ReduceOp op) {
  if (inputs[0]->is_meta()) return empty(inputs[0]->shape(), inputs[0]->dtype(), meta_device());
  thread_local std::vector<Tensor> keep;
  thread_local std::vector<const void*> ptrs;
  keep.clear();
  ptrs.clear();
  for (const Tensor* t : inputs) {
    if (t->is_contiguous()) {
      ptrs.push_back(t->data_ptr());
    } else {
      keep.push_back(t->contiguous());
      ptrs.push_back(keep.back().data_ptr());
    }
  }
  Tensor out = empty(inputs[0]->shape(), inputs[0]->dtype());
  reduce_buffers(out.dtype(), op, ptrs.data(), static_cast<int64_t>(ptrs.size()), out.data_ptr(),
                 out.numel());
  keep.clear();
  return out;
}

// Shape of a non-destination rank's result of gather/reduce: the input's, with `d` emptied.
Tensor empty_like_along(const Tensor& t, int64_t d, const CollectiveCall& call) {
  if (t.dim() == 0) {
    throw_error<CommError>(
        "{}: a 0-d input has no empty form for the non-destination ranks; reshape it to [1]",
        describe_call(call));
  }
  Shape shape = t.shape();
  shape[static_cast<size_t>(d)] = 0;
  return empty(shape, t.dtype(), t.device());
}

// ---- one computation per collective, reached by compute_group's visit -----------------------

void compute(GroupView& g, const AllReduceOptions& o) {
  Tensor result =
      g.size() == 1 && o.op != ReduceOp::Avg ? *g.inputs[0] : reduce_group(g.inputs, o.op);
  for (Tensor* out : g.outputs) *out = result;
}

void compute(GroupView& g, const AllGatherOptions& o) {
  const Tensor& first = *g.inputs[0];
  const int64_t d = wrap_dim(o.gather_dim, first.dim());
  Tensor result;
  if (g.size() == 1) {
    result = first;
  } else if (d == 0 && !first.is_meta()) {
    Shape shape = first.shape();
    shape[0] *= g.size();
    result = empty(shape, first.dtype());
    std::vector<Tensor> keep;
    std::vector<const Tensor*> in = contiguous_inputs(g.inputs, keep);
    std::vector<CopyPiece> pieces;
    const std::size_t bytes = first.nbytes();
    for (int64_t k = 0; k < g.size(); ++k) {
      pieces.push_back({bytes_of(result) + static_cast<std::size_t>(k) * bytes,
                        bytes_of(*in[static_cast<size_t>(k)]), bytes});
    }
    copy_pieces(pieces);
  } else {
    std::vector<Tensor> parts;
    for (const Tensor* t : g.inputs) parts.push_back(*t);
    result = cat(parts, d);
  }
  for (Tensor* out : g.outputs) *out = result;
}

void compute(GroupView& g, const ReduceScatterOptions& o) {
  const Tensor& first = *g.inputs[0];
  const int64_t d = wrap_dim(o.scatter_dim, first.dim());
  const int64_t n = g.size();
  const int64_t piece = first.size(d) / n;
  if (first.is_meta()) {
    // Shape-only: every member gets the same shape (no per-member pieces: a group may be large).
    Shape shape = first.shape();
    shape[static_cast<size_t>(d)] = piece;
    const Tensor out = empty(shape, first.dtype(), meta_device());
    for (Tensor* o : g.outputs) *o = out;
    return;
  }
  if (d == 0) {
    std::vector<Tensor> keep;
    std::vector<const Tensor*> in = contiguous_inputs(g.inputs, keep);
    Shape shape = first.shape();
    shape[0] = piece;
    const int64_t piece_numel = shape_numel(shape);
    const std::size_t piece_bytes = static_cast<std::size_t>(piece_numel) * first.itemsize();
    std::vector<const void*> ptrs(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      Tensor out = empty(shape, first.dtype());
      for (int64_t k = 0; k < n; ++k) {
        ptrs[static_cast<size_t>(k)] =
            bytes_of(*in[static_cast<size_t>(k)]) + static_cast<std::size_t>(j) * piece_bytes;
      }
      reduce_buffers(first.dtype(), o.op, ptrs.data(), n, out.data_ptr(), piece_numel);
      *g.outputs[static_cast<size_t>(j)] = std::move(out);
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    std::vector<Tensor> pieces;
    std::vector<const Tensor*> ptrs;
    pieces.reserve(static_cast<size_t>(n));
    for (const Tensor* t : g.inputs) pieces.push_back(t->narrow(d, j * piece, piece));
    for (const Tensor& p : pieces) ptrs.push_back(&p);
    *g.outputs[static_cast<size_t>(j)] = reduce_group(ptrs, o.op);
  }
}

void compute(GroupView& g, const AllToAllOptions& o) {
  const Tensor& first = *g.inputs[0];
  const int64_t split = wrap_dim(o.split_dim, first.dim());
  const int64_t concat = wrap_dim(o.concat_dim, first.dim());
  const int64_t n = g.size();
  const int64_t piece = first.size(split) / n;
  if (first.is_meta()) {
    // Shape-only: every member's result is a piece of each member's input, concatenated.
    Shape shape = first.shape();
    shape[static_cast<size_t>(split)] = piece;
    shape[static_cast<size_t>(concat)] *= n;
    const Tensor out = empty(shape, first.dtype(), meta_device());
    for (Tensor* o : g.outputs) *o = out;
    return;
  }
  if (split == 0 && concat == 0) {
    std::vector<Tensor> keep;
    std::vector<const Tensor*> in = contiguous_inputs(g.inputs, keep);
    const std::size_t piece_bytes = first.nbytes() / static_cast<std::size_t>(n);
    std::vector<CopyPiece> pieces;
    for (int64_t j = 0; j < n; ++j) {
      Tensor out = empty(first.shape(), first.dtype());
      for (int64_t i = 0; i < n; ++i) {
        pieces.push_back(
            {bytes_of(out) + static_cast<std::size_t>(i) * piece_bytes,
             bytes_of(*in[static_cast<size_t>(i)]) + static_cast<std::size_t>(j) * piece_bytes,
             piece_bytes});
      }
      *g.outputs[static_cast<size_t>(j)] = std::move(out);
    }
    copy_pieces(pieces);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    std::vector<Tensor> parts;
    for (const Tensor* t : g.inputs) parts.push_back(t->narrow(split, j * piece, piece));
    *g.outputs[static_cast<size_t>(j)] = cat(parts, concat);
  }
}

void compute(GroupView& g, const AllToAllSingleOptions& o) {
  check_group_splits(g.call, g.inputs, o);
  const int64_t n = g.size();
  std::vector<Tensor> keep;
  std::vector<const Tensor*> in = contiguous_inputs(g.inputs, keep);
  const Tensor& first = *in[0];
  Shape row_shape = first.shape();
  row_shape[0] = 1;
  const std::size_t row_bytes = static_cast<std::size_t>(shape_numel(row_shape)) * first.itemsize();
  // in_offsets[i][j]: first row rank i sends to rank j.
  std::vector<std::vector<int64_t>> in_splits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    in_splits[static_cast<size_t>(i)] =
        resolve_splits(o.in_splits, (*g.call.group)[static_cast<size_t>(i)],
                       in[static_cast<size_t>(i)]->size(0), n);
  }
  std::vector<CopyPiece> pieces;
  for (int64_t j = 0; j < n; ++j) {
    int64_t rows = 0;
    for (int64_t i = 0; i < n; ++i)
      rows += in_splits[static_cast<size_t>(i)][static_cast<size_t>(j)];
    Shape shape = first.shape();
    shape[0] = rows;
    Tensor out = empty(shape, first.dtype(), first.device());
    int64_t out_row = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto& splits = in_splits[static_cast<size_t>(i)];
      int64_t in_row = 0;
      for (int64_t k = 0; k < j; ++k) in_row += splits[static_cast<size_t>(k)];
      const int64_t count = splits[static_cast<size_t>(j)];
      if (count > 0 && !out.is_meta()) {
        pieces.push_back(
            {bytes_of(out) + static_cast<std::size_t>(out_row) * row_bytes,
             bytes_of(*in[static_cast<size_t>(i)]) + static_cast<std::size_t>(in_row) * row_bytes,
             static_cast<std::size_t>(count) * row_bytes});
      }
      out_row += count;
    }
    *g.outputs[static_cast<size_t>(j)] = std::move(out);
  }
  copy_pieces(pieces);
}

void compute(GroupView& g, const BroadcastOptions& o) {
  const Tensor& source = *g.inputs[static_cast<size_t>(o.src)];
  for (Tensor* out : g.outputs) *out = source;
}

void compute(GroupView& g, const ScatterOptions& o) {
  const Tensor& source = *g.inputs[static_cast<size_t>(o.src)];
  const int64_t d = wrap_dim(o.scatter_dim, source.dim());
  const int64_t piece = source.size(d) / g.size();
  for (int64_t j = 0; j < g.size(); ++j) {
    *g.outputs[static_cast<size_t>(j)] = source.narrow(d, j * piece, piece).contiguous();
  }
}

void compute(GroupView& g, const GatherOptions& o) {
  const Tensor& first = *g.inputs[0];
  const int64_t d = wrap_dim(o.gather_dim, first.dim());
  Tensor none = empty_like_along(first, d, g.call);
  std::vector<Tensor> parts;
  for (const Tensor* t : g.inputs) parts.push_back(*t);
  for (int64_t k = 0; k < g.size(); ++k) {
    *g.outputs[static_cast<size_t>(k)] = k == o.dst ? cat(parts, d) : none;
  }
}

void compute(GroupView& g, const ReduceOptions& o) {
  Tensor none = empty_like_along(*g.inputs[0], 0, g.call);
  for (int64_t k = 0; k < g.size(); ++k) {
    *g.outputs[static_cast<size_t>(k)] = k == o.dst ? reduce_group(g.inputs, o.op) : none;
  }
}

void compute(GroupView& g, const PermuteOptions& o) {
  std::vector<bool> received(static_cast<size_t>(g.size()), false);
  for (int64_t i = 0; i < g.size(); ++i) {
    const int d = o.dst_of[static_cast<size_t>(i)];
    if (d < 0) continue;
    *g.outputs[static_cast<size_t>(d)] = *g.inputs[static_cast<size_t>(i)];
    received[static_cast<size_t>(d)] = true;
  }
  for (int64_t k = 0; k < g.size(); ++k) {
    if (!received[static_cast<size_t>(k)]) {
      const Tensor& own = *g.inputs[static_cast<size_t>(k)];
      *g.outputs[static_cast<size_t>(k)] = zeros(own.shape(), own.dtype(), own.device());
    }
  }
}

// Note [Point-to-point]: a matched pair, [sender, receiver]: the receiver gets the sender's data
// (sharing its buffer), the sender its token.
void compute_pair(GroupView& g) {
  const Tensor& sent = *g.inputs[0];
  *g.outputs[1] = sent;
  *g.outputs[0] = empty({0}, sent.dtype(), sent.device());
}
void compute(GroupView& g, const SendOptions&) {
  compute_pair(g);
}
void compute(GroupView& g, const RecvOptions&) {
  compute_pair(g);
}

void compute(GroupView& g, const BarrierOptions&) {
  for (int64_t k = 0; k < g.size(); ++k) {
    *g.outputs[static_cast<size_t>(k)] = *g.inputs[static_cast<size_t>(k)];
  }
}

}  // namespace

void compute_group(GroupView& g, const CollectiveOptions& options) {
  try {
    std::visit([&](const auto& o) { compute(g, o); }, options);
  } catch (const OutOfMemoryError& e) {
    throw_error<OutOfMemoryError>("{}: out of memory for the result: {}", describe_call(g.call),
                                  e.what());
  }
}

}  // namespace spmd
