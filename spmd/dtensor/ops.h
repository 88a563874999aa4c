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
//   - pointwise ops keep Shard placements, with broadcasting (a broadcast dim is not sharded),
//     and keep their first input's placements whenever a strategy can (Note [Following the first
//     input] in dtensor/dispatch.cpp): `w - lr * dw` leaves w placed as it was;
//   - Partial passes only where the op commutes with the reduction: add/sub of two P(sum) or two
//     P(avg); P(avg), P(max), P(min) plus or minus a Replicate; mul/div of P(sum) or P(avg) by a
//     Replicate; maximum of P(max)s (or with a Replicate), minimum of P(min)s; scalar mul/div
//     keep sum and avg (and max/min, swapped for a negative scalar); scalar add/sub keep avg, max
//     and min; neg keeps sum and avg and swaps max and min; exp, expm1, tanh, relu and clamp
//     (non-decreasing) keep max and min; everything else needs Replicate;
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
//     views through silently);
//   - embedding, index_select and gather with the table sharded along the indexed dim and the
//     index whole give P(sum) (Note [Masked lookup] in ops/index.cpp); cross_entropy over logits
//     sharded by class runs as table ops, Megatron's vocabulary-parallel loss; attention shards
//     batch and heads; norms shard every dim but the last; dropout, triu and tril keep every
//     placement (the pieces know their global offsets).
//
// A plain Tensor operand is a PlacementError unless ImplicitReplication is active
// (dtensor/dispatch.h), which treats it as Replicate on the DTensor's mesh.
#pragma once

#include <cstdint>
#include <optional>
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

// The rows never split (they follow the sizes); w's columns S(2) give S(1), the inner dim S(1)
// of both gives P(sum).
inline DTensor grouped_mm(const DTensor& x, const DTensor& w, const DTensor& sizes,
                          SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::grouped_mm, {x, w, sizes}, {}, loc);
}
// Sizes the same on every rank: Replicate on x's mesh.
inline DTensor grouped_mm(const DTensor& x, const DTensor& w, const Tensor& sizes,
                          SourceLocation loc = SourceLocation::current()) {
  const DTensor replicated = distribute_tensor(
      sizes, x.mesh(), Placements(static_cast<size_t>(x.mesh().ndim()), Replicate{}));
  return dispatch(op::grouped_mm, {x, w, replicated}, {}, loc);
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

// FP8 GEMM with matmul's sharding, the scales replicated (Note [Scaled matmul] in
// ops/linalg.cpp).
inline DTensor scaled_mm(const DTensor& a, const DTensor& b, const DTensor& scale_a,
                         const DTensor& scale_b, DType out_dtype = DType::BF16,
                         SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scaled_mm, {a, b, scale_a, scale_b}, {{static_cast<int64_t>(out_dtype)}, {}},
                  loc);
}

// Which amaxes FP8 training's scales come from (Note [Float8 training] in ops/linalg.cpp).
struct Float8Options {
  // Mesh dims over which x and the output gradient are scaled rank by rank, each rank by its own
  // piece's amax (torchao under FSDP: {"dp"}, and "cp" under context parallelism). Over every
  // other mesh dim the amax is global (an all_reduce max): the default casts as one device does.
  std::vector<MeshDim> rank_local_dims;
};

// x @ w with FP8 training's casts and GEMMs (Note [Float8 training] in ops/linalg.cpp).
DTensor float8_matmul(const DTensor& x, const DTensor& w, const Float8Options& options = {},
                      SourceLocation loc = SourceLocation::current());

// A weight in its float8 form: `data` cast to f8e4m3fn with the tensorwise scale of `amax` (0-d
// f32, replicated), as fsdp_unshard_float8 gathers it (Note [Float8 all-gather] in nn/parallel.h).
struct Float8Weight {
  DTensor data;
  DTensor amax;
};
// float8_matmul with the weight cast already: the same values as float8_matmul(x, w) when w.amax is
// the amax of the whole weight; the weight's gradient is in x's dtype.
DTensor float8_matmul(const DTensor& x, const Float8Weight& w, const Float8Options& options = {},
                      SourceLocation loc = SourceLocation::current());

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
inline DTensor gelu(const DTensor& t, GeluApproximate approximate,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(approximate == GeluApproximate::Tanh ? op::gelu_tanh : op::gelu, {t}, {}, loc);
}
inline DTensor erf(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::erf, {t}, {}, loc);
}
inline DTensor sigmoid(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sigmoid, {t}, {}, loc);
}
inline DTensor silu(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::silu, {t}, {}, loc);
}
inline DTensor log1p(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::log1p, {t}, {}, loc);
}
inline DTensor expm1(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::expm1, {t}, {}, loc);
}
inline DTensor sin(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sin, {t}, {}, loc);
}
inline DTensor cos(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::cos, {t}, {}, loc);
}
inline DTensor reciprocal(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::reciprocal, {t}, {}, loc);
}
inline DTensor pow(const DTensor& t, double c, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::pow_scalar, {t}, {{}, {c}}, loc);
}
// Nondecreasing: P(max) and P(min) pass.
inline DTensor clamp(const DTensor& t, std::optional<double> min,
                     std::optional<double> max = std::nullopt,
                     SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::clamp, {t}, clamp_args(min, max), loc);
}

// ---- selecting, indexing and transformer layers (ops/ops.h has their contracts) -----------------

// Shards line up as for any elementwise op; a Partial of both branches passes.
inline DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b,
                     SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::where, {cond, a, b}, {}, loc);
}
// P(avg), P(max), P(min) pass, P(sum) when filling with 0.
inline DTensor masked_fill(const DTensor& t, const DTensor& mask, double value,
                           SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::masked_fill, {t, mask}, {{0}, {value}}, loc);
}
// Every placement passes: each piece masks with its block's global row and column.
inline DTensor triu(const DTensor& t, int64_t k = 0,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::triu, {t}, {{k}, {}}, loc);
}
inline DTensor tril(const DTensor& t, int64_t k = 0,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::tril, {t}, {{k}, {}}, loc);
}
// The dim d is gathered first when it is sharded; other shards pass.
inline DTensor argmax(const DTensor& t, int64_t d, bool keepdim = false,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::argmax, {t}, {{d, keepdim ? 1 : 0}, {}}, loc);
}
// A table sharded along d with a whole index gives P(sum) (Note [Masked lookup]).
inline DTensor index_select(const DTensor& t, int64_t d, const DTensor& index,
                            SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::index_select, {t, index}, {{d}, {}}, loc);
}
inline DTensor gather(const DTensor& t, int64_t d, const DTensor& index,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::gather, {t, index}, {{d}, {}}, loc);
}
// Ordering, scanning and counting (ops/sort.cpp): the dim d is gathered first when it is sharded,
// other shards pass; the values are gathered with the indices, so the gradient follows gather's
// strategies. cumsum also keeps P(sum) and P(avg). bincount of a sharded input gives P(sum) (each
// rank counts its piece); its length (as one_hot's num_classes = -1) comes from the global
// largest value, an all-reduce of one value.
inline ValuesIndices<DTensor> topk(const DTensor& t, int64_t k, int64_t d = -1, bool largest = true,
                                   bool sorted = true,
                                   SourceLocation loc = SourceLocation::current()) {
  const DTensor i =
      dispatch(op::topk_indices, {t}, {{d, k, largest ? 1 : 0, sorted ? 1 : 0}, {}}, loc);
  return {dispatch(op::gather, {t, i}, {{d}, {}}, loc), i};
}
inline ValuesIndices<DTensor> sort(const DTensor& t, int64_t d = -1, bool descending = false,
                                   SourceLocation loc = SourceLocation::current()) {
  const DTensor i = dispatch(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}}, loc);
  return {dispatch(op::gather, {t, i}, {{d}, {}}, loc), i};
}
inline DTensor argsort(const DTensor& t, int64_t d = -1, bool descending = false,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}}, loc);
}
inline DTensor argmin(const DTensor& t, int64_t d, bool keepdim = false,
                      SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::argmin, {t}, {{d, keepdim ? 1 : 0}, {}}, loc);
}
namespace detail {
inline ValuesIndices<DTensor> max_min_of(const OpDef& arg, const DTensor& t, int64_t d,
                                         bool keepdim, SourceLocation loc) {
  const DTensor i = dispatch(arg, {t}, {{d, 1}, {}}, loc);
  const DTensor v = dispatch(op::gather, {t, i}, {{d}, {}}, loc);
  if (keepdim) return {v, i};
  return {dispatch(op::squeeze, {v}, {{d}, {}}, loc), dispatch(op::squeeze, {i}, {{d}, {}}, loc)};
}
// The global smallest and largest value of x, as a [2] Tensor on every rank.
inline Tensor value_range(const DTensor& x, SourceLocation loc) {
  return dispatch(op::stack,
                  {dispatch(op::amin, {x}, reduction_args({}, false), loc),
                   dispatch(op::amax, {x}, reduction_args({}, false), loc)},
                  {{0}, {}}, loc)
      .full_tensor(loc);
}
}  // namespace detail
inline ValuesIndices<DTensor> max(const DTensor& t, int64_t d, bool keepdim = false,
                                  SourceLocation loc = SourceLocation::current()) {
  return detail::max_min_of(op::argmax, t, d, keepdim, loc);
}
inline ValuesIndices<DTensor> min(const DTensor& t, int64_t d, bool keepdim = false,
                                  SourceLocation loc = SourceLocation::current()) {
  return detail::max_min_of(op::argmin, t, d, keepdim, loc);
}
inline DTensor cumsum(const DTensor& t, int64_t d, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::cumsum, {t}, {{d, 0}, {}}, loc);
}
inline DTensor one_hot(const DTensor& indices, int64_t num_classes = -1,
                       SourceLocation loc = SourceLocation::current()) {
  if (num_classes == -1 && indices.numel() > 0 && indices.dtype() == DType::I64) {
    num_classes = one_hot_classes(detail::value_range(indices, loc), -1);
  }
  return dispatch(op::one_hot, {indices}, {{num_classes}, {}}, loc);
}
inline DTensor bincount(const DTensor& x, int64_t minlength = 0,
                        SourceLocation loc = SourceLocation::current()) {
  int64_t length = minlength;
  if (x.numel() > 0 && is_integral(x.dtype())) {
    length = bincount_length(detail::value_range(x, loc), minlength);
  }
  return dispatch(op::bincount, {x}, {{length}, {}}, loc);
}
// The user's scatters: shards of dims other than d pass (x, index and src sharded alike); x
// sharded along d with the rest whole: each rank writes its block. scatter_add and index_add
// with the index and src sharded along the source rows (tokens) and x a pending sum give P(sum):
// each rank adds its own tokens (a Replicate x is made a pending sum for free), the combine of a
// mixture of experts; P(sum) x and src with a whole index pass.
inline DTensor scatter_add(const DTensor& x, int64_t d, const DTensor& index, const DTensor& src,
                           SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scatter_add, {x, index, src}, {{d}, {}}, loc);
}
inline DTensor index_add(const DTensor& x, int64_t d, const DTensor& index, const DTensor& source,
                         double alpha = 1.0, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::index_add, {x, index, source}, {{d}, {alpha}}, loc);
}
inline DTensor scatter(const DTensor& x, int64_t d, const DTensor& index, const DTensor& src,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scatter, {x, index, src}, {{d}, {}}, loc);
}
inline DTensor scatter(const DTensor& x, int64_t d, const DTensor& index, double value,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scatter, {x, index}, {{d, 1}, {value}}, loc);
}
inline DTensor take_along_dim(const DTensor& t, const DTensor& indices, int64_t d,
                              SourceLocation loc = SourceLocation::current()) {
  const auto [xs, is] = take_along_dim_shapes(t.shape(), indices.shape(), d);
  return dispatch(
      op::gather,
      {dispatch(op::expand, {t}, {xs, {}}, loc), dispatch(op::expand, {indices}, {is, {}}, loc)},
      {{d}, {}}, loc);
}
// Vocabulary-parallel with the table's rows sharded (Shard(0)) and the ids whole: P(sum), whose
// reduction (all_reduce, or reduce_scatter into sequence parallelism) is the caller's next
// redistribute; the table's gradient stays sharded like the table.
inline DTensor embedding(const DTensor& ids, const DTensor& weight,
                         SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::embedding, {ids, weight}, {}, loc);
}
// Shards of every dim but the last pass (sequence parallelism); weight and bias Replicate.
inline DTensor layer_norm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                          double eps = 1e-5, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::layer_norm, {x, weight, bias}, {{}, {eps}}, loc);
}
inline DTensor rms_norm(const DTensor& x, const DTensor& weight, double eps = 1e-6,
                        SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::rms_norm, {x, weight}, {{}, {eps}}, loc);
}
// adamw_step on DTensors: every input sharded alike, the output's dim d + 1 as their dim d.
inline DTensor adamw_step(const DTensor& param, const DTensor& grad, const DTensor& exp_avg,
                          const DTensor& exp_avg_sq, const AdamWStep& s,
                          SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::adamw_step, {param, grad, exp_avg, exp_avg_sq}, adamw_args(s), loc);
}
// The mask of the global tensor, whatever the mesh and placements (Note [Mesh-invariant dropout]).
inline DTensor dropout(const DTensor& x, double p, uint64_t seed, DropoutRows of = {},
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::dropout, {x}, dropout_args(p, seed, of), loc);
}
// Rows shard (P(sum) of the mean or sum, the rows' shards with None); classes sharded run
// Megatron's vocabulary-parallel loss (Note [Vocabulary-parallel cross-entropy] in ops/nn.cpp):
// the logits are never gathered. nll_loss shards alike.
inline DTensor cross_entropy(const DTensor& logits, const DTensor& target,
                             LossReduction reduction = LossReduction::Mean,
                             SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::cross_entropy, {logits, target},
                  loss_args(CrossEntropyOptions{.reduction = reduction}), loc);
}
inline DTensor cross_entropy(const DTensor& logits, const DTensor& target,
                             const CrossEntropyOptions& options,
                             SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::cross_entropy, {logits, target}, loss_args(options), loc);
}
inline DTensor nll_loss(const DTensor& log_probs, const DTensor& target,
                        const NllLossOptions& options = {},
                        SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::nll_loss, {log_probs, target}, loss_args(options), loc);
}
// Inputs of one shape shard alike (P(sum) of the mean or sum, the shards with None).
inline DTensor mse_loss(const DTensor& a, const DTensor& b,
                        LossReduction reduction = LossReduction::Mean,
                        SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::mse_loss, {a, b}, {{loss_reduction_code(reduction)}, {}}, loc);
}
// Batch and head dims shard (tensor-parallel attention); query rows may shard with k, v whole.
inline DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                            bool causal = false,
                                            std::optional<double> scale = std::nullopt,
                                            SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scaled_dot_product_attention, {q, k, v},
                  attention_args(q.size(-1), causal, scale), loc);
}
// With GQA, q's heads shard with k, v whole on the heads when Hkv does not divide evenly over the
// mesh (Note [Attention sharding] in ops/nn.cpp); the mask shards with the query rows or heads.
inline DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                            const AttentionOptions& options,
                                            SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scaled_dot_product_attention, {q, k, v},
                  attention_args(q.size(-1), options, false), loc);
}
inline DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                            const DTensor& attn_mask,
                                            const AttentionOptions& options = {},
                                            SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::scaled_dot_product_attention, {q, k, v, attn_mask},
                  attention_args(q.size(-1), options, true), loc);
}
// Other dims' shards and every Partial pass; d sharded passes when its size divides evenly over
// the mesh dims that shard it (each block's copies stay on its rank).
inline DTensor repeat_interleave(const DTensor& t, int64_t repeats, int64_t d,
                                 SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::repeat_interleave, {t}, {{repeats, d}, {}}, loc);
}
// Every dim of x but the head dim shards, positions with x's rows; without positions a piece
// rotates its rows by their global index along S (context parallelism needs no positions).
inline DTensor rotary_embedding(const DTensor& x, const DTensor& positions,
                                const RopeConfig& config = {},
                                SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::rotary_embedding, {x, positions}, rope_args(config), loc);
}
inline DTensor rotary_embedding(const DTensor& x, const RopeConfig& config = {},
                                SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::rotary_embedding, {x}, rope_args(config), loc);
}

// Over all dims, or over `dims` (each once, negative allowed; empty means all).
// var, std and norm: the reduced dims gathered, the other dims keep their shards; prod: a sharded
// reduced dim gives P(product); logsumexp over a sharded dim runs as table ops (the maximum and
// the sum of exponentials all_reduced; the result P(max), the shift added last)
// (ops/reduction.cpp).
inline DTensor logsumexp(const DTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                         SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::logsumexp, {t}, reduction_args(dims, keepdim), loc);
}
inline DTensor var(const DTensor& t, const std::vector<int64_t>& dims = {}, double correction = 1.0,
                   bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::var, {t}, reduction_args(dims, keepdim, correction), loc);
}
inline DTensor std(const DTensor& t, const std::vector<int64_t>& dims = {}, double correction = 1.0,
                   bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::std, {t}, reduction_args(dims, keepdim, correction), loc);
}
inline DTensor norm(const DTensor& t, double p = 2.0, const std::vector<int64_t>& dims = {},
                    bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::norm, {t}, reduction_args(dims, keepdim, p), loc);
}
inline DTensor prod(const DTensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::prod, {t}, reduction_args(dims, keepdim), loc);
}

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
inline DTensor contiguous(const DTensor& t, SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::contiguous, {t}, {}, loc);
}
inline DTensor view(const DTensor& t, const Shape& shape,
                    SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::reshape, {t}, {shape, {}}, loc);
}
inline DTensor flatten(const DTensor& t, int64_t start = 0, int64_t end = -1,
                       SourceLocation loc = SourceLocation::current()) {
  return dispatch(op::reshape, {t}, {flattened_shape(t.shape(), start, end), {}}, loc);
}
// Narrow pieces along d of the global tensor.
inline std::vector<DTensor> split(const DTensor& t, const std::vector<int64_t>& sizes,
                                  int64_t d = 0, SourceLocation loc = SourceLocation::current()) {
  std::vector<DTensor> out;
  for (const auto& [start, length] : split_ranges(t.size(d), sizes, "split")) {
    out.push_back(narrow(t, d, start, length, loc));
  }
  return out;
}
inline std::vector<DTensor> chunk(const DTensor& t, int64_t chunks, int64_t d = 0,
                                  SourceLocation loc = SourceLocation::current()) {
  std::vector<DTensor> out;
  for (const auto& [start, length] : chunk_ranges(t.size(d), chunks)) {
    out.push_back(narrow(t, d, start, length, loc));
  }
  return out;
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
