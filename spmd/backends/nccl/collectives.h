// spmd/backends/nccl/collectives.h: the nccl backend's collectives: one run() per collective in
// collectives.cpp, the NCCL calls of its collective, reached by run_collective's visit.
//
// Note [NCCL semantics]
// The same results as sim (Note [Reduction order]) on data whose reductions are exact, with these
// differences, each the NCCL behaviour:
//   - Avg on floating dtypes pre-multiplies every input by 1/n (rounded to the dtype), then sums;
//     sim sums, then divides. Results differ in the last bits unless n is a power of two: tests
//     compare floating Avg with a tolerance (tests/collectives/conformance_test.cpp). Integer Avg
//     is the sum divided by n, truncated toward zero, as under sim.
//   - Floating sums and products reduce in NCCL's order (ring or tree), rounding to the dtype at
//     every hop (BF16/F16 too; sim accumulates BF16/F16 in F32 and rounds once).
//   - Min and Max on floating dtypes ignore NaN (fminf/fmaxf); sim propagates NaN.
//   - Bool travels as uint8: Sum/Max/BOr reduce with ncclMax, Product/Min/BAnd with ncclMin,
//     BXor with ncclSum followed by the low bit. BAnd/BOr/BXor on I32/I64, which NCCL lacks, are
//     an all_gather (or gather to the root) followed by the shared reduction order on the GPU.
//   - all_to_all, gather and scatter use ncclAlltoAll/ncclGather/ncclScatter on NCCL >= 2.28.3
//     (in the headers and at run time), else grouped ncclSend/ncclRecv, as all_to_all_single and
//     permute always do.
#pragma once

#include <spmd/backends/nccl/call.h>
#include <spmd/collectives/backend.h>

namespace spmd::nccl {

// Runs the collective `options` names for `c` (begun, its fingerprints exchanged) and returns its
// completed Work.
WorkPtr run_collective(Call& c, const LocalTensor& x, const CollectiveOptions& options);

}  // namespace spmd::nccl
