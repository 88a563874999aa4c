// spmd/world/local_ops.h: every op of the op table (ops/ops.h), applied to LocalTensor shard by
// shard.
//
// Each function is one call into the op's entry: local_call() runs the entry on every held rank's
// shard. Operands must hold the same ranks. A plain Tensor or double operand is the same on every
// rank. When every LocalTensor operand is replicated (Note [Copy-on-write replicas]) the op runs
// once and the result is replicated too.
#pragma once

#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

// An operand of a LocalTensor op: a LocalTensor (one shard per rank) or a plain Tensor (the same
// on every rank).
class LocalOperand {
 public:
  LocalOperand(const LocalTensor& t) : local_(&t) {}  // NOLINT: implicit by design
  LocalOperand(const Tensor& t) : tensor_(&t) {}      // NOLINT: implicit by design
  const LocalTensor* local() const { return local_; }
  const Tensor* tensor() const { return tensor_; }

 private:
  const LocalTensor* local_ = nullptr;
  const Tensor* tensor_ = nullptr;
};

// Runs `op` on every held rank's shards (at least one operand is a LocalTensor). Error naming the
// op when an operand is undefined or the operands hold different ranks.
// `loc` is the user's call site (Note [User call sites] in core/call_site.h).
LocalTensor local_call(const OpDef& op, std::initializer_list<LocalOperand> inputs,
                       const OpArgs& args = {}, SourceLocation loc = SourceLocation::current());
LocalTensor local_call(const OpDef& op, std::span<const LocalTensor> inputs,
                       const OpArgs& args = {}, SourceLocation loc = SourceLocation::current());

inline LocalTensor add(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::add, {a, b}, {}, loc);
}
inline LocalTensor add(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::add, {a, b}, {}, loc);
}
inline LocalTensor add(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::add, {a, b}, {}, loc);
}
inline LocalTensor sub(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sub, {a, b}, {}, loc);
}
inline LocalTensor sub(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sub, {a, b}, {}, loc);
}
inline LocalTensor sub(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sub, {a, b}, {}, loc);
}
inline LocalTensor mul(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mul, {a, b}, {}, loc);
}
inline LocalTensor mul(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mul, {a, b}, {}, loc);
}
inline LocalTensor mul(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mul, {a, b}, {}, loc);
}
inline LocalTensor div(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::div, {a, b}, {}, loc);
}
inline LocalTensor div(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::div, {a, b}, {}, loc);
}
inline LocalTensor div(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::div, {a, b}, {}, loc);
}
inline LocalTensor maximum(const LocalTensor& a, const LocalTensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::maximum, {a, b}, {}, loc);
}
inline LocalTensor maximum(const LocalTensor& a, const Tensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::maximum, {a, b}, {}, loc);
}
inline LocalTensor maximum(const Tensor& a, const LocalTensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::maximum, {a, b}, {}, loc);
}
inline LocalTensor minimum(const LocalTensor& a, const LocalTensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::minimum, {a, b}, {}, loc);
}
inline LocalTensor minimum(const LocalTensor& a, const Tensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::minimum, {a, b}, {}, loc);
}
inline LocalTensor minimum(const Tensor& a, const LocalTensor& b,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::minimum, {a, b}, {}, loc);
}
inline LocalTensor matmul(const LocalTensor& a, const LocalTensor& b,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::matmul, {a, b}, {}, loc);
}
inline LocalTensor matmul(const LocalTensor& a, const Tensor& b,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::matmul, {a, b}, {}, loc);
}
inline LocalTensor matmul(const Tensor& a, const LocalTensor& b,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::matmul, {a, b}, {}, loc);
}
inline LocalTensor bmm(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::bmm, {a, b}, {}, loc);
}
inline LocalTensor bmm(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::bmm, {a, b}, {}, loc);
}
inline LocalTensor bmm(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::bmm, {a, b}, {}, loc);
}

// Each rank's rows in groups of its own sizes (Note [Grouped matmul] in ops/grouped.cpp).
inline LocalTensor grouped_mm(const LocalTensor& x, const LocalTensor& w, const LocalTensor& sizes,
                              SourceLocation loc = SourceLocation::current()) {
  return local_call(op::grouped_mm, {x, w, sizes}, {}, loc);
}
inline LocalTensor grouped_mm(const LocalTensor& x, const LocalTensor& w, const Tensor& sizes,
                              SourceLocation loc = SourceLocation::current()) {
  return local_call(op::grouped_mm, {x, w, sizes}, {}, loc);
}

inline LocalTensor pow(const LocalTensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::pow, {a, b}, {}, loc);
}
inline LocalTensor pow(const LocalTensor& a, const Tensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::pow, {a, b}, {}, loc);
}
inline LocalTensor pow(const Tensor& a, const LocalTensor& b,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::pow, {a, b}, {}, loc);
}

inline LocalTensor operator+(At<LocalTensor> a, const LocalTensor& b) {
  return add(a.value, b, a.loc);
}
inline LocalTensor operator+(At<LocalTensor> a, const Tensor& b) {
  return add(a.value, b, a.loc);
}
inline LocalTensor operator+(const Tensor& a, At<LocalTensor> b) {
  return add(a, b.value, b.loc);
}
inline LocalTensor operator+(At<LocalTensor> a, double b) {
  return local_call(op::add_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline LocalTensor operator+(double a, At<LocalTensor> b) {
  return local_call(op::add_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline LocalTensor operator-(At<LocalTensor> a, const LocalTensor& b) {
  return sub(a.value, b, a.loc);
}
inline LocalTensor operator-(At<LocalTensor> a, const Tensor& b) {
  return sub(a.value, b, a.loc);
}
inline LocalTensor operator-(const Tensor& a, At<LocalTensor> b) {
  return sub(a, b.value, b.loc);
}
inline LocalTensor operator-(At<LocalTensor> a, double b) {
  return local_call(op::sub_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline LocalTensor operator-(double a, At<LocalTensor> b) {
  return local_call(op::rsub_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline LocalTensor operator*(At<LocalTensor> a, const LocalTensor& b) {
  return mul(a.value, b, a.loc);
}
inline LocalTensor operator*(At<LocalTensor> a, const Tensor& b) {
  return mul(a.value, b, a.loc);
}
inline LocalTensor operator*(const Tensor& a, At<LocalTensor> b) {
  return mul(a, b.value, b.loc);
}
inline LocalTensor operator*(At<LocalTensor> a, double b) {
  return local_call(op::mul_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline LocalTensor operator*(double a, At<LocalTensor> b) {
  return local_call(op::mul_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline LocalTensor operator/(At<LocalTensor> a, const LocalTensor& b) {
  return div(a.value, b, a.loc);
}
inline LocalTensor operator/(At<LocalTensor> a, const Tensor& b) {
  return div(a.value, b, a.loc);
}
inline LocalTensor operator/(const Tensor& a, At<LocalTensor> b) {
  return div(a, b.value, b.loc);
}
inline LocalTensor operator/(At<LocalTensor> a, double b) {
  return local_call(op::div_scalar, {a.value}, {{}, {b}}, a.loc);
}
inline LocalTensor operator/(double a, At<LocalTensor> b) {
  return local_call(op::rdiv_scalar, {b.value}, {{}, {a}}, b.loc);
}
inline LocalTensor operator-(At<LocalTensor> a) {
  return local_call(op::neg, {a.value}, {}, a.loc);
}

// FP8 GEMM per rank (Note [Scaled matmul] in ops/linalg.cpp).
inline LocalTensor scaled_mm(const LocalTensor& a, const LocalTensor& b, const LocalTensor& scale_a,
                             const LocalTensor& scale_b, DType out_dtype = DType::BF16,
                             SourceLocation loc = SourceLocation::current()) {
  return local_call(op::scaled_mm, {a, b, scale_a, scale_b},
                    {{static_cast<int64_t>(out_dtype)}, {}}, loc);
}

// x @ w with FP8 training's casts and GEMMs per rank (Note [Float8 training] in
// ops/linalg.cpp); each rank's scales are its own shards' amax (all_reduce them for the global
// scale DTensor code gets).
LocalTensor float8_matmul(const LocalTensor& x, const LocalTensor& w,
                          SourceLocation loc = SourceLocation::current());

inline LocalTensor addmm(const LocalTensor& c, const LocalTensor& a, const LocalTensor& b,
                         double beta = 1.0, double alpha = 1.0,
                         SourceLocation loc = SourceLocation::current()) {
  return local_call(op::addmm, {c, a, b}, {{}, {beta, alpha}}, loc);
}

inline LocalTensor neg(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::neg, {t}, {}, loc);
}
inline LocalTensor abs(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::abs, {t}, {}, loc);
}
inline LocalTensor exp(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::exp, {t}, {}, loc);
}
inline LocalTensor log(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::log, {t}, {}, loc);
}
inline LocalTensor sqrt(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sqrt, {t}, {}, loc);
}
inline LocalTensor rsqrt(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::rsqrt, {t}, {}, loc);
}
inline LocalTensor tanh(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::tanh, {t}, {}, loc);
}
inline LocalTensor relu(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::relu, {t}, {}, loc);
}
inline LocalTensor gelu(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::gelu, {t}, {}, loc);
}
inline LocalTensor gelu(const LocalTensor& t, GeluApproximate approximate,
                        SourceLocation loc = SourceLocation::current()) {
  return local_call(approximate == GeluApproximate::Tanh ? op::gelu_tanh : op::gelu, {t}, {}, loc);
}
inline LocalTensor erf(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::erf, {t}, {}, loc);
}
inline LocalTensor sigmoid(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sigmoid, {t}, {}, loc);
}
inline LocalTensor silu(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::silu, {t}, {}, loc);
}
inline LocalTensor log1p(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::log1p, {t}, {}, loc);
}
inline LocalTensor expm1(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::expm1, {t}, {}, loc);
}
inline LocalTensor sin(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sin, {t}, {}, loc);
}
inline LocalTensor cos(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::cos, {t}, {}, loc);
}
inline LocalTensor reciprocal(const LocalTensor& t,
                              SourceLocation loc = SourceLocation::current()) {
  return local_call(op::reciprocal, {t}, {}, loc);
}
inline LocalTensor pow(const LocalTensor& t, double c,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::pow_scalar, {t}, {{}, {c}}, loc);
}
inline LocalTensor clamp(const LocalTensor& t, std::optional<double> min,
                         std::optional<double> max = std::nullopt,
                         SourceLocation loc = SourceLocation::current()) {
  return local_call(op::clamp, {t}, clamp_args(min, max), loc);
}

// ---- selecting, indexing and transformer layers (ops/ops.h has their contracts) -----------------

inline LocalTensor where(const LocalTensor& cond, const LocalTensor& a, const LocalTensor& b,
                         SourceLocation loc = SourceLocation::current()) {
  return local_call(op::where, {cond, a, b}, {}, loc);
}
inline LocalTensor masked_fill(const LocalTensor& t, const LocalTensor& mask, double value,
                               SourceLocation loc = SourceLocation::current()) {
  return local_call(op::masked_fill, {t, mask}, {{0}, {value}}, loc);
}
inline LocalTensor masked_fill(const LocalTensor& t, const Tensor& mask, double value,
                               SourceLocation loc = SourceLocation::current()) {
  return local_call(op::masked_fill, {t, mask}, {{0}, {value}}, loc);
}
inline LocalTensor triu(const LocalTensor& t, int64_t k = 0,
                        SourceLocation loc = SourceLocation::current()) {
  return local_call(op::triu, {t}, {{k}, {}}, loc);
}
inline LocalTensor tril(const LocalTensor& t, int64_t k = 0,
                        SourceLocation loc = SourceLocation::current()) {
  return local_call(op::tril, {t}, {{k}, {}}, loc);
}
inline LocalTensor argmax(const LocalTensor& t, int64_t d, bool keepdim = false,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::argmax, {t}, {{d, keepdim ? 1 : 0}, {}}, loc);
}
inline LocalTensor index_select(const LocalTensor& t, int64_t d, const LocalTensor& index,
                                SourceLocation loc = SourceLocation::current()) {
  return local_call(op::index_select, {t, index}, {{d}, {}}, loc);
}
inline LocalTensor index_select(const LocalTensor& t, int64_t d, const Tensor& index,
                                SourceLocation loc = SourceLocation::current()) {
  return local_call(op::index_select, {t, index}, {{d}, {}}, loc);
}
inline LocalTensor gather(const LocalTensor& t, int64_t d, const LocalTensor& index,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::gather, {t, index}, {{d}, {}}, loc);
}
// Ordering, scanning and counting: each rank's shard as the Tensor op (ops/ops.h). one_hot needs
// num_classes and bincount's result has exactly minlength bins (a value at or above it is a
// ShapeError), so every rank's result has one shape.
inline ValuesIndices<LocalTensor> topk(const LocalTensor& t, int64_t k, int64_t d = -1,
                                       bool largest = true, bool sorted = true,
                                       SourceLocation loc = SourceLocation::current()) {
  const LocalTensor i =
      local_call(op::topk_indices, {t}, {{d, k, largest ? 1 : 0, sorted ? 1 : 0}, {}}, loc);
  return {local_call(op::gather, {t, i}, {{d}, {}}, loc), i};
}
inline ValuesIndices<LocalTensor> sort(const LocalTensor& t, int64_t d = -1,
                                       bool descending = false,
                                       SourceLocation loc = SourceLocation::current()) {
  const LocalTensor i = local_call(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}}, loc);
  return {local_call(op::gather, {t, i}, {{d}, {}}, loc), i};
}
inline LocalTensor argsort(const LocalTensor& t, int64_t d = -1, bool descending = false,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}}, loc);
}
inline LocalTensor argmin(const LocalTensor& t, int64_t d, bool keepdim = false,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::argmin, {t}, {{d, keepdim ? 1 : 0}, {}}, loc);
}
namespace detail {
inline ValuesIndices<LocalTensor> max_min_of(const OpDef& arg, const LocalTensor& t, int64_t d,
                                             bool keepdim, SourceLocation loc) {
  const LocalTensor i = local_call(arg, {t}, {{d, 1}, {}}, loc);
  const LocalTensor v = local_call(op::gather, {t, i}, {{d}, {}}, loc);
  if (keepdim) return {v, i};
  return {local_call(op::squeeze, {v}, {{d}, {}}, loc),
          local_call(op::squeeze, {i}, {{d}, {}}, loc)};
}
}  // namespace detail
inline ValuesIndices<LocalTensor> max(const LocalTensor& t, int64_t d, bool keepdim = false,
                                      SourceLocation loc = SourceLocation::current()) {
  return detail::max_min_of(op::argmax, t, d, keepdim, loc);
}
inline ValuesIndices<LocalTensor> min(const LocalTensor& t, int64_t d, bool keepdim = false,
                                      SourceLocation loc = SourceLocation::current()) {
  return detail::max_min_of(op::argmin, t, d, keepdim, loc);
}
inline LocalTensor cumsum(const LocalTensor& t, int64_t d,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::cumsum, {t}, {{d, 0}, {}}, loc);
}
inline LocalTensor one_hot(const LocalTensor& indices, int64_t num_classes,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::one_hot, {indices}, {{num_classes}, {}}, loc);
}
inline LocalTensor bincount(const LocalTensor& x, int64_t minlength,
                            SourceLocation loc = SourceLocation::current()) {
  return local_call(op::bincount, {x}, {{minlength}, {}}, loc);
}
inline LocalTensor scatter_add(const LocalTensor& x, int64_t d, const LocalTensor& index,
                               const LocalTensor& src,
                               SourceLocation loc = SourceLocation::current()) {
  return local_call(op::scatter_add, {x, index, src}, {{d}, {}}, loc);
}
inline LocalTensor index_add(const LocalTensor& x, int64_t d, const LocalTensor& index,
                             const LocalTensor& source, double alpha = 1.0,
                             SourceLocation loc = SourceLocation::current()) {
  return local_call(op::index_add, {x, index, source}, {{d}, {alpha}}, loc);
}
inline LocalTensor scatter(const LocalTensor& x, int64_t d, const LocalTensor& index,
                           const LocalTensor& src, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::scatter, {x, index, src}, {{d}, {}}, loc);
}
inline LocalTensor scatter(const LocalTensor& x, int64_t d, const LocalTensor& index, double value,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::scatter, {x, index}, {{d, 1}, {value}}, loc);
}
// take_along_dim without broadcasting (the shards' shapes may differ by rank): gather.
inline LocalTensor take_along_dim(const LocalTensor& t, const LocalTensor& indices, int64_t d,
                                  SourceLocation loc = SourceLocation::current()) {
  return local_call(op::gather, {t, indices}, {{d}, {}}, loc);
}
inline LocalTensor embedding(const LocalTensor& ids, const LocalTensor& weight,
                             SourceLocation loc = SourceLocation::current()) {
  return local_call(op::embedding, {ids, weight}, {}, loc);
}
inline LocalTensor layer_norm(const LocalTensor& x, const LocalTensor& weight,
                              const LocalTensor& bias, double eps = 1e-5,
                              SourceLocation loc = SourceLocation::current()) {
  return local_call(op::layer_norm, {x, weight, bias}, {{}, {eps}}, loc);
}
inline LocalTensor rms_norm(const LocalTensor& x, const LocalTensor& weight, double eps = 1e-6,
                            SourceLocation loc = SourceLocation::current()) {
  return local_call(op::rms_norm, {x, weight}, {{}, {eps}}, loc);
}
inline LocalTensor adamw_step(const LocalTensor& param, const LocalTensor& grad,
                              const LocalTensor& exp_avg, const LocalTensor& exp_avg_sq,
                              const AdamWStep& s, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::adamw_step, {param, grad, exp_avg, exp_avg_sq}, adamw_args(s), loc);
}
// Every rank drops the elements of its own shard as dropout(shard, p, seed) would: ranks with
// equal shards drop alike (use DTensor dropout for a mask over a global tensor).
inline LocalTensor dropout(const LocalTensor& x, double p, uint64_t seed,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::dropout, {x}, dropout_args(p, seed), loc);
}
inline LocalTensor cross_entropy(const LocalTensor& logits, const LocalTensor& target,
                                 LossReduction reduction = LossReduction::Mean,
                                 SourceLocation loc = SourceLocation::current()) {
  return local_call(op::cross_entropy, {logits, target},
                    loss_args(CrossEntropyOptions{.reduction = reduction}), loc);
}
// Each rank's own loss (a Mean over its own elements not ignored).
inline LocalTensor cross_entropy(const LocalTensor& logits, const LocalTensor& target,
                                 const CrossEntropyOptions& options,
                                 SourceLocation loc = SourceLocation::current()) {
  return local_call(op::cross_entropy, {logits, target}, loss_args(options), loc);
}
inline LocalTensor nll_loss(const LocalTensor& log_probs, const LocalTensor& target,
                            const NllLossOptions& options = {},
                            SourceLocation loc = SourceLocation::current()) {
  return local_call(op::nll_loss, {log_probs, target}, loss_args(options), loc);
}
inline LocalTensor mse_loss(const LocalTensor& a, const LocalTensor& b,
                            LossReduction reduction = LossReduction::Mean,
                            SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mse_loss, {a, b}, {{loss_reduction_code(reduction)}, {}}, loc);
}
LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, bool causal = false,
                                         std::optional<double> scale = std::nullopt,
                                         SourceLocation loc = SourceLocation::current());
LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, const AttentionOptions& options,
                                         SourceLocation loc = SourceLocation::current());
LocalTensor scaled_dot_product_attention(const LocalTensor& q, const LocalTensor& k,
                                         const LocalTensor& v, const LocalTensor& attn_mask,
                                         const AttentionOptions& options = {},
                                         SourceLocation loc = SourceLocation::current());
inline LocalTensor repeat_interleave(const LocalTensor& t, int64_t repeats, int64_t d,
                                     SourceLocation loc = SourceLocation::current()) {
  return local_call(op::repeat_interleave, {t}, {{repeats, d}, {}}, loc);
}
// Without positions each shard's rows are at 0, 1, ... (local code: pass the global positions).
inline LocalTensor rotary_embedding(const LocalTensor& x, const LocalTensor& positions,
                                    const RopeConfig& config = {},
                                    SourceLocation loc = SourceLocation::current()) {
  return local_call(op::rotary_embedding, {x, positions}, rope_args(config), loc);
}
inline LocalTensor rotary_embedding(const LocalTensor& x, const RopeConfig& config = {},
                                    SourceLocation loc = SourceLocation::current()) {
  return local_call(op::rotary_embedding, {x}, rope_args(config), loc);
}

inline LocalTensor logsumexp(const LocalTensor& t, const std::vector<int64_t>& dims,
                             bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::logsumexp, {t}, reduction_args(dims, keepdim), loc);
}
inline LocalTensor var(const LocalTensor& t, const std::vector<int64_t>& dims = {},
                       double correction = 1.0, bool keepdim = false,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::var, {t}, reduction_args(dims, keepdim, correction), loc);
}
inline LocalTensor std(const LocalTensor& t, const std::vector<int64_t>& dims = {},
                       double correction = 1.0, bool keepdim = false,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::std, {t}, reduction_args(dims, keepdim, correction), loc);
}
inline LocalTensor norm(const LocalTensor& t, double p = 2.0, const std::vector<int64_t>& dims = {},
                        bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::norm, {t}, reduction_args(dims, keepdim, p), loc);
}
inline LocalTensor prod(const LocalTensor& t, const std::vector<int64_t>& dims = {},
                        bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::prod, {t}, reduction_args(dims, keepdim), loc);
}

inline LocalTensor sum(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sum, {t}, reduction_args({}, false), loc);
}
inline LocalTensor sum(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim = false,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::sum, {t}, reduction_args(dims, keepdim), loc);
}
inline LocalTensor mean(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mean, {t}, reduction_args({}, false), loc);
}
inline LocalTensor mean(const LocalTensor& t, const std::vector<int64_t>& dims,
                        bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::mean, {t}, reduction_args(dims, keepdim), loc);
}
inline LocalTensor amax(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::amax, {t}, reduction_args({}, false), loc);
}
inline LocalTensor amax(const LocalTensor& t, const std::vector<int64_t>& dims,
                        bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::amax, {t}, reduction_args(dims, keepdim), loc);
}
inline LocalTensor amin(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::amin, {t}, reduction_args({}, false), loc);
}
inline LocalTensor amin(const LocalTensor& t, const std::vector<int64_t>& dims,
                        bool keepdim = false, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::amin, {t}, reduction_args(dims, keepdim), loc);
}

inline LocalTensor softmax(const LocalTensor& t, int64_t d,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::softmax, {t}, {{d}, {}}, loc);
}
inline LocalTensor log_softmax(const LocalTensor& t, int64_t d,
                               SourceLocation loc = SourceLocation::current()) {
  return local_call(op::log_softmax, {t}, {{d}, {}}, loc);
}

inline LocalTensor transpose(const LocalTensor& t, int64_t a, int64_t b,
                             SourceLocation loc = SourceLocation::current()) {
  return local_call(op::transpose, {t}, {{a, b}, {}}, loc);
}
inline LocalTensor reshape(const LocalTensor& t, const Shape& shape,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::reshape, {t}, {shape, {}}, loc);
}
inline LocalTensor cat(const std::vector<LocalTensor>& tensors, int64_t d = 0,
                       SourceLocation loc = SourceLocation::current()) {
  return local_call(op::cat, tensors, {{d}, {}}, loc);
}
inline LocalTensor stack(const std::vector<LocalTensor>& tensors, int64_t d = 0,
                         SourceLocation loc = SourceLocation::current()) {
  return local_call(op::stack, tensors, {{d}, {}}, loc);
}
inline LocalTensor pad(const LocalTensor& t, int64_t d, int64_t before, int64_t after,
                       double value = 0.0, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::pad, {t}, {{d, before, after}, {value}}, loc);
}
inline LocalTensor narrow(const LocalTensor& t, int64_t d, int64_t start, int64_t length,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::narrow, {t}, {{d, start, length}, {}}, loc);
}
inline LocalTensor select(const LocalTensor& t, int64_t d, int64_t index,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::select, {t}, {{d, index}, {}}, loc);
}
inline LocalTensor permute(const LocalTensor& t, const std::vector<int64_t>& dims,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::permute, {t}, {dims, {}}, loc);
}
inline LocalTensor unsqueeze(const LocalTensor& t, int64_t d,
                             SourceLocation loc = SourceLocation::current()) {
  return local_call(op::unsqueeze, {t}, {{d}, {}}, loc);
}
inline LocalTensor squeeze(const LocalTensor& t, int64_t d,
                           SourceLocation loc = SourceLocation::current()) {
  return local_call(op::squeeze, {t}, {{d}, {}}, loc);
}
inline LocalTensor expand(const LocalTensor& t, const Shape& shape,
                          SourceLocation loc = SourceLocation::current()) {
  return local_call(op::expand, {t}, {shape, {}}, loc);
}
inline LocalTensor clone(const LocalTensor& t, SourceLocation loc = SourceLocation::current()) {
  return local_call(op::clone, {t}, {}, loc);
}
inline LocalTensor contiguous(const LocalTensor& t,
                              SourceLocation loc = SourceLocation::current()) {
  return local_call(op::contiguous, {t}, {}, loc);
}
// The shards in `dtype` (the same LocalTensor when it has that dtype already, as Tensor::to).
inline LocalTensor to(const LocalTensor& t, DType dtype,
                      SourceLocation loc = SourceLocation::current()) {
  if (t.defined() && t.dtype() == dtype) return t;
  return local_call(op::to_dtype, {t}, {{static_cast<int64_t>(dtype)}, {}}, loc);
}
inline LocalTensor view(const LocalTensor& t, const Shape& shape,
                        SourceLocation loc = SourceLocation::current()) {
  return local_call(op::reshape, {t}, {shape, {}}, loc);
}
// Every rank's shard must have the same shape (ShapeError naming the ranks otherwise).
LocalTensor flatten(const LocalTensor& t, int64_t start = 0, int64_t end = -1,
                    SourceLocation loc = SourceLocation::current());
// Narrow pieces along d (every rank's shard must have the same size along d).
std::vector<LocalTensor> split(const LocalTensor& t, const std::vector<int64_t>& sizes,
                               int64_t d = 0, SourceLocation loc = SourceLocation::current());
std::vector<LocalTensor> chunk(const LocalTensor& t, int64_t chunks, int64_t d = 0,
                               SourceLocation loc = SourceLocation::current());
inline LocalTensor eq(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::eq, {a, b}, {}, loc);
}
inline LocalTensor eq(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::eq, {a, b}, {}, loc);
}
inline LocalTensor ne(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::ne, {a, b}, {}, loc);
}
inline LocalTensor ne(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::ne, {a, b}, {}, loc);
}
inline LocalTensor lt(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::lt, {a, b}, {}, loc);
}
inline LocalTensor lt(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::lt, {a, b}, {}, loc);
}
inline LocalTensor le(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::le, {a, b}, {}, loc);
}
inline LocalTensor le(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::le, {a, b}, {}, loc);
}
inline LocalTensor gt(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::gt, {a, b}, {}, loc);
}
inline LocalTensor gt(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::gt, {a, b}, {}, loc);
}
inline LocalTensor ge(const LocalTensor& a, const LocalTensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::ge, {a, b}, {}, loc);
}
inline LocalTensor ge(const LocalTensor& a, const Tensor& b,
                      SourceLocation loc = SourceLocation::current()) {
  return local_call(op::ge, {a, b}, {}, loc);
}
// Per-rank padding amounts (uneven shards pad by different amounts).
LocalTensor pad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                const PerRank<int64_t>& after, double value = 0.0);
LocalTensor unpad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                  const PerRank<int64_t>& after);

// Per-rank comparisons.
PerRank<bool> equal(const LocalTensor& a, const LocalTensor& b);
PerRank<bool> allclose(const LocalTensor& a, const LocalTensor& b, double rtol = 1e-5,
                       double atol = 1e-8);

// Factories over a world's held ranks (each rank gets the same values, stored once; R on every
// axis with types on).
LocalTensor zeros(const World& world, const Shape& shape, DType dtype = DType::F32,
                  SourceLocation loc = SourceLocation::current());
LocalTensor ones(const World& world, const Shape& shape, DType dtype = DType::F32,
                 SourceLocation loc = SourceLocation::current());
LocalTensor full(const World& world, const Shape& shape, double value, DType dtype = DType::F32,
                 SourceLocation loc = SourceLocation::current());
// Rank r holds randn(shape, seed + r): independent data per rank (V on every axis).
LocalTensor randn_per_rank(const World& world, const Shape& shape, uint64_t seed,
                           DType dtype = DType::F32,
                           SourceLocation loc = SourceLocation::current());

// The LocalTensor kind of autograd values (Note [Autograd]): ops run shard by shard; a gradient is
// a LocalTensor over the same ranks. Backward formulas that need a shape use the shards' common
// shape: autograd through them on shards of different shapes is Unsupported.
const VarKind& local_kind();
Var local_var(const LocalTensor& t);
inline Var to_var(const LocalTensor& t) {
  return local_var(t);
}

// backward(loss) of a LocalTensor of one element per rank (each rank's d loss / d loss = 1), or
// of a send's token (no elements: its backward receives the sent tensor's gradient, Note
// [Point-to-point]), or with an explicit output gradient.
void backward(const LocalTensor& loss, SourceLocation loc = SourceLocation::current());
void backward(const LocalTensor& output, const LocalTensor& grad,
              SourceLocation loc = SourceLocation::current());

// Sees the name, the LocalTensor operands and the result of every op above run through
// local_call while set, for --spmd-debug=nan (debug/). Null (the default) costs one relaxed atomic
// load per op.
using LocalOpObserver = void (*)(std::string_view op, std::span<const LocalTensor* const> inputs,
                                 const LocalTensor& result, const SourceLocation& location);
void set_local_op_observer(LocalOpObserver observer);

}  // namespace spmd
