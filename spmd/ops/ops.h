// spmd/ops/ops.h: the op table, and every op on Tensors.
//
// Each op is one entry of the table, `op::<name>`, an OpDef (ops/op.h): its meta, its math on
// Tensors, its sharding strategies, its reference and its backward slot. The elementwise entries
// are made from the functors of tensor/element_ops.h right here; the others are defined in
// ops/<family>.cpp. The functions below run an entry on Tensors; world/local_ops.h runs the same
// entries on LocalTensors shard by shard and dtensor/ops.h on DTensors with sharding propagation.
//
// Every op checks its inputs and throws a typed spmd::Error naming the op and the shapes:
// ShapeError for shapes and dims, Unsupported for dtype combinations an op does not take.
// Results are new contiguous tensors unless stated otherwise. Mixed dtypes promote by
// Note [Type promotion] (tensor/dtype.h). BF16/F16 arithmetic is done in F32 and rounded once.
//
//   Tensor a = arange(6).reshape({2, 3});
//   Tensor c = matmul(a, a.transpose(0, 1)) + 1.0;   // [2, 2]
//   Tensor s = sum(c, {1}, /*keepdim=*/true);         // [2, 1]
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <spmd/ops/op.h>
#include <spmd/ops/pointwise.h>
#include <spmd/tensor/compare.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

// ---- the table --------------------------------------------------------------------------------

namespace op {

// Elementwise, one input (tensor/element_ops.h has the math). Integer inputs of exp, log, sqrt,
// rsqrt, tanh, gelu, log1p, expm1, sin, cos and reciprocal give F32; neg, abs and relu keep
// integer dtypes (wrapping at the minimum).
inline constexpr OpDef neg = unary_op<element::Neg, PartialRule::Negation>();
inline constexpr OpDef abs = unary_op<element::Abs, PartialRule::None>();
inline constexpr OpDef exp = unary_op<element::Exp, PartialRule::NonDecreasing>();
inline constexpr OpDef log = unary_op<element::Log, PartialRule::None>();
inline constexpr OpDef sqrt = unary_op<element::Sqrt, PartialRule::None>();
inline constexpr OpDef rsqrt = unary_op<element::Rsqrt, PartialRule::None>();
inline constexpr OpDef tanh = unary_op<element::Tanh, PartialRule::NonDecreasing>();
inline constexpr OpDef relu = unary_op<element::Relu, PartialRule::NonDecreasing>();
inline constexpr OpDef gelu = unary_op<element::Gelu, PartialRule::None>();
inline constexpr OpDef gelu_tanh = unary_op<element::GeluTanh, PartialRule::None>();
inline constexpr OpDef erf = unary_op<element::Erf, PartialRule::NonDecreasing>();
inline constexpr OpDef sigmoid = unary_op<element::Sigmoid, PartialRule::NonDecreasing>();
inline constexpr OpDef silu = unary_op<element::Silu, PartialRule::None>();
inline constexpr OpDef log1p = unary_op<element::Log1p, PartialRule::None>();
inline constexpr OpDef expm1 = unary_op<element::Expm1, PartialRule::NonDecreasing>();
inline constexpr OpDef sin = unary_op<element::Sin, PartialRule::None>();
inline constexpr OpDef cos = unary_op<element::Cos, PartialRule::None>();
inline constexpr OpDef reciprocal = unary_op<element::Reciprocal, PartialRule::None>();

// Elementwise, two inputs with broadcasting. Integer add/sub/mul wrap around; div is true
// division (integer inputs give F32); maximum/minimum propagate NaN.
inline constexpr OpDef add = binary_op<element::Add, PartialRule::Additive>();
inline constexpr OpDef sub = binary_op<element::Sub, PartialRule::Subtractive>();
inline constexpr OpDef mul = binary_op<element::Mul, PartialRule::Multiplicative>();
inline constexpr OpDef div = binary_op<element::Div, PartialRule::Divisive>();
inline constexpr OpDef maximum = binary_op<element::Maximum, PartialRule::Max>();
inline constexpr OpDef minimum = binary_op<element::Minimum, PartialRule::Min>();
inline constexpr OpDef pow = binary_op<element::Pow, PartialRule::None>();
// Comparisons, elementwise with broadcasting: Bool results, no gradient.
inline constexpr OpDef eq = binary_op<element::Eq, PartialRule::None>();
inline constexpr OpDef ne = binary_op<element::Ne, PartialRule::None>();
inline constexpr OpDef lt = binary_op<element::Lt, PartialRule::None>();
inline constexpr OpDef le = binary_op<element::Le, PartialRule::None>();
inline constexpr OpDef gt = binary_op<element::Gt, PartialRule::None>();
inline constexpr OpDef ge = binary_op<element::Ge, PartialRule::None>();

// A tensor and a scalar c = args.reals[0] (ops/pointwise.cpp): x + c, x - c, c - x, x * c, x / c,
// c / x.
extern const OpDef add_scalar;
extern const OpDef sub_scalar;
extern const OpDef rsub_scalar;
extern const OpDef mul_scalar;
extern const OpDef div_scalar;
extern const OpDef rdiv_scalar;
// x ^ c (integer inputs give F32).
extern const OpDef pow_scalar;
// x limited to [min, max]: args.ints = [has min, has max], args.reals = [min, max] (clamp_args).
// Its backward entry takes (grad, x) and clamp's args.
extern const OpDef clamp;
extern const OpDef clamp_backward;

// where(cond, a, b): inputs (cond Bool, a, b), broadcasting. masked_fill(x, mask): args.reals =
// [value], args.ints = [invert] (1: fill where the mask is false; the backward's use).
extern const OpDef where;
extern const OpDef masked_fill;

// Linear algebra (ops/linalg.cpp). addmm: args.reals = [beta, alpha].
extern const OpDef matmul;
// matmul_weight_grad (x [..., K], grad [..., M], the same leading dims) -> [K, M]: the sum over
// the leading positions of x^T grad, one GEMM; matmul's gradient for a 2-D b and an a of 3 or
// more dims (Note [Folded weight gradient] in ops/linalg.cpp).
extern const OpDef matmul_weight_grad;
extern const OpDef bmm;
extern const OpDef addmm;
// scaled_mm (a, b float8 [M, K] and [K, N], scale_a, scale_b 0-d f32), args.ints = [out dtype]:
// torch._scaled_mm with tensorwise scales (Note [Scaled matmul] in ops/linalg.cpp).
extern const OpDef scaled_mm;
// float8_mm (a [..., K], b [K, N] in bf16/f16/f32/f64, amax_a, amax_b 0-d f32), args.ints =
// [format of a, format of b, rank-local mesh dims mask]: one linear of FP8 training, cast, FP8
// GEMM and its FP8 backward (Note [Float8 training] in ops/linalg.cpp).
extern const OpDef float8_mm;
// grouped_mm (x [N, K], w [G, K, M], sizes [G] I64): group g's rows times w[g] (ops/grouped.cpp,
// Note [Grouped matmul]); its weight gradient grouped_mm_backward (x, grad, sizes) -> [G, K, M].
extern const OpDef grouped_mm;
extern const OpDef grouped_mm_backward;

// Reductions (ops/reduction.cpp). args.ints = [keepdim, dims...]; no dims: every dim.
extern const OpDef sum;
extern const OpDef mean;
extern const OpDef amax;
extern const OpDef amin;

// args.ints = [dim, keepdim] (ops/reduction.cpp).
extern const OpDef argmax;
extern const OpDef argmin;
// Reductions with args.ints = [keepdim, dims...] (ops/reduction.cpp); var and std: args.reals =
// [correction], norm: [p] (reduction_args(dims, keepdim, real)).
extern const OpDef logsumexp;
extern const OpDef var;
extern const OpDef std;
extern const OpDef norm;
extern const OpDef prod;

// Softmax along args.ints[0] (ops/softmax.cpp). log_softmax_backward (grad, y) -> grad -
// exp(y) * sum(grad, dim): log_softmax's derivative as one op, reading its output alone
// (PyTorch's _log_softmax_backward_data).
extern const OpDef softmax;
extern const OpDef log_softmax;
extern const OpDef log_softmax_backward;

// Picking by index (ops/index.cpp, Note [Masked lookup]). index_select and gather: args.ints =
// [dim]; inputs (x, index). embedding: inputs (ids, weight). Their backward entries take (grad,
// index, the input or weight) and scatter the gradient into zeros of that input's shape.
extern const OpDef index_select;
extern const OpDef index_select_backward;
extern const OpDef gather;
extern const OpDef gather_backward;
extern const OpDef embedding;
extern const OpDef embedding_backward;

// Ordering, scanning and counting (ops/sort.cpp, Note [Ordering ties]). topk_indices: args.ints =
// [dim, k, largest, sorted]; sort_indices: [dim, descending]; their values are gathered with
// them. cumsum: [dim, reverse]. one_hot: [num_classes]. bincount: [length].
extern const OpDef topk_indices;
extern const OpDef sort_indices;
extern const OpDef cumsum;
extern const OpDef one_hot;
extern const OpDef bincount;
// The user's scatters (ops/index.cpp). scatter_add and scatter: args.ints = [dim], inputs (x,
// index, src); scatter's value form: [dim, 1], args.reals = [value], inputs (x, index).
// index_add: args.ints = [dim], args.reals = [alpha], inputs (x, index, source).
extern const OpDef scatter_add;
extern const OpDef index_add;
extern const OpDef scatter;

// Transformer layers (ops/nn.cpp). layer_norm (x, weight, bias) and rms_norm (x, weight):
// args.reals = [eps]; their backward entries (grad, x, weight), args.ints = [0: the input's
// gradient, 1: grad * x_hat]. dropout: args.reals = [p], args.seed. cross_entropy (logits [N, C,
// d...], target [N, d...]): loss_args. scaled_dot_product_attention (q, k, v[, mask]) and
// attention_probs (q, k[, mask]): args.ints = [causal, enable_gqa, has_mask] (the last two
// optional), args.reals = [scale]. attention_grad (q, k, v, grad[, mask]), attention's backward
// without S^2 buffers (Note [Blocked attention] in tensor/kernels/attention.cpp): args.ints =
// [causal, enable_gqa, has_mask, which] (0: dq, 1: dk and dv side by side on the last dim),
// args.reals = [scale].
extern const OpDef layer_norm;
extern const OpDef layer_norm_backward;
extern const OpDef rms_norm;
extern const OpDef rms_norm_backward;
extern const OpDef dropout;
extern const OpDef cross_entropy;
extern const OpDef cross_entropy_backward;
// Losses (ops/nn.cpp): nll_loss (log_probs [N, C, d...], target [N, d...]) takes loss_args as
// cross_entropy; its backward entry (grad, log_probs, target) too. mse_loss (a, b): args.ints =
// [reduction]; its backward is written with table ops.
extern const OpDef nll_loss;
extern const OpDef nll_loss_backward;
extern const OpDef mse_loss;
extern const OpDef scaled_dot_product_attention;
extern const OpDef attention_probs;
extern const OpDef attention_grad;
// Rotary embeddings (ops/rope.cpp, Note [Rotary embeddings]): inputs (x [..., S, H, D]) or (x,
// positions); args.ints = [sign, interleaved, scaled], args.reals = [theta, factor,
// low_freq_factor, high_freq_factor, original_max_position] (rope_args).
extern const OpDef rotary_embedding;
// One AdamW update (ops/optim.cpp, Note [Fused AdamW]): inputs (param, grad, exp_avg,
// exp_avg_sq), args.ints = [step], args.reals = [lr, beta1, beta2, eps, weight_decay] (adamw_args);
// the output [3, ...] stacks the new param, exp_avg and exp_avg_sq.
extern const OpDef adamw_step;

// Shapes (ops/shape.cpp). transpose: args.ints = [a, b]; reshape and expand: the shape; cat,
// stack, unsqueeze, squeeze: [d]; pad: [d, before, after], args.reals = [value]; narrow: [d,
// start, length]; select: [d, index]; permute: the dims; to_dtype: [DType as an integer].
extern const OpDef transpose;
extern const OpDef reshape;
extern const OpDef cat;
extern const OpDef stack;
extern const OpDef pad;
extern const OpDef narrow;
extern const OpDef select;
extern const OpDef permute;
extern const OpDef unsqueeze;
extern const OpDef squeeze;
extern const OpDef expand;
extern const OpDef clone;
extern const OpDef contiguous;
// args.ints = [diagonal].
extern const OpDef triu;
extern const OpDef tril;
extern const OpDef to_dtype;
// repeat_interleave: args.ints = [repeats, dim]; its backward entry (grad) sums each group of
// repeats rows: args.ints = [repeats, dim, the input's size along dim].
extern const OpDef repeat_interleave;
extern const OpDef repeat_interleave_backward;

}  // namespace op

// Every entry of the table above, in its order: tests/ops checks that each has its conformance row
// and its gradient check, and that no entry of the table is missing here.
inline std::span<const OpDef* const> all_ops() {
  static constexpr const OpDef* kAll[] = {
      // Elementwise, one input; two inputs; comparisons.
      &op::neg,
      &op::abs,
      &op::exp,
      &op::log,
      &op::sqrt,
      &op::rsqrt,
      &op::tanh,
      &op::relu,
      &op::gelu,
      &op::gelu_tanh,
      &op::erf,
      &op::sigmoid,
      &op::silu,
      &op::log1p,
      &op::expm1,
      &op::sin,
      &op::cos,
      &op::reciprocal,
      &op::add,
      &op::sub,
      &op::mul,
      &op::div,
      &op::maximum,
      &op::minimum,
      &op::pow,
      &op::eq,
      &op::ne,
      &op::lt,
      &op::le,
      &op::gt,
      &op::ge,
      // A tensor and a scalar; where and masked_fill.
      &op::add_scalar,
      &op::sub_scalar,
      &op::rsub_scalar,
      &op::mul_scalar,
      &op::div_scalar,
      &op::rdiv_scalar,
      &op::pow_scalar,
      &op::clamp,
      &op::clamp_backward,
      &op::where,
      &op::masked_fill,
      // Linear algebra, reductions, softmax.
      &op::matmul,
      &op::matmul_weight_grad,
      &op::bmm,
      &op::addmm,
      &op::scaled_mm,
      &op::float8_mm,
      &op::grouped_mm,
      &op::grouped_mm_backward,
      &op::sum,
      &op::mean,
      &op::amax,
      &op::amin,
      &op::argmax,
      &op::argmin,
      &op::logsumexp,
      &op::var,
      &op::std,
      &op::norm,
      &op::prod,
      &op::softmax,
      &op::log_softmax,
      &op::log_softmax_backward,
      // Picking by index.
      &op::index_select,
      &op::index_select_backward,
      &op::gather,
      &op::gather_backward,
      &op::embedding,
      &op::embedding_backward,
      // Ordering, scanning and counting.
      &op::topk_indices,
      &op::sort_indices,
      &op::cumsum,
      &op::one_hot,
      &op::bincount,
      &op::scatter_add,
      &op::index_add,
      &op::scatter,
      // Transformer layers.
      &op::layer_norm,
      &op::layer_norm_backward,
      &op::rms_norm,
      &op::rms_norm_backward,
      &op::dropout,
      &op::cross_entropy,
      &op::cross_entropy_backward,
      &op::nll_loss,
      &op::nll_loss_backward,
      &op::mse_loss,
      &op::scaled_dot_product_attention,
      &op::attention_probs,
      &op::attention_grad,
      &op::rotary_embedding,
      // Optimizer updates.
      &op::adamw_step,
      // Shapes.
      &op::transpose,
      &op::reshape,
      &op::cat,
      &op::stack,
      &op::pad,
      &op::narrow,
      &op::select,
      &op::permute,
      &op::unsqueeze,
      &op::squeeze,
      &op::expand,
      &op::clone,
      &op::contiguous,
      &op::triu,
      &op::tril,
      &op::to_dtype,
      &op::repeat_interleave,
      &op::repeat_interleave_backward,
  };
  return kAll;
}

// [keepdim, dims...]: the args of the reductions.
OpArgs reduction_args(const std::vector<int64_t>& dims, bool keepdim);
// The same with args.reals = [real] (var's and std's correction, norm's p).
OpArgs reduction_args(const std::vector<int64_t>& dims, bool keepdim, double real);

// GELU's exact form (erf) or its tanh approximation (torch's approximate="tanh").
enum class GeluApproximate { None, Tanh };
// How a loss reduces its elements' losses: torch's reduction='mean' | 'sum' | 'none' (None: one
// loss per element, of the target's shape).
enum class LossReduction { Mean, Sum, None };
// torch.nn.functional.cross_entropy's options for class-index targets (no class weights).
struct CrossEntropyOptions {
  LossReduction reduction = LossReduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
// nll_loss's: cross_entropy's without label smoothing.
struct NllLossOptions {
  LossReduction reduction = LossReduction::Mean;
  int64_t ignore_index = -100;
};
// The args of cross_entropy and nll_loss (and their backward entries): args.ints = [reduction
// (0 mean, 1 sum, 2 none), ignore_index], args.reals = [label_smoothing]; missing ones take
// torch's defaults (mean, -100, 0).
inline int64_t loss_reduction_code(LossReduction r) {
  return r == LossReduction::Mean ? 0 : r == LossReduction::Sum ? 1 : 2;
}
inline OpArgs loss_args(const CrossEntropyOptions& o) {
  return OpArgs{{loss_reduction_code(o.reduction), o.ignore_index}, {o.label_smoothing}};
}
inline OpArgs loss_args(const NllLossOptions& o) {
  return OpArgs{{loss_reduction_code(o.reduction), o.ignore_index}, {}};
}

// The args of scaled_dot_product_attention for queries with head size `head_dim`: the scale
// defaults to 1 / sqrt(head_dim).
OpArgs attention_args(int64_t head_dim, bool causal, std::optional<double> scale);
// torch's keyword arguments of scaled_dot_product_attention: is_causal, scale (default
// 1 / sqrt(D)) and enable_gqa (k and v with fewer heads, dim -3, dividing q's).
struct AttentionOptions {
  bool causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
};
OpArgs attention_args(int64_t head_dim, const AttentionOptions& options, bool has_mask);

// Note [Fused attention accounting]
// On shape-only tensors (a dry run) attention's backward takes its composed form: it recomputes
// the probabilities (attention_probs) and takes the gradients through S^2 tensors (the
// probabilities, their gradient), as a flash-attention kernel does in on-chip memory, and costs
// what PyTorch's kernels do (5 GEMMs of the scores' size). On tensors with data it runs
// attention_grad, which keeps no S^2 tensor at all (Note [Blocked attention] in
// tensor/kernels/attention.cpp), and so does a floating mask that needs no gradient. A dry run on a
// device that has such a kernel (DeviceSpec::flash_attention) turns the accounting on for its
// lifetime: the S^2 temporaries of the backward are then shape- only storages that count no bytes
// (MetaUncountedScope, Note [Meta allocations] in tensor/meta.h), while q, k, v's gradients count
// as usual. Whether or not it is on, the backward's ops run inside an AttentionKernelScope, so the
// dry run costs them as one attention kernel (its own efficiency; causal: the half of the work a
// flash kernel does).
void set_fused_attention_accounting(bool on);
bool fused_attention_accounting();
// This thread's attention kernel, if an attention backward is running on it.
struct AttentionKernel {
  bool active = false;
  bool causal = false;
};
AttentionKernel attention_kernel();
class AttentionKernelScope {
 public:
  explicit AttentionKernelScope(bool causal);
  ~AttentionKernelScope();
  AttentionKernelScope(const AttentionKernelScope&) = delete;
  AttentionKernelScope& operator=(const AttentionKernelScope&) = delete;

 private:
  AttentionKernel saved_;
};
// Llama 3.1's rescaling of the rotary frequencies (Meta's apply_scaling, HF's rope_type "llama3").
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
};
// Rotary embeddings: frequencies theta^(-2i/D), rescaled when `scaling` is set; `interleaved`
// rotates the pairs (2i, 2i+1) as Meta's Llama code (complex form), otherwise (i, i + D/2) as HF's
// rotate_half.
struct RopeConfig {
  double theta = 500000.0;
  std::optional<RopeScaling> scaling;
  bool interleaved = true;
};
// The args of rotary_embedding; the D/2 frequencies it uses (in double) for head dim D.
OpArgs rope_args(const RopeConfig& config);
std::vector<double> rope_frequencies(int64_t head_dim, const RopeConfig& config);
// Which rows of a larger tensor a dropout input is, along dim 0: [offset, offset + its rows) of
// `rows` (a microbatch of a batch: its mask is those rows of the batch's, Note [Mesh-invariant
// dropout]). rows 0: the input is the whole tensor.
struct DropoutRows {
  int64_t offset = 0;
  int64_t rows = 0;
};
// The args of dropout.
inline OpArgs dropout_args(double p, uint64_t seed, DropoutRows of = {}) {
  OpArgs args{{}, {p}};
  args.seed = seed;
  if (of.rows != 0) args.ints = {of.offset, of.rows};
  return args;
}
// The hyperparameters of one AdamW update and the step count t it is (1 for the first).
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  int64_t step = 1;
};
inline OpArgs adamw_args(const AdamWStep& s) {
  return OpArgs{{s.step}, {s.lr, s.beta1, s.beta2, s.eps, s.weight_decay}};
}
// A ConfigError naming `op`, the hyperparameter, the rule and the value unless `value` is finite
// and in [lo, hi] ([lo, hi) with hi_open): Note [Optimizer hyperparameters] in ops/optim.cpp,
// for the optimizers of nn/optim.h and adamw_step alike.
void check_hyperparameter(std::string_view op, std::string_view name, double value, double lo,
                          double hi = std::numeric_limits<double>::infinity(),
                          bool hi_open = false);
// The args of clamp (either bound may be absent; an absent one is 0 in args.reals).
inline OpArgs clamp_args(std::optional<double> min, std::optional<double> max) {
  return OpArgs{{min ? 1 : 0, max ? 1 : 0}, {min.value_or(0.0), max.value_or(0.0)}};
}
// The shape of t reshaped with dims [start, end] merged into one (flatten), as reshape args.
Shape flattened_shape(const Shape& shape, int64_t start, int64_t end);
// The [start, length] ranges of split(t, sizes, d) along a dim of `size` (chunk's are
// chunk_ranges, tensor/shape.h).
std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t size,
                                                      const std::vector<int64_t>& sizes,
                                                      std::string_view op);

// ---- elementwise (broadcasting) ---------------------------------------------------------------

inline Tensor add(const Tensor& a, const Tensor& b) {
  return call(op::add, {a, b});
}
inline Tensor sub(const Tensor& a, const Tensor& b) {
  return call(op::sub, {a, b});
}
inline Tensor mul(const Tensor& a, const Tensor& b) {
  return call(op::mul, {a, b});
}
// True division: integer or Bool inputs give F32.
inline Tensor div(const Tensor& a, const Tensor& b) {
  return call(op::div, {a, b});
}
inline Tensor maximum(const Tensor& a, const Tensor& b) {
  return call(op::maximum, {a, b});
}
inline Tensor minimum(const Tensor& a, const Tensor& b) {
  return call(op::minimum, {a, b});
}
// a to the power b, elementwise (integer and Bool inputs give F32).
inline Tensor pow(const Tensor& a, const Tensor& b) {
  return call(op::pow, {a, b});
}
// Elementwise comparisons with broadcasting; Bool results (NaN compares unequal).
inline Tensor eq(const Tensor& a, const Tensor& b) {
  return call(op::eq, {a, b});
}
inline Tensor ne(const Tensor& a, const Tensor& b) {
  return call(op::ne, {a, b});
}
inline Tensor lt(const Tensor& a, const Tensor& b) {
  return call(op::lt, {a, b});
}
inline Tensor le(const Tensor& a, const Tensor& b) {
  return call(op::le, {a, b});
}
inline Tensor gt(const Tensor& a, const Tensor& b) {
  return call(op::gt, {a, b});
}
inline Tensor ge(const Tensor& a, const Tensor& b) {
  return call(op::ge, {a, b});
}

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator+(const Tensor& a, double b) {
  return call(op::add_scalar, {a}, {{}, {b}});
}
inline Tensor operator-(const Tensor& a, double b) {
  return call(op::sub_scalar, {a}, {{}, {b}});
}
inline Tensor operator*(const Tensor& a, double b) {
  return call(op::mul_scalar, {a}, {{}, {b}});
}
inline Tensor operator/(const Tensor& a, double b) {
  return call(op::div_scalar, {a}, {{}, {b}});
}
inline Tensor operator+(double a, const Tensor& b) {
  return call(op::add_scalar, {b}, {{}, {a}});
}
inline Tensor operator-(double a, const Tensor& b) {
  return call(op::rsub_scalar, {b}, {{}, {a}});
}
inline Tensor operator*(double a, const Tensor& b) {
  return call(op::mul_scalar, {b}, {{}, {a}});
}
inline Tensor operator/(double a, const Tensor& b) {
  return call(op::rdiv_scalar, {b}, {{}, {a}});
}
inline Tensor operator-(const Tensor& a) {
  return call(op::neg, {a});
}

// ---- unary (integer inputs give F32, except for neg, abs and relu) ------------------------------

inline Tensor neg(const Tensor& t) {
  return call(op::neg, {t});
}
inline Tensor abs(const Tensor& t) {
  return call(op::abs, {t});
}
inline Tensor exp(const Tensor& t) {
  return call(op::exp, {t});
}
inline Tensor log(const Tensor& t) {
  return call(op::log, {t});
}
inline Tensor sqrt(const Tensor& t) {
  return call(op::sqrt, {t});
}
// 1 / sqrt(x).
inline Tensor rsqrt(const Tensor& t) {
  return call(op::rsqrt, {t});
}
inline Tensor tanh(const Tensor& t) {
  return call(op::tanh, {t});
}
inline Tensor relu(const Tensor& t) {
  return call(op::relu, {t});
}
// The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default), or its tanh
// approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline Tensor gelu(const Tensor& t, GeluApproximate approximate = GeluApproximate::None) {
  return call(approximate == GeluApproximate::Tanh ? op::gelu_tanh : op::gelu, {t});
}
inline Tensor erf(const Tensor& t) {
  return call(op::erf, {t});
}
// 1 / (1 + exp(-x)).
inline Tensor sigmoid(const Tensor& t) {
  return call(op::sigmoid, {t});
}
// x * sigmoid(x).
inline Tensor silu(const Tensor& t) {
  return call(op::silu, {t});
}
// log(1 + x), accurate for small x.
inline Tensor log1p(const Tensor& t) {
  return call(op::log1p, {t});
}
// exp(x) - 1, accurate for small x.
inline Tensor expm1(const Tensor& t) {
  return call(op::expm1, {t});
}
inline Tensor sin(const Tensor& t) {
  return call(op::sin, {t});
}
inline Tensor cos(const Tensor& t) {
  return call(op::cos, {t});
}
// 1 / x.
inline Tensor reciprocal(const Tensor& t) {
  return call(op::reciprocal, {t});
}
// t to the power c, elementwise (integer inputs give F32).
inline Tensor pow(const Tensor& t, double c) {
  return call(op::pow_scalar, {t}, {{}, {c}});
}
// torch.clamp: min(max(x, min), max), either bound absent (not both: ConfigError); max when
// min > max; NaN stays NaN. An integer t keeps its dtype unless a bound is not an integer (then
// F32); Bool is Unsupported. The gradient passes where min <= x <= max, the bounds included.
inline Tensor clamp(const Tensor& t, std::optional<double> min,
                    std::optional<double> max = std::nullopt) {
  return call(op::clamp, {t}, clamp_args(min, max));
}

// ---- selecting ----------------------------------------------------------------------------------

// cond ? a : b elementwise, broadcasting all three; cond Bool (Unsupported otherwise).
inline Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return call(op::where, {cond, a, b});
}
// t with `value` where mask (Bool, broadcastable to t's shape) is true.
inline Tensor masked_fill(const Tensor& t, const Tensor& mask, double value) {
  return call(op::masked_fill, {t, mask}, {{0}, {value}});
}
// The upper (triu) or lower (tril) triangle of the last two dims, from diagonal k (k > 0 above
// the main diagonal); the rest 0.
inline Tensor triu(const Tensor& t, int64_t k = 0) {
  return call(op::triu, {t}, {{k}, {}});
}
inline Tensor tril(const Tensor& t, int64_t k = 0) {
  return call(op::tril, {t}, {{k}, {}});
}
// The index of the largest value along d (the first of ties; NaN counts as largest), I64.
inline Tensor argmax(const Tensor& t, int64_t d, bool keepdim = false) {
  return call(op::argmax, {t}, {{d, keepdim ? 1 : 0}, {}});
}
// The slices of t along d at the positions of `index` (1-D, integer).
inline Tensor index_select(const Tensor& t, int64_t d, const Tensor& index) {
  return call(op::index_select, {t, index}, {{d}, {}});
}
// out[..., i, ...] = t[..., index[..., i, ...], ...] along d; index (integer) has t's sizes on the
// other dims.
inline Tensor gather(const Tensor& t, int64_t d, const Tensor& index) {
  return call(op::gather, {t, index}, {{d}, {}});
}
// The rows of `weight` [V, D] at `ids` (integer, any shape): [ids..., D].
inline Tensor embedding(const Tensor& ids, const Tensor& weight) {
  return call(op::embedding, {ids, weight});
}

// ---- ordering, scanning and counting (ops/sort.cpp) ---------------------------------------------

// What topk, sort and max/min along a dim return (torch.return_types): the values and their I64
// indices along the dim; `auto [values, indices] = topk(x, 2);`.
template <class T>
struct ValuesIndices {
  T values;
  T indices;
};

// The k largest (or smallest) elements along d, largest first (smallest first), and their
// indices; ties go to the lower index (Note [Ordering ties]); NaN counts as the largest. `sorted`
// = false gives the same order. k outside [0, size of d] is a ShapeError; Bool is Unsupported.
// The values are gather(t, d, indices): the gradient flows to the picked elements.
inline ValuesIndices<Tensor> topk(const Tensor& t, int64_t k, int64_t d = -1, bool largest = true,
                                  bool sorted = true) {
  const Tensor indices = call(op::topk_indices, {t}, {{d, k, largest ? 1 : 0, sorted ? 1 : 0}, {}});
  return {gather(t, d, indices), indices};
}
// t sorted along d, ascending (or descending), stably: equal values keep their order; NaN last
// (first when descending). Gradient through gather.
inline ValuesIndices<Tensor> sort(const Tensor& t, int64_t d = -1, bool descending = false) {
  const Tensor indices = call(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}});
  return {gather(t, d, indices), indices};
}
inline Tensor argsort(const Tensor& t, int64_t d = -1, bool descending = false) {
  return call(op::sort_indices, {t}, {{d, descending ? 1 : 0}, {}});
}
// The index of the smallest value along d (the first of ties; NaN counts as smallest), I64.
inline Tensor argmin(const Tensor& t, int64_t d, bool keepdim = false) {
  return call(op::argmin, {t}, {{d, keepdim ? 1 : 0}, {}});
}
// torch.max(t, d, keepdim) / torch.min: the largest (smallest) value along d and its index, the
// first of ties, NaN propagating; the gradient goes to that one element (gather).
inline ValuesIndices<Tensor> max(const Tensor& t, int64_t d, bool keepdim = false) {
  const Tensor i = argmax(t, d, true);
  const Tensor v = gather(t, d, i);
  return keepdim ? ValuesIndices<Tensor>{v, i} : ValuesIndices<Tensor>{v.squeeze(d), i.squeeze(d)};
}
inline ValuesIndices<Tensor> min(const Tensor& t, int64_t d, bool keepdim = false) {
  const Tensor i = argmin(t, d, true);
  const Tensor v = gather(t, d, i);
  return keepdim ? ValuesIndices<Tensor>{v, i} : ValuesIndices<Tensor>{v.squeeze(d), i.squeeze(d)};
}
// The sums of t along d up to each position: integer and Bool inputs give I64; floating dtypes
// are summed in double and rounded once per element. The gradient is the gradient summed from the
// other end.
inline Tensor cumsum(const Tensor& t, int64_t d) {
  return call(op::cumsum, {t}, {{d, 0}, {}});
}
// num_classes, or (-1) the largest class + 1: ConfigError on an empty tensor.
int64_t one_hot_classes(const Tensor& indices, int64_t num_classes);
// torch.nn.functional.one_hot: indices (I64, any shape) -> [..., num_classes] I64 with 1 at each
// class. A class outside [0, num_classes) is a ShapeError.
inline Tensor one_hot(const Tensor& indices, int64_t num_classes = -1) {
  return call(op::one_hot, {indices}, {{one_hot_classes(indices, num_classes)}, {}});
}
// torch.bincount's length: max(minlength, largest value + 1) (minlength in a shape-only run).
// ConfigError on a negative minlength or value.
int64_t bincount_length(const Tensor& x, int64_t minlength);
// How many times each value in [0, length) appears in x (1-D, integer, non-negative: ConfigError
// otherwise), I64.
inline Tensor bincount(const Tensor& x, int64_t minlength = 0) {
  return call(op::bincount, {x}, {{bincount_length(x, minlength)}, {}});
}

// x plus src added at the index along d: out[..., index[p], ...] += src[p] (index integer, of
// src's shape and x's sizes on every dim but d; src of x's dtype; Bool Unsupported). Duplicates
// add up. The gradient passes to x; src's is gather(grad, d, index).
inline Tensor scatter_add(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src) {
  return call(op::scatter_add, {x, index, src}, {{d}, {}});
}
// x plus alpha * source's slices added at the 1-D index along d (source: x's shape but the
// index's length along d; of x's dtype; an integer x needs an integral alpha). The gradient
// passes to x; source's is alpha * index_select(grad, d, index).
inline Tensor index_add(const Tensor& x, int64_t d, const Tensor& index, const Tensor& source,
                        double alpha = 1.0) {
  return call(op::index_add, {x, index, source}, {{d}, {alpha}});
}
// x with src written at the index along d (shapes as scatter_add's), or the value; of duplicate
// indices the last in row-major order wins. The gradient: x's where nothing was written, src's
// gather(grad, d, index).
inline Tensor scatter(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src) {
  return call(op::scatter, {x, index, src}, {{d}, {}});
}
inline Tensor scatter(const Tensor& x, int64_t d, const Tensor& index, double value) {
  return call(op::scatter, {x, index}, {{d, 1}, {value}});
}
// The shapes x and the indices of take_along_dim broadcast to (every dim but d).
std::pair<Shape, Shape> take_along_dim_shapes(const Shape& x, const Shape& indices, int64_t d);
// torch.take_along_dim(x, indices, d): gather along d after broadcasting the other dims.
inline Tensor take_along_dim(const Tensor& t, const Tensor& indices, int64_t d) {
  const auto [xs, is] = take_along_dim_shapes(t.shape(), indices.shape(), d);
  return gather(call(op::expand, {t}, {xs, {}}), d, call(op::expand, {indices}, {is, {}}));
}

// ---- transformer layers -------------------------------------------------------------------------

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance).
inline Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         double eps = 1e-5) {
  return call(op::layer_norm, {x, weight, bias}, {{}, {eps}});
}
// x / sqrt(mean(x^2) + eps) * weight over the last dim.
inline Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6) {
  return call(op::rms_norm, {x, weight}, {{}, {eps}});
}
// torch.optim.AdamW's update of one parameter as one op (Note [Fused AdamW] in ops/optim.cpp):
// [3, ...] stacking param (1 - lr wd) - lr / (1 - b1^t) m' / (sqrt(v') / sqrt(1 - b2^t) + eps),
// m' = b1 m + (1 - b1) grad and v' = b2 v + (1 - b2) grad^2; select(out, 0, i) takes each.
inline Tensor adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWStep& s) {
  return call(op::adamw_step, {param, grad, exp_avg, exp_avg_sq}, adamw_args(s));
}
// Zeros each element with probability p and scales the others by 1 / (1 - p); element i of the
// tensor is dropped when philox_uniform(seed, i) < p, so the same seed drops the same elements of
// the global tensor on any mesh (Note [Mesh-invariant dropout] in ops/nn.cpp).
inline Tensor dropout(const Tensor& x, double p, uint64_t seed, DropoutRows of = {}) {
  return call(op::dropout, {x}, dropout_args(p, seed, of));
}
// torch.nn.functional.cross_entropy with class-index targets: logits [N, C, d1, ...] (class dim 1;
// or [C] with a 0-d target), target [N, d1, ...] integer. The loss of element i is
// (1 - eps) (logsumexp(logits_i) - logits_i[target_i]) + eps mean_c(logsumexp(logits_i) -
// logits_i[c]) for eps = label_smoothing in [0, 1] (ConfigError outside); 0 where target_i ==
// ignore_index (no other target outside [0, C): ShapeError). Mean divides the sum by the count of
// elements not ignored (NaN when there is none, as torch), Sum sums, None keeps the target's shape.
inline Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                            const CrossEntropyOptions& options) {
  return call(op::cross_entropy, {logits, target}, loss_args(options));
}
inline Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                            LossReduction reduction = LossReduction::Mean) {
  return cross_entropy(logits, target, CrossEntropyOptions{.reduction = reduction});
}
// torch.nn.functional.nll_loss: -log_probs_i[target_i] with cross_entropy's shapes, ignore_index
// and reductions.
inline Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                       const NllLossOptions& options = {}) {
  return call(op::nll_loss, {log_probs, target}, loss_args(options));
}
// torch.nn.functional.mse_loss: (a - b)^2 (broadcasting), its mean, sum or every element.
inline Tensor mse_loss(const Tensor& a, const Tensor& b,
                       LossReduction reduction = LossReduction::Mean) {
  return call(op::mse_loss, {a, b}, {{loss_reduction_code(reduction)}, {}});
}
// softmax(q k^T scale [+ causal mask]) v for q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]; the
// scale defaults to 1 / sqrt(D); causal hides key j from query i when j > i.
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           bool causal = false,
                                           std::optional<double> scale = std::nullopt) {
  return call(op::scaled_dot_product_attention, {q, k, v},
              attention_args(q.size(-1), causal, scale));
}
// torch.nn.functional.scaled_dot_product_attention with its options: enable_gqa lets k and v
// [..., Hkv, Sk, D] have fewer heads than q [..., H, Sq, D] (H % Hkv == 0; query head h uses kv
// head h / (H / Hkv)); attn_mask broadcastable to [..., Sq, Sk], Bool (true: attend) or floating
// (added to the scores; it gets a gradient), not together with causal. A row that attends to
// nothing gives NaN.
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionOptions& options) {
  return call(op::scaled_dot_product_attention, {q, k, v},
              attention_args(q.size(-1), options, false));
}
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& attn_mask,
                                           const AttentionOptions& options = {}) {
  return call(op::scaled_dot_product_attention, {q, k, v, attn_mask},
              attention_args(q.size(-1), options, true));
}

// Rotary position embeddings (Note [Rotary embeddings] in ops/rope.cpp) of x [..., S, H, D] (D
// even): pair i of the row at position p turns by p * f_i. positions: integer [S] or x's dims
// before H ([B, S]), each row's global position; without it, each row's index along S (on a
// DTensor the global index, so a sequence-sharded x needs no positions). The gradient turns back.
inline Tensor rotary_embedding(const Tensor& x, const Tensor& positions,
                               const RopeConfig& config = {}) {
  return call(op::rotary_embedding, {x, positions}, rope_args(config));
}
inline Tensor rotary_embedding(const Tensor& x, const RopeConfig& config = {}) {
  return call(op::rotary_embedding, {x}, rope_args(config));
}

// ---- reductions -------------------------------------------------------------------------------
// Over all elements, giving a 0-d tensor; or over `dims` (each once, negative allowed), keeping
// them as size-1 dims when keepdim. An empty `dims` list reduces over all dims. sum of
// integer/Bool gives I64; mean of integers is Unsupported; amax/amin of 0 elements is a
// ShapeError (no identity), sum of 0 elements is 0 and mean of 0 elements is NaN.

inline Tensor sum(const Tensor& t) {
  return call(op::sum, {t}, reduction_args({}, false));
}
inline Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false) {
  return call(op::sum, {t}, reduction_args(dims, keepdim));
}
inline Tensor mean(const Tensor& t) {
  return call(op::mean, {t}, reduction_args({}, false));
}
inline Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false) {
  return call(op::mean, {t}, reduction_args(dims, keepdim));
}
inline Tensor amax(const Tensor& t) {
  return call(op::amax, {t}, reduction_args({}, false));
}
inline Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false) {
  return call(op::amax, {t}, reduction_args(dims, keepdim));
}
inline Tensor amin(const Tensor& t) {
  return call(op::amin, {t}, reduction_args({}, false));
}
inline Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false) {
  return call(op::amin, {t}, reduction_args(dims, keepdim));
}

// torch.logsumexp: log(sum(exp(t))) over dims, shifted by the maximum (0 where it is infinite),
// so large values do not overflow; integers give F32; zero elements give -inf.
inline Tensor logsumexp(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false) {
  return call(op::logsumexp, {t}, reduction_args(dims, keepdim));
}
// torch.var and torch.std: sum((t - mean)^2) / max(0, n - correction) over dims (empty: every
// dim), and its square root; floating t only.
inline Tensor var(const Tensor& t, const std::vector<int64_t>& dims = {}, double correction = 1.0,
                  bool keepdim = false) {
  return call(op::var, {t}, reduction_args(dims, keepdim, correction));
}
inline Tensor std(const Tensor& t, const std::vector<int64_t>& dims = {}, double correction = 1.0,
                  bool keepdim = false) {
  return call(op::std, {t}, reduction_args(dims, keepdim, correction));
}
// torch.linalg.vector_norm: (sum |t|^p)^(1/p) over dims (empty: every dim); p = inf: max |t|,
// -inf: min |t|, 0: the count of nonzeros; floating t only.
inline Tensor norm(const Tensor& t, double p = 2.0, const std::vector<int64_t>& dims = {},
                   bool keepdim = false) {
  return call(op::norm, {t}, reduction_args(dims, keepdim, p));
}
// torch.prod over dims (empty: every dim): integers and Bool give I64; zero elements give 1.
inline Tensor prod(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false) {
  return call(op::prod, {t}, reduction_args(dims, keepdim));
}

// ---- linear algebra (Eigen on the CPU; BF16/F16 accumulate in F32) ------------------------------

// torch.matmul for 1-D and 2-D operands and for batched operands whose batch dims broadcast.
inline Tensor matmul(const Tensor& a, const Tensor& b) {
  return call(op::matmul, {a, b});
}
// beta * c + alpha * (a @ b), with a [n,k], b [k,m], c broadcastable to [n,m].
inline Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, double beta = 1.0,
                    double alpha = 1.0) {
  return call(op::addmm, {c, a, b}, {{}, {beta, alpha}});
}
// FP8 GEMM: (a @ b) * (scale_a * scale_b) rounded once to `out_dtype` (bf16, f16 or f32); a
// [M, K] and b [K, N] float8, the scales 0-d f32 (Note [Scaled matmul] in ops/linalg.cpp).
inline Tensor scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a,
                        const Tensor& scale_b, DType out_dtype = DType::BF16) {
  return call(op::scaled_mm, {a, b, scale_a, scale_b}, {{static_cast<int64_t>(out_dtype)}, {}});
}
// The largest magnitude of t as a 0-d f32 value without gradient: what FP8 training's tensorwise
// scale is made from (on a sharded DTensor a pending max, Note [Float8 training]).
Var float8_amax(const Var& t);
// x @ w with FP8 training's casts and FP8 GEMMs, forward and backward (Note [Float8 training] in
// ops/linalg.cpp): x [..., K] and w [K, N] both cast to f8e4m3fn with scales from their amax, the
// output gradient to f8e5m2. The result has the dtype of x @ w. Bit i of rank_local_mask makes
// mesh dim i rank-local for DTensors (each rank scales its own piece of x and of the gradient).
Var float8_matmul(const Var& x, const Var& w, int64_t rank_local_mask = 0);
// t (a wider float) cast to float8 `format` with the tensorwise scale of `amax` (0-d f32): the
// format's largest value over amax (at least 1e-12), a saturated cast, exactly as float8_mm casts
// its operands; no gradient.
Var float8_cast(const Var& t, const Var& amax, DType format = DType::F8E4M3FN);
// float8_matmul with w8 = float8_cast(w, amax_w) cast already (FSDP's float8 all-gather, Note
// [Float8 all-gather] in nn/parallel.h): the same values as float8_matmul(x, w) when amax_w is
// w's amax; w8's gradient is in x's dtype.
Var float8_matmul(const Var& x, const Var& w8, const Var& amax_w, int64_t rank_local_mask = 0);
inline Tensor float8_matmul(const Tensor& x, const Tensor& w) {
  return float8_matmul(Var(x), Var(w)).value<Tensor>();
}
// Batched: a [B,n,k] @ b [B,k,m] -> [B,n,m].
// The rows of x [N, K] in consecutive groups of sizes[g] rows (I64 [G], adding up to N), group g
// times w[g] (w [G, K, M]): a mixture-of-experts layer's experts in one call.
inline Tensor grouped_mm(const Tensor& x, const Tensor& w, const Tensor& sizes) {
  return call(op::grouped_mm, {x, w, sizes});
}
inline Tensor bmm(const Tensor& a, const Tensor& b) {
  return call(op::bmm, {a, b});
}

// ---- softmax ----------------------------------------------------------------------------------

inline Tensor softmax(const Tensor& t, int64_t d) {
  return call(op::softmax, {t}, {{d}, {}});
}
inline Tensor log_softmax(const Tensor& t, int64_t d) {
  return call(op::log_softmax, {t}, {{d}, {}});
}

// ---- shapes, joining and padding ----------------------------------------------------------------

// A view with dims a and b swapped (as t.transpose(a, b)).
inline Tensor transpose(const Tensor& t, int64_t a, int64_t b) {
  return call(op::transpose, {t}, {{a, b}, {}});
}
// As t.reshape(shape): a view when the strides allow it; one size may be -1.
inline Tensor reshape(const Tensor& t, const Shape& shape) {
  return call(op::reshape, {t}, {shape, {}});
}
// Concatenate along d; all other sizes and all dtypes must agree (dtypes promote).
inline Tensor cat(const std::vector<Tensor>& tensors, int64_t d = 0) {
  return call(op::cat, tensors, {{d}, {}});
}
// Stack along a new dim d; all shapes must agree.
inline Tensor stack(const std::vector<Tensor>& tensors, int64_t d = 0) {
  return call(op::stack, tensors, {{d}, {}});
}
// Constant padding of `before` and `after` elements along dim d.
inline Tensor pad(const Tensor& t, int64_t d, int64_t before, int64_t after, double value = 0.0) {
  return call(op::pad, {t}, {{d, before, after}, {value}});
}
// The free-function forms of the Tensor methods of the same names (recorded by autograd either
// way), which also exist for LocalTensor and DTensor.
inline Tensor narrow(const Tensor& t, int64_t d, int64_t start, int64_t length) {
  return call(op::narrow, {t}, {{d, start, length}, {}});
}
inline Tensor select(const Tensor& t, int64_t d, int64_t index) {
  return call(op::select, {t}, {{d, index}, {}});
}
inline Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  return call(op::permute, {t}, {dims, {}});
}
inline Tensor unsqueeze(const Tensor& t, int64_t d) {
  return call(op::unsqueeze, {t}, {{d}, {}});
}
inline Tensor squeeze(const Tensor& t, int64_t d) {
  return call(op::squeeze, {t}, {{d}, {}});
}
inline Tensor expand(const Tensor& t, const Shape& shape) {
  return call(op::expand, {t}, {shape, {}});
}
inline Tensor clone(const Tensor& t) {
  return call(op::clone, {t});
}
inline Tensor contiguous(const Tensor& t) {
  return call(op::contiguous, {t});
}
// reshape under the names torch also uses: view (our reshape is a view whenever the strides
// allow it) and flatten (dims start..end merged into one).
inline Tensor view(const Tensor& t, const Shape& shape) {
  return call(op::reshape, {t}, {shape, {}});
}
inline Tensor flatten(const Tensor& t, int64_t start = 0, int64_t end = -1) {
  return call(op::reshape, {t}, {flattened_shape(t.shape(), start, end), {}});
}
// torch.repeat_interleave with an integer repeats: each slice along d `repeats` times in a row
// (repeats >= 0); the gradient sums each group of copies. For grouped-query attention, k and v
// [B, S, Hkv, D] repeated along the heads give [B, S, Hkv * repeats, D].
inline Tensor repeat_interleave(const Tensor& t, int64_t repeats, int64_t d) {
  return call(op::repeat_interleave, {t}, {{repeats, d}, {}});
}
// Pieces along d of the given sizes (split) or of torch.chunk's sizes (chunk): narrow views.
std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t d = 0);
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t d = 0);
// Inverse of pad: a view without the first `before` and last `after` elements along d.
Tensor unpad(const Tensor& t, int64_t d, int64_t before, int64_t after);

}  // namespace spmd
