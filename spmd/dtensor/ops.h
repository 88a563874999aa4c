// spmd/dtensor/ops.h: the Tensor ops on DTensors, with sharding propagation.
//
// Each op picks, among the ways it can run on the pieces, the one whose input redistributions
// the cost model prices lowest, redistributes, runs shard by shard, and returns a DTensor whose
// placements say how its pieces relate to the single-device result. All go through dispatch()
// (dtensor/dispatch.h), so decisions are cached (sharding_cache_stats()) and observable
// (dtensor/hooks.h).
//
//   DTensor y = matmul(x, w);   // x {S(0), R} @ w {R, S(1)} -> y {S(0), S(1)}, no communication
//   DTensor s = sum(y, {1});    // the sharded dim 1 is reduced: s is {S(0), P(sum)}
//   DTensor m = mean(x);        // even shards: {P(avg), R}; uneven ones are gathered first
//
// Rules (per mesh dim; R is always possible by redistributing to Replicate first):
//   - pointwise ops keep Shard placements, with broadcasting (a broadcast dim is not sharded);
//   - Partial passes only where the op commutes with the reduction: add/sub of two P(sum) or two
//     P(avg); P(avg), P(max), P(min) plus or minus a Replicate; mul/div of P(sum) or P(avg) by a
//     Replicate; maximum of P(max)s (or with a Replicate), minimum of P(min)s; scalar mul/div
//     keep sum and avg (and max/min, swapped for a negative scalar); scalar add/sub keep avg, max
//     and min; neg keeps sum and avg and swaps max and min; exp, tanh and relu (non-decreasing)
//     keep max and min; everything else needs Replicate;
//   - matmul/bmm/addmm follow einsum: S(0)@R -> S(0), R@S(1) -> S(1), S(1)@S(0) -> P(sum),
//     batch dims sharded alike; a linear Partial on one operand passes (addmm's c then must be
//     the same Partial, a free local partition from R);
//   - sum/mean/amax/amin: a reduced sharded dim becomes P(sum)/P(avg)/P(max)/P(min); mean gives
//     P(avg) only when every shard of that dim has the same size (else Replicate, so the result
//     equals the single-device mean); a P(sum)/P(avg) input passes through sum and mean, P(max)
//     through amax, P(min) through amin;
//   - softmax/log_softmax need the softmax dim replicated;
//   - transpose moves shards with their dims; Partial passes;
//   - reshape keeps a shard only when the reshape maps every rank's piece onto the piece the
//     output placement gives it (first dim of a merged or split group, torch.chunk sizes
//     agreeing); otherwise that mesh dim is gathered first (pytorch/pytorch#179502 let such
//     views through silently).
//
// A plain Tensor operand is a PlacementError unless ImplicitReplication is active
// (dtensor/dispatch.h), which treats it as Replicate on the DTensor's mesh.
#pragma once

#include <cstdint>
#include <vector>

#include <spmd/dtensor/dispatch.h>
#include <spmd/dtensor/dtensor.h>

namespace spmd {

#define SPMD_DTENSOR_BINARY_(name)                  \
  DTensor name(const DTensor& a, const DTensor& b); \
  DTensor name(const DTensor& a, const Tensor& b);  \
  DTensor name(const Tensor& a, const DTensor& b);
SPMD_DTENSOR_BINARY_(add)
SPMD_DTENSOR_BINARY_(sub)
SPMD_DTENSOR_BINARY_(mul)
SPMD_DTENSOR_BINARY_(div)
SPMD_DTENSOR_BINARY_(maximum)
SPMD_DTENSOR_BINARY_(minimum)
SPMD_DTENSOR_BINARY_(matmul)
SPMD_DTENSOR_BINARY_(bmm)
#undef SPMD_DTENSOR_BINARY_

#define SPMD_DTENSOR_OPERATOR_(op)                         \
  DTensor operator op(const DTensor& a, const DTensor& b); \
  DTensor operator op(const DTensor& a, const Tensor& b);  \
  DTensor operator op(const Tensor& a, const DTensor& b);  \
  DTensor operator op(const DTensor& a, double b);         \
  DTensor operator op(double a, const DTensor& b);
SPMD_DTENSOR_OPERATOR_(+)
SPMD_DTENSOR_OPERATOR_(-)
SPMD_DTENSOR_OPERATOR_(*)
SPMD_DTENSOR_OPERATOR_(/)
#undef SPMD_DTENSOR_OPERATOR_
DTensor operator-(const DTensor& a);

// beta * c + alpha * (a @ b), with a [n,k], b [k,m], c broadcastable to [n,m].
DTensor addmm(const DTensor& c, const DTensor& a, const DTensor& b, double beta = 1.0,
              double alpha = 1.0);

DTensor neg(const DTensor& t);
DTensor abs(const DTensor& t);
DTensor exp(const DTensor& t);
DTensor log(const DTensor& t);
DTensor sqrt(const DTensor& t);
DTensor tanh(const DTensor& t);
DTensor relu(const DTensor& t);
DTensor gelu(const DTensor& t);

// Over all dims, or over `dims` (each once, negative allowed; empty means all).
DTensor sum(const DTensor& t);
DTensor sum(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
DTensor mean(const DTensor& t);
DTensor mean(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
DTensor amax(const DTensor& t);
DTensor amax(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
DTensor amin(const DTensor& t);
DTensor amin(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);

DTensor softmax(const DTensor& t, int64_t d);
DTensor log_softmax(const DTensor& t, int64_t d);

DTensor transpose(const DTensor& t, int64_t a, int64_t b);
// One size may be -1.
DTensor reshape(const DTensor& t, const Shape& shape);

}  // namespace spmd
