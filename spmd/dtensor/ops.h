// spmd/dtensor/ops.h: every op of the op table (ops/ops.h) on DTensors, with sharding propagation.
//
// Each function is one call into the op's entry through dispatch() (dtensor/dispatch.h): the op
// picks, among the ways it can run on the pieces (its entry's strategies), the one whose input
// redistributions the cost model prices lowest, redistributes, runs on every held rank's pieces,
// and returns a DTensor whose placements say how its pieces relate to the single-device result.
// Decisions are cached (sharding_cache_stats()) and observable (dtensor/hooks.h).
//
//   DTensor y = matmul(x, w);   // x {S(0), R} @ w {R, S(1)} -> y {S(0), S(1)}, no communication
//   DTensor s = sum(y, {1});    // the sharded dim 1 is reduced: s is {S(0), P(sum)}
//   DTensor m = mean(x);        // even shards: {P(avg), R}; uneven ones are gathered first
//
// Rules (per mesh dim; R is always possible by redistributing to Replicate first; each entry
// states its own):
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
#include <spmd/ops/ops.h>

namespace spmd {

inline DTensor add(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::add, {a, b}, {}, loc);
}
inline DTensor add(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::add, {a, b}, {}, loc);
}
inline DTensor add(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::add, {a, b}, {}, loc);
}
inline DTensor sub(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sub, {a, b}, {}, loc);
}
inline DTensor sub(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sub, {a, b}, {}, loc);
}
inline DTensor sub(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sub, {a, b}, {}, loc);
}
inline DTensor mul(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mul, {a, b}, {}, loc);
}
inline DTensor mul(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mul, {a, b}, {}, loc);
}
inline DTensor mul(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mul, {a, b}, {}, loc);
}
inline DTensor div(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::div, {a, b}, {}, loc);
}
inline DTensor div(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::div, {a, b}, {}, loc);
}
inline DTensor div(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::div, {a, b}, {}, loc);
}
inline DTensor maximum(const DTensor& a, const DTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::maximum, {a, b}, {}, loc);
}
inline DTensor maximum(const DTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::maximum, {a, b}, {}, loc);
}
inline DTensor maximum(const Tensor& a, const DTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::maximum, {a, b}, {}, loc);
}
inline DTensor minimum(const DTensor& a, const DTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::minimum, {a, b}, {}, loc);
}
inline DTensor minimum(const DTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::minimum, {a, b}, {}, loc);
}
inline DTensor minimum(const Tensor& a, const DTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::minimum, {a, b}, {}, loc);
}
inline DTensor matmul(const DTensor& a, const DTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::matmul, {a, b}, {}, loc);
}
inline DTensor matmul(const DTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::matmul, {a, b}, {}, loc);
}
inline DTensor matmul(const Tensor& a, const DTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::matmul, {a, b}, {}, loc);
}
inline DTensor bmm(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::bmm, {a, b}, {}, loc);
}
inline DTensor bmm(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::bmm, {a, b}, {}, loc);
}
inline DTensor bmm(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::bmm, {a, b}, {}, loc);
}

inline DTensor pow(const DTensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::pow, {a, b}, {}, loc);
}
inline DTensor pow(const DTensor& a, const Tensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::pow, {a, b}, {}, loc);
}
inline DTensor pow(const Tensor& a, const DTensor& b,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::pow, {a, b}, {}, loc);
}

inline DTensor operator+(At<DTensor> a, const DTensor& b) {
  return add(a.value, b, a.loc);
}
inline DTensor operator+(At<DTensor> a, const Tensor& b) {
  return add(a.value, b, a.loc);
}
inline DTensor operator+(const Tensor& a, At<DTensor> b) {
  return add(a, b.value, b.loc);
}
inline DTensor operator+(At<DTensor> a, double b) {
  return dispatch(op::add_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline DTensor operator+(double a, At<DTensor> b) {
  return dispatch(op::add_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline DTensor operator-(At<DTensor> a, const DTensor& b) {
  return sub(a.value, b, a.loc);
}
inline DTensor operator-(At<DTensor> a, const Tensor& b) {
  return sub(a.value, b, a.loc);
}
inline DTensor operator-(const Tensor& a, At<DTensor> b) {
  return sub(a, b.value, b.loc);
}
inline DTensor operator-(At<DTensor> a, double b) {
  return dispatch(op::sub_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline DTensor operator-(double a, At<DTensor> b) {
  return dispatch(op::rsub_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline DTensor operator*(At<DTensor> a, const DTensor& b) {
  return mul(a.value, b, a.loc);
}
inline DTensor operator*(At<DTensor> a, const Tensor& b) {
  return mul(a.value, b, a.loc);
}
inline DTensor operator*(const Tensor& a, At<DTensor> b) {
  return mul(a, b.value, b.loc);
}
inline DTensor operator*(At<DTensor> a, double b) {
  return dispatch(op::mul_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline DTensor operator*(double a, At<DTensor> b) {
  return dispatch(op::mul_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline DTensor operator/(At<DTensor> a, const DTensor& b) {
  return div(a.value, b, a.loc);
}
inline DTensor operator/(At<DTensor> a, const Tensor& b) {
  return div(a.value, b, a.loc);
}
inline DTensor operator/(const Tensor& a, At<DTensor> b) {
  return div(a, b.value, b.loc);
}
inline DTensor operator/(At<DTensor> a, double b) {
  return dispatch(op::div_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline DTensor operator/(double a, At<DTensor> b) {
  return dispatch(op::rdiv_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline DTensor operator-(At<DTensor> a) {
  return dispatch(op::neg, {a.value}, {}, a.loc);
}

// beta * c + alpha * (a @ b), with a [n,k], b [k,m], c broadcastable to [n,m].
inline DTensor addmm(const DTensor& c, const DTensor& a, const DTensor& b, double beta = 1.0,
                     double alpha = 1.0, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::addmm, {c, a, b}, {{}, {beta, alpha}}, loc);
}

inline DTensor neg(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::neg, {t}, {}, loc);
}
inline DTensor abs(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::abs, {t}, {}, loc);
}
inline DTensor exp(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::exp, {t}, {}, loc);
}
inline DTensor log(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::log, {t}, {}, loc);
}
inline DTensor sqrt(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sqrt, {t}, {}, loc);
}
inline DTensor rsqrt(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::rsqrt, {t}, {}, loc);
}
inline DTensor tanh(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::tanh, {t}, {}, loc);
}
inline DTensor relu(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::relu, {t}, {}, loc);
}
inline DTensor gelu(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::gelu, {t}, {}, loc);
}

// Over all dims, or over `dims` (each once, negative allowed; empty means all).
inline DTensor sum(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sum, {t}, reduction_args({}, false), loc);
}
inline DTensor sum(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sum, {t}, reduction_args(dims, keepdim), loc);
}
inline DTensor mean(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mean, {t}, reduction_args({}, false), loc);
}
inline DTensor mean(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mean, {t}, reduction_args(dims, keepdim), loc);
}
inline DTensor amax(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::amax, {t}, reduction_args({}, false), loc);
}
inline DTensor amax(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::amax, {t}, reduction_args(dims, keepdim), loc);
}
inline DTensor amin(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::amin, {t}, reduction_args({}, false), loc);
}
inline DTensor amin(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::amin, {t}, reduction_args(dims, keepdim), loc);
}

inline DTensor softmax(const DTensor& t, int64_t d,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::softmax, {t}, {{d}, {}}, loc);
}
inline DTensor log_softmax(const DTensor& t, int64_t d,
                           SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::log_softmax, {t}, {{d}, {}}, loc);
}

inline DTensor transpose(const DTensor& t, int64_t a, int64_t b,
                         SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::transpose, {t}, {{a, b}, {}}, loc);
}
// One size may be -1.
inline DTensor reshape(const DTensor& t, const Shape& shape,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::reshape, {t}, {shape, {}}, loc);
}
// Concatenate along d (all on one mesh); shards of the other dims and shared Partials pass.
inline DTensor cat(const std::vector<DTensor>& tensors, int64_t d = 0,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::cat, tensors, {{d}, {}}, loc);
}
inline DTensor stack(const std::vector<DTensor>& tensors, int64_t d = 0,
                     SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::stack, tensors, {{d}, {}}, loc);
}
inline DTensor pad(const DTensor& t, int64_t d, int64_t before, int64_t after, double value = 0.0,
                   SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::pad, {t}, {{d, before, after}, {value}}, loc);
}

inline DTensor narrow(const DTensor& t, int64_t d, int64_t start, int64_t length,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::narrow, {t}, {{d, start, length}, {}}, loc);
}
inline DTensor select(const DTensor& t, int64_t d, int64_t index,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::select, {t}, {{d, index}, {}}, loc);
}
inline DTensor permute(const DTensor& t, const std::vector<int64_t>& dims,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::permute, {t}, {dims, {}}, loc);
}
inline DTensor unsqueeze(const DTensor& t, int64_t d,
                         SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::unsqueeze, {t}, {{d}, {}}, loc);
}
inline DTensor squeeze(const DTensor& t, int64_t d,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::squeeze, {t}, {{d}, {}}, loc);
}
inline DTensor expand(const DTensor& t, const Shape& shape,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::expand, {t}, {shape, {}}, loc);
}
inline DTensor clone(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::clone, {t}, {}, loc);
}
// The same DTensor in another dtype.
inline DTensor to(const DTensor& t, DType dtype, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::to_dtype, {t}, {{static_cast<int64_t>(dtype)}, {}}, loc);
}
// Elementwise comparisons with broadcasting; Bool results.
inline DTensor eq(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::eq, {a, b}, {}, loc);
}
inline DTensor ne(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::ne, {a, b}, {}, loc);
}
inline DTensor lt(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::lt, {a, b}, {}, loc);
}
inline DTensor le(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::le, {a, b}, {}, loc);
}
inline DTensor gt(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::gt, {a, b}, {}, loc);
}
inline DTensor ge(const DTensor& a, const DTensor& b,
                  SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::ge, {a, b}, {}, loc);
}
}  // namespace spmd
