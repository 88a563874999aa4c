// spmd/collectives/reduce_kernels.h: the element-wise reduction every CPU backend uses.
//
// Note [Reduction order]
// A group's inputs are combined in ascending group rank: ((x0 op x1) op x2) op ... . The order
// is fixed, so results are deterministic and bitwise reproducible run to run and thread count to
// thread count (parallelism splits the element range, never the rank order). Accumulation type:
// F32 for F32, BF16 and F16 (rounded once at the end), F64 for F64, the integer type itself for
// I32/I64 (sums and products wrap around), bool for Bool (sum/max/bor = or, product/min/band =
// and, bxor = xor). Avg is the sum divided by the group size at the end (integers truncate toward
// zero). Min/Max propagate NaN. NCCL's Avg on floats instead pre-multiplies each input by 1/n
// (see docs/backends.md); compare such results with a tolerance.
#pragma once

#include <cstdint>

#include <spmd/collectives/types.h>
#include <spmd/tensor/dtype.h>

namespace spmd {

// out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[k-1][i] for i < n, all buffers
// contiguous with dtype `dtype`; `out` may alias inputs[0]. Bitwise ops on floating dtypes and
// Avg on Bool are Unsupported (callers validate first).
void reduce_buffers(DType dtype, ReduceOp op, const void* const* inputs, int64_t k, void* out,
                    int64_t n);

}  // namespace spmd
