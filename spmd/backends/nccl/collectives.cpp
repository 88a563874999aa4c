// spmd/backends/nccl/collectives.cpp: one run() per collective, each its NCCL calls (Note [NCCL
// semantics] in collectives.h).
#include <spmd/backends/nccl/collectives.h>

#include <cstring>
#include <memory>
#include <vector>

#include <spmd/collectives/blocks.h>
#include <spmd/collectives/p2p.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/cuda/device.h>
#include <spmd/tensor/cuda/kernels.h>

namespace spmd::nccl {

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Avg) == 1 &&
                  static_cast<int>(ReduceOp::BXor) == 7,
              "tensor/cuda/reduce.cu switches on ReduceOp values");

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::Bool:
    case DType::F8E4M3FN:  // moved, never reduced (collectives/validate.cpp)
    case DType::F8E5M2:
      return ncclUint8;
  }
  throw_error<InternalError>("nccl backend: unknown dtype");
}

static_assert(sizeof(bool) == 1, "Bool tensors travel as ncclUint8");

// How a reduction runs (Note [NCCL semantics]).
struct ReducePlan {
  enum Kind { Native, ParityOfSum, Gathered } kind = Native;
  ncclRedOp_t op = ncclSum;
};

ReducePlan plan_reduction(ReduceOp op, DType dtype) {
  if (dtype == DType::Bool) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        return {ReducePlan::Native, ncclMax};
      case ReduceOp::Product:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        return {ReducePlan::Native, ncclMin};
      case ReduceOp::BXor:
        return {ReducePlan::ParityOfSum, ncclSum};
      case ReduceOp::Avg:
        break;
    }
    // check_local rejects avg on bool before the backend runs.
    throw_error<InternalError>("nccl backend: op {} on bool", op);
  }
  switch (op) {
    case ReduceOp::Sum:
      return {ReducePlan::Native, ncclSum};
    case ReduceOp::Avg:
      return {ReducePlan::Native, ncclAvg};
    case ReduceOp::Product:
      return {ReducePlan::Native, ncclProd};
    case ReduceOp::Min:
      return {ReducePlan::Native, ncclMin};
    case ReduceOp::Max:
      return {ReducePlan::Native, ncclMax};
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if (is_integral(dtype)) return {ReducePlan::Gathered, ncclSum};
      break;
  }
  // check_local rejects bitwise ops on floating dtypes before the backend runs.
  throw_error<InternalError>("nccl backend: op {} on {}", op, dtype);
}

cuda_kernels::Elt elt(DType dtype) {
  return static_cast<cuda_kernels::Elt>(dtype);
}

// The result tensor of part p: empty with `shape` on p's device.
Tensor device_empty(const Part& p, const Shape& shape, DType dtype) {
  return empty(shape, dtype, cuda(p.device));
}

void check_kernel(cudaError_t error, const char* kernel, const Part& p) {
  gpu::check(error, kernel, p.device);
}

// sends[i]'s block j (of `count` elements) to group rank j, into block j' = source of recvs[i]:
// ncclAlltoAll, or grouped send/recv with the own block copied locally.
void all_to_all_blocks(Call& c, const std::vector<Tensor>& sends, const std::vector<Tensor>& recvs,
                       size_t count, DType dtype) {
  if (count == 0) return;
  const ncclDataType_t type = nccl_type(dtype);
  if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    size_t i = 0;
    c.group([&](Part& p) {
      c.check(
          ncclAlltoAll(sends[i].data_ptr(), recvs[i].data_ptr(), count, type, c.comm(p), p.stream),
          "ncclAlltoAll", p);
      ++i;
    });
    return;
#endif
  }
  const int64_t block = static_cast<int64_t>(count);
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const Part& p = c.parts[i];
    const int64_t me = c.index(p);
    c.copy_bytes(p, byte_ptr(recvs[i], me * block), byte_ptr(sends[i], me * block),
                 block * static_cast<int64_t>(recvs[i].itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    const int me = c.index(p);
    for (int r = 0; r < c.n; ++r) {
      if (r == me) continue;
      c.check(ncclSend(byte_ptr(sends[i], r * block), count, type, r, c.comm(p), p.stream),
              "ncclSend", p);
      c.check(ncclRecv(byte_ptr(recvs[i], r * block), count, type, r, c.comm(p), p.stream),
              "ncclRecv", p);
    }
    ++i;
  });
}

// Gathers every member's `inputs[i]` (count elements) into buffers[i] ([n, count]) on the group
// rank `root`; buffers of other ranks are not touched (may be undefined).
void gather_blocks(Call& c, const std::vector<Tensor>& inputs, const std::vector<Tensor>& buffers,
                   int root, size_t count, DType dtype) {
  if (count == 0) return;
  const ncclDataType_t type = nccl_type(dtype);
  if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    size_t i = 0;
    c.group([&](Part& p) {
      // Non-roots pass their input as the (unused) receive buffer: a valid device pointer.
      void* recv = c.index(p) == root ? buffers[i].data_ptr() : inputs[i].data_ptr();
      c.check(ncclGather(inputs[i].data_ptr(), recv, count, type, root, c.comm(p), p.stream),
              "ncclGather", p);
      ++i;
    });
    return;
#endif
  }
  const int64_t block = static_cast<int64_t>(count);
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const Part& p = c.parts[i];
    if (c.index(p) != root) continue;
    c.copy_bytes(p, byte_ptr(buffers[i], root * block), inputs[i].data_ptr(),
                 block * static_cast<int64_t>(inputs[i].itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    if (c.index(p) == root) {
      for (int r = 0; r < c.n; ++r) {
        if (r == root) continue;
        c.check(ncclRecv(byte_ptr(buffers[i], r * block), count, type, r, c.comm(p), p.stream),
                "ncclRecv", p);
      }
    } else {
      c.check(ncclSend(inputs[i].data_ptr(), count, type, root, c.comm(p), p.stream), "ncclSend",
              p);
    }
    ++i;
  });
}

// The one path of the reductions (all_reduce, reduce_scatter, reduce), once their results are
// made: every member contributes its part's `sends` (all of one size), and each part that gets a
// result (every part, or with `root` >= 0 the root's) gets `count` elements: the reduction of the
// whole contributions, or with `scatter` its own block of it. The plan decides how
// (Note [NCCL semantics]). Native and ParityOfSum: enqueue(part, send, op) puts the part's NCCL
// reduction with `op` in one group, and ParityOfSum keeps the low bit of every result. Gathered
// (bitwise ops on integers, which NCCL lacks): every contribution is gathered to the parts that
// get a result and folded there in group order.
template <class Enqueue>
void reduce_by_plan(Call& c, ReduceOp op, const ReducePlan& plan, DType dtype,
                    const std::vector<Tensor>& sends, size_t count, int root, bool scatter,
                    Enqueue&& enqueue) {
  if (count == 0) return;
  auto gets_result = [&](const Part& p) { return root < 0 || c.index(p) == root; };
  if (plan.kind == ReducePlan::Gathered) {
    const int64_t stride = sends.front().numel();
    std::vector<Tensor> stacked;
    for (Part& p : c.parts) {
      stacked.push_back(gets_result(p) ? device_empty(p, {c.n, stride}, dtype) : Tensor{});
    }
    if (root < 0) {
      size_t i = 0;
      c.group([&](Part& p) {
        c.check(ncclAllGather(sends[i].data_ptr(), stacked[i].data_ptr(),
                              static_cast<size_t>(stride), nccl_type(dtype), c.comm(p), p.stream),
                "ncclAllGather", p);
        ++i;
      });
    } else {
      gather_blocks(c, sends, stacked, root, static_cast<size_t>(stride), dtype);
    }
    for (size_t k = 0; k < c.parts.size(); ++k) {
      Part& p = c.parts[k];
      if (!gets_result(p)) continue;
      const int64_t at = scatter ? c.index(p) * int64_t(count) : 0;
      check_kernel(
          cuda_kernels::reduce_stacked(static_cast<int>(op), elt(dtype), byte_ptr(stacked[k], at),
                                       c.n, stride, p.result.data_ptr(), int64_t(count), p.stream),
          "reduce_stacked kernel", p);
    }
    return;
  }
  size_t i = 0;
  c.group([&](Part& p) { enqueue(p, sends[i++], plan.op); });
  if (plan.kind == ReducePlan::ParityOfSum) {
    for (Part& p : c.parts) {
      if (!gets_result(p)) continue;
      check_kernel(cuda_kernels::keep_low_bit(static_cast<uint8_t*>(p.result.data_ptr()),
                                              int64_t(count), p.stream),
                   "keep_low_bit kernel", p);
    }
  }
}

// ---- collectives: one run() per collective, reached by run_collective's visit ----------------

WorkPtr run(Call& c, const LocalTensor& x, const AllReduceOptions& options) {
  const DType dtype = x.dtype();
  const ReducePlan plan = plan_reduction(options.op, dtype);
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    p.result = device_empty(p, p.input.shape(), dtype);
    sends.push_back(p.input);
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  reduce_by_plan(c, options.op, plan, dtype, sends, count, /*root=*/-1, /*scatter=*/false,
                 [&](Part& p, const Tensor& send, ncclRedOp_t op) {
                   c.check(ncclAllReduce(send.data_ptr(), p.result.data_ptr(), count,
                                         nccl_type(dtype), op, c.comm(p), p.stream),
                           "ncclAllReduce", p);
                 });
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const AllGatherOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.gather_dim, x.dim());
  std::vector<Tensor> buffers;
  for (Part& p : c.parts)
    buffers.push_back(device_empty(p, stacked_shape(c.n, p.input.shape()), dtype));
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    size_t i = 0;
    c.group([&](Part& p) {
      c.check(ncclAllGather(p.input.data_ptr(), buffers[i++].data_ptr(), count, nccl_type(dtype),
                            c.comm(p), p.stream),
              "ncclAllGather", p);
    });
  }
  for (size_t k = 0; k < c.parts.size(); ++k) c.parts[k].result = concat_blocks(buffers[k], d);
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const ReduceScatterOptions& options) {
  const DType dtype = x.dtype();
  const ReducePlan plan = plan_reduction(options.op, dtype);
  const int64_t d = wrap_dim(options.scatter_dim, x.dim());
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    Shape out_shape = p.input.shape();
    out_shape[static_cast<size_t>(d)] /= c.n;
    p.result = device_empty(p, out_shape, dtype);
    sends.push_back(pieces_stacked(p.input, d, c.n));
  }
  const size_t count = static_cast<size_t>(c.parts.front().result.numel());
  reduce_by_plan(c, options.op, plan, dtype, sends, count, /*root=*/-1, /*scatter=*/true,
                 [&](Part& p, const Tensor& send, ncclRedOp_t op) {
                   c.check(ncclReduceScatter(send.data_ptr(), p.result.data_ptr(), count,
                                             nccl_type(dtype), op, c.comm(p), p.stream),
                           "ncclReduceScatter", p);
                 });
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const AllToAllOptions& options) {
  const DType dtype = x.dtype();
  const int64_t split = wrap_dim(options.split_dim, x.dim());
  const int64_t concat = wrap_dim(options.concat_dim, x.dim());
  std::vector<Tensor> sends;
  std::vector<Tensor> recvs;
  for (Part& p : c.parts) {
    Shape piece_shape = p.input.shape();
    piece_shape[static_cast<size_t>(split)] /= c.n;
    // Piece j of the send buffer goes to group rank j; block i of the receive buffer came from i.
    sends.push_back(pieces_stacked(p.input, split, c.n));
    recvs.push_back(device_empty(p, stacked_shape(c.n, piece_shape), dtype));
  }
  const size_t count = static_cast<size_t>(recvs.front().numel() / c.n);
  all_to_all_blocks(c, sends, recvs, count, dtype);
  for (size_t k = 0; k < c.parts.size(); ++k) c.parts[k].result = concat_blocks(recvs[k], concat);
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const AllToAllSingleOptions& options) {
  const DType dtype = x.dtype();
  const int64_t n = c.n;
  std::vector<std::vector<int64_t>> in_splits;
  std::vector<std::vector<int64_t>> out_splits;
  for (Part& p : c.parts) {
    const int64_t rows = p.input.size(0);
    in_splits.push_back(resolve_splits(options.in_splits, p.rank, rows, n));
    // Empty out_splits: an equal share of this rank's row count from every peer.
    out_splits.push_back(resolve_splits(options.out_splits, p.rank, rows, n));
  }
  // Every member's (in_splits, out_splits): each finds the same first disagreement, as
  // check_group_splits would under sim.
  const size_t row_bytes = static_cast<size_t>(2 * n) * sizeof(int64_t);
  size_t filled = 0;
  const std::vector<const char*> received = c.exchange(row_bytes, [&](Part&, char* out) {
    std::memcpy(out, in_splits[filled].data(), static_cast<size_t>(n) * sizeof(int64_t));
    std::memcpy(out + n * sizeof(int64_t), out_splits[filled].data(),
                static_cast<size_t>(n) * sizeof(int64_t));
    ++filled;
  });
  for (size_t k = 0; k < c.parts.size(); ++k) {
    const Part& p = c.parts[k];
    std::vector<int64_t> table(static_cast<size_t>(2 * n * n));  // [member][in..., out...]
    std::memcpy(table.data(), received[k], table.size() * sizeof(int64_t));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t sent = table[static_cast<size_t>(i * 2 * n + j)];
        const int64_t expected = table[static_cast<size_t>(j * 2 * n + n + i)];
        if (sent != expected) {
          const std::vector<int>& members = p.member->members;
          throw_error<CommError>(
              "{}: split sizes do not match: rank {} sends {} rows to rank {}, which expects {}",
              c.describe(p), members[static_cast<size_t>(i)], sent, members[static_cast<size_t>(j)],
              expected);
        }
      }
    }
  }
  const ncclDataType_t type = nccl_type(dtype);
  std::vector<int64_t> row_numels;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    Part& p = c.parts[k];
    Shape out_shape = p.input.shape();
    out_shape[0] = 0;
    for (int64_t s : out_splits[k]) out_shape[0] += s;
    p.result = device_empty(p, out_shape, dtype);
    row_numels.push_back(shape_numel(Shape(out_shape.begin() + 1, out_shape.end())));
  }
  // Offsets (in elements) of each peer's block in this part's input and result.
  auto offsets = [&](const std::vector<int64_t>& splits, int64_t row_numel) {
    std::vector<int64_t> at(static_cast<size_t>(n) + 1, 0);
    for (int64_t r = 0; r < n; ++r) {
      at[static_cast<size_t>(r) + 1] =
          at[static_cast<size_t>(r)] + splits[static_cast<size_t>(r)] * row_numel;
    }
    return at;
  };
  std::vector<std::vector<int64_t>> send_at;
  std::vector<std::vector<int64_t>> recv_at;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    send_at.push_back(offsets(in_splits[k], row_numels[k]));
    recv_at.push_back(offsets(out_splits[k], row_numels[k]));
    const Part& p = c.parts[k];
    const auto me = static_cast<size_t>(c.index(p));
    c.copy_bytes(p, byte_ptr(p.result, recv_at[k][me]), byte_ptr(p.input, send_at[k][me]),
                 (send_at[k][me + 1] - send_at[k][me]) * static_cast<int64_t>(p.input.itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    const int me = c.index(p);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto ur = static_cast<size_t>(r);
      const int64_t send_count = send_at[i][ur + 1] - send_at[i][ur];
      const int64_t recv_count = recv_at[i][ur + 1] - recv_at[i][ur];
      if (send_count > 0) {
        c.check(ncclSend(byte_ptr(p.input, send_at[i][ur]), static_cast<size_t>(send_count), type,
                         r, c.comm(p), p.stream),
                "ncclSend", p);
      }
      if (recv_count > 0) {
        c.check(ncclRecv(byte_ptr(p.result, recv_at[i][ur]), static_cast<size_t>(recv_count), type,
                         r, c.comm(p), p.stream),
                "ncclRecv", p);
      }
    }
    ++i;
  });
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const BroadcastOptions& options) {
  const DType dtype = x.dtype();
  for (Part& p : c.parts) {
    // The source sends from its input in place (NCCL only reads it there).
    p.result = c.index(p) == options.src ? p.input : device_empty(p, p.input.shape(), dtype);
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    c.group([&](Part& p) {
      c.check(ncclBroadcast(p.result.data_ptr(), p.result.data_ptr(), count, nccl_type(dtype),
                            options.src, c.comm(p), p.stream),
              "ncclBroadcast", p);
    });
  }
  WorkPtr work = c.finish(x);
  // The source keeps its own shard, as under sim.
  std::vector<Tensor> shards = work->result().shards();
  for (size_t k = 0; k < c.parts.size(); ++k) {
    if (c.index(c.parts[k]) == options.src) shards[k] = x.shards()[k];
  }
  return std::make_shared<CompletedWork>(LocalTensor(x, std::move(shards)));
}

WorkPtr run(Call& c, const LocalTensor& x, const ScatterOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.scatter_dim, x.dim());
  const int root = options.src;
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    Shape piece_shape = p.input.shape();
    piece_shape[static_cast<size_t>(d)] /= c.n;
    p.result = device_empty(p, piece_shape, dtype);
    sends.push_back(c.index(p) == root ? pieces_stacked(p.input, d, c.n) : p.input);
  }
  const size_t count = static_cast<size_t>(c.parts.front().result.numel());
  const ncclDataType_t type = nccl_type(dtype);
  if (count > 0) {
    bool done = false;
    if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
      size_t i = 0;
      c.group([&](Part& p) {
        // Non-roots pass their input as the (unused) send buffer: a valid device pointer.
        c.check(ncclScatter(sends[i++].data_ptr(), p.result.data_ptr(), count, type, root,
                            c.comm(p), p.stream),
                "ncclScatter", p);
      });
      done = true;
#endif
    }
    if (!done) {
      const int64_t block = static_cast<int64_t>(count);
      for (size_t k = 0; k < c.parts.size(); ++k) {
        const Part& p = c.parts[k];
        if (c.index(p) != root) continue;
        c.copy_bytes(p, p.result.data_ptr(), byte_ptr(sends[k], root * block),
                     block * static_cast<int64_t>(p.result.itemsize()));
      }
      size_t i = 0;
      c.group([&](Part& p) {
        if (c.index(p) == root) {
          for (int r = 0; r < c.n; ++r) {
            if (r == root) continue;
            c.check(ncclSend(byte_ptr(sends[i], r * block), count, type, r, c.comm(p), p.stream),
                    "ncclSend", p);
          }
        } else {
          c.check(ncclRecv(p.result.data_ptr(), count, type, root, c.comm(p), p.stream), "ncclRecv",
                  p);
        }
        ++i;
      });
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const GatherOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.gather_dim, x.dim());
  const int root = options.dst;
  std::vector<Tensor> inputs;
  std::vector<Tensor> buffers;
  for (Part& p : c.parts) {
    inputs.push_back(p.input);
    buffers.push_back(c.index(p) == root
                          ? device_empty(p, stacked_shape(c.n, p.input.shape()), dtype)
                          : Tensor{});
  }
  gather_blocks(c, inputs, buffers, root, static_cast<size_t>(inputs.front().numel()), dtype);
  for (size_t k = 0; k < c.parts.size(); ++k) {
    Part& p = c.parts[k];
    if (c.index(p) == root) {
      p.result = concat_blocks(buffers[k], d);
    } else {
      Shape none = p.input.shape();
      none[static_cast<size_t>(d)] = 0;
      p.result = device_empty(p, none, dtype);
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const ReduceOptions& options) {
  const DType dtype = x.dtype();
  if (x.dim() == 0) {
    throw_error<CommError>(
        "{}: a 0-d input has no empty form for the non-destination ranks; reshape it to [1]",
        c.describe(c.parts.front()));
  }
  const ReducePlan plan = plan_reduction(options.op, dtype);
  const int root = options.dst;
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    if (c.index(p) == root) {
      p.result = device_empty(p, p.input.shape(), dtype);
    } else {
      Shape none = p.input.shape();
      none[0] = 0;
      p.result = device_empty(p, none, dtype);
    }
    sends.push_back(p.input);
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  reduce_by_plan(c, options.op, plan, dtype, sends, count, root, /*scatter=*/false,
                 [&](Part& p, const Tensor& send, ncclRedOp_t op) {
                   void* recv = c.index(p) == root ? p.result.data_ptr() : nullptr;
                   c.check(ncclReduce(send.data_ptr(), recv, count, nccl_type(dtype), op, root,
                                      c.comm(p), p.stream),
                           "ncclReduce", p);
                 });
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const PermuteOptions& options) {
  const DType dtype = x.dtype();
  std::vector<int> dests;
  std::vector<int> sources;
  for (Part& p : c.parts) {
    const int me = c.index(p);
    const int dest = options.dst_of[static_cast<size_t>(me)];
    int source = -1;
    for (int i = 0; i < c.n; ++i) {
      if (options.dst_of[static_cast<size_t>(i)] == me) source = i;
    }
    dests.push_back(dest);
    sources.push_back(source);
    // A rank that receives nothing gets zeros of its own shape (jax.lax.ppermute).
    p.result = source < 0 ? zeros(p.input.shape(), dtype, cuda(p.device))
                          : device_empty(p, p.input.shape(), dtype);
    if (dest == me) {
      c.copy_bytes(p, p.result.data_ptr(), p.input.data_ptr(),
                   static_cast<int64_t>(p.input.nbytes()));
    }
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    const ncclDataType_t type = nccl_type(dtype);
    size_t i = 0;
    c.group([&](Part& p) {
      const int me = c.index(p);
      if (dests[i] >= 0 && dests[i] != me) {
        c.check(ncclSend(p.input.data_ptr(), count, type, dests[i], c.comm(p), p.stream),
                "ncclSend", p);
      }
      if (sources[i] >= 0 && sources[i] != me) {
        c.check(ncclRecv(p.result.data_ptr(), count, type, sources[i], c.comm(p), p.stream),
                "ncclRecv", p);
      }
      ++i;
    });
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const BarrierOptions&) {
  std::vector<Tensor> flags;
  for (Part& p : c.parts) flags.push_back(zeros({1}, DType::I32, cuda(p.device)));
  size_t i = 0;
  c.group([&](Part& p) {
    void* flag = flags[i++].data_ptr();
    c.check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, c.comm(p), p.stream), "ncclAllReduce",
            p);
  });
  c.rt->wait_streams(c.slots(), c.comms(), c.what());
  return std::make_shared<CompletedWork>(x);
}

// ---- point-to-point (Note [Point-to-point]) ---------------------------------------------------

// Every part's envelope and data to (send) or from (recv) its peer in one NCCL group; a recv then
// checks the envelope it got. Synchronous: the envelope must be read before the data is used.
WorkPtr transfer(Call& c, const LocalTensor& x, bool sending, int peer, int64_t tag) {
  const DType dtype = x.dtype();
  constexpr int64_t kBytes = static_cast<int64_t>(sizeof(P2PEnvelope));
  std::vector<P2PEnvelope> envelopes(c.parts.size());
  std::vector<P2PEnvelope> expected(c.parts.size());
  std::vector<Tensor> device(c.parts.size());
  for (size_t i = 0; i < c.parts.size(); ++i) {
    Part& p = c.parts[i];
    const int other = p.member->members[static_cast<size_t>(peer)];
    const EnvelopeInput in{sending ? p.rank : other,
                           sending ? other : p.rank,
                           tag,
                           &p.input.shape(),
                           dtype,
                           sending && c.site->requires_grad,
                           in_backward(),
                           c.site->dim_name,
                           c.site->location};
    (sending ? envelopes[i] : expected[i]) = make_envelope(in);
    device[i] = empty({kBytes}, DType::Bool, cuda(p.device));
    if (sending) {
      gpu::set_device(p.device);
      gpu::check(cudaMemcpyAsync(device[i].data_ptr(), &envelopes[i], sizeof(P2PEnvelope),
                                 cudaMemcpyHostToDevice, p.stream),
                 "cudaMemcpyAsync", p.device);
      p.result = empty({0}, dtype, cuda(p.device));
    } else {
      p.result = device_empty(p, p.input.shape(), dtype);
    }
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  const ncclDataType_t type = nccl_type(dtype);
  size_t i = 0;
  c.group([&](Part& p) {
    void* envelope = device[i++].data_ptr();
    if (sending) {
      c.check(ncclSend(envelope, sizeof(P2PEnvelope), ncclUint8, peer, c.comm(p), p.stream),
              "ncclSend", p);
      if (count > 0) {
        c.check(ncclSend(p.input.data_ptr(), count, type, peer, c.comm(p), p.stream), "ncclSend",
                p);
      }
    } else {
      c.check(ncclRecv(envelope, sizeof(P2PEnvelope), ncclUint8, peer, c.comm(p), p.stream),
              "ncclRecv", p);
      if (count > 0) {
        c.check(ncclRecv(p.result.data_ptr(), count, type, peer, c.comm(p), p.stream), "ncclRecv",
                p);
      }
    }
  });
  c.rt->wait_streams(c.slots(), c.comms(), c.what());
  bool requires_grad = false;
  if (!sending) {
    for (size_t k = 0; k < c.parts.size(); ++k) {
      Part& p = c.parts[k];
      gpu::set_device(p.device);
      gpu::check(cudaMemcpy(&envelopes[k], device[k].data_ptr(), sizeof(P2PEnvelope),
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy", p.device);
      check_envelope(envelopes[k], expected[k]);
      requires_grad = requires_grad || envelopes[k].requires_grad != 0;
    }
  }
  WorkPtr work = c.finish(x);
  if (!requires_grad || !is_floating(dtype)) return work;
  work->wait();
  LocalTensor result = work->take_result();
  result.requires_grad_(true);
  return std::make_shared<CompletedWork>(std::move(result));
}

WorkPtr run(Call& c, const LocalTensor& x, const SendOptions& options) {
  return transfer(c, x, true, options.peer, options.tag);
}

WorkPtr run(Call& c, const LocalTensor& x, const RecvOptions& options) {
  return transfer(c, x, false, options.peer, options.tag);
}

}  // namespace

WorkPtr run_collective(Call& c, const LocalTensor& x, const CollectiveOptions& options) {
  return std::visit([&](const auto& o) { return run(c, x, o); }, options);
}

}  // namespace spmd::nccl
