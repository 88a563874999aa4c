// spmd/collectives/blocks.h: the block layouts the process backends (mpi, nccl) exchange.
//
// MPI and NCCL move contiguous buffers of n equal blocks, block k for (or from) group rank k. A
// collective over dim d of a tensor converts between that layout and the tensor's: pieces_stacked
// before a send, concat_blocks after a receive. Both run on the tensor's device.
#pragma once

#include <cstdint>

#include <spmd/tensor/tensor.h>

namespace spmd {

// d counted from the end when negative; callers have validated it (check_local).
inline int64_t wrap_dim(int64_t d, int64_t ndim) {
  return d < 0 ? d + ndim : d;
}

// `shape` with a leading dim of n: the shape of n stacked blocks.
Shape stacked_shape(int64_t n, const Shape& shape);

// The n equal pieces of `t` along d, stacked into one contiguous [n, piece...] tensor (piece k is
// the k-th block); `t` itself when d == 0.
Tensor pieces_stacked(const Tensor& t, int64_t d, int64_t n);

// The blocks of a contiguous [n, piece...] buffer concatenated along d of the piece.
Tensor concat_blocks(const Tensor& buffer, int64_t d);

}  // namespace spmd
