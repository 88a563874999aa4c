// spmd/ops/ops.h: the op table, and every op on Tensors.
//
// Each op is one entry of the table, `op::<name>`, an OpDef (ops/op.h): its meta, its math on
// Tensors, its sharding strategies, its reference and its backward slot. The elementwise entries
// are made from the functors of tensor/element_ops.h right here; the others are defined in
// ops/<family>.cpp. The functions below run an entry on Tensors; sim/local_ops.h runs the same
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
// rsqrt, tanh and gelu give F32; neg, abs and relu keep integer dtypes (wrapping at the minimum).
inline constexpr OpDef neg = unary_op<element::Neg, PartialRule::Negation>();
inline constexpr OpDef abs = unary_op<element::Abs, PartialRule::None>();
inline constexpr OpDef exp = unary_op<element::Exp, PartialRule::NonDecreasing>();
inline constexpr OpDef log = unary_op<element::Log, PartialRule::None>();
inline constexpr OpDef sqrt = unary_op<element::Sqrt, PartialRule::None>();
inline constexpr OpDef rsqrt = unary_op<element::Rsqrt, PartialRule::None>();
inline constexpr OpDef tanh = unary_op<element::Tanh, PartialRule::NonDecreasing>();
inline constexpr OpDef relu = unary_op<element::Relu, PartialRule::NonDecreasing>();
inline constexpr OpDef gelu = unary_op<element::Gelu, PartialRule::None>();

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

// Linear algebra (ops/linalg.cpp). addmm: args.reals = [beta, alpha].
extern const OpDef matmul;
extern const OpDef bmm;
extern const OpDef addmm;

// Reductions (ops/reduction.cpp). args.ints = [keepdim, dims...]; no dims: every dim.
extern const OpDef sum;
extern const OpDef mean;
extern const OpDef amax;
extern const OpDef amin;

// Softmax along args.ints[0] (ops/softmax.cpp).
extern const OpDef softmax;
extern const OpDef log_softmax;

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
extern const OpDef to_dtype;

}  // namespace op

// [keepdim, dims...]: the args of the reductions.
OpArgs reduction_args(const std::vector<int64_t>& dims, bool keepdim);

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

// ---- unary (floating results; integer inputs of exp/log/sqrt/rsqrt/tanh/gelu give F32) ----------

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
// The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default).
inline Tensor gelu(const Tensor& t) {
  return call(op::gelu, {t});
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
// Batched: a [B,n,k] @ b [B,k,m] -> [B,n,m].
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
// Inverse of pad: a view without the first `before` and last `after` elements along d.
Tensor unpad(const Tensor& t, int64_t d, int64_t before, int64_t after);

}  // namespace spmd
