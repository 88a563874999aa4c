// spmd/tensor/ops.h: factories and operations on Tensor.
//
// Every op checks its inputs and throws a typed spmd::Error naming the op and the shapes:
// ShapeError for shapes and dims, Unsupported for dtype combinations an op does not take.
// Results are new contiguous tensors unless stated otherwise. Mixed dtypes promote by
// Note [Type promotion] (tensor/dtype.h). BF16/F16 arithmetic is done in F32 and rounded once.
#pragma once

#include <cstdint>
#include <vector>

#include <spmd/tensor/tensor.h>

namespace spmd {

// ---- factories ----------------------------------------------------------------------------
Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = {});
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = {});
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = {});
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = {});
// [0, 1, ..., n-1].
Tensor arange(int64_t n, DType dtype = DType::F32);
// A 0-d tensor.
Tensor scalar_tensor(double value, DType dtype = DType::F32);
// A tensor of `shape` (1-D of values.size() when empty) with dtype_of<T>(); ShapeError when the
// element count differs from the shape's.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape = {});

// ---- elementwise (broadcasting) -----------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
// True division: integer or Bool inputs give F32.
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- unary (floating results; integer inputs of exp/log/sqrt/tanh/gelu give F32) ----------
Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor relu(const Tensor& t);
// The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default).
Tensor gelu(const Tensor& t);

// ---- reductions ---------------------------------------------------------------------------
// Over all elements, giving a 0-d tensor; or over `dims` (each once, negative allowed), keeping
// them as size-1 dims when keepdim. An empty `dims` list reduces over all dims. sum of
// integer/Bool gives I64; mean of integers is Unsupported; amax/amin of 0 elements is a
// ShapeError (no identity), sum of 0 elements is 0 and mean of 0 elements is NaN.
Tensor sum(const Tensor& t);
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& t);
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor amax(const Tensor& t);
Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor amin(const Tensor& t);
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false);

// ---- linear algebra (Eigen; BF16/F16 accumulate in F32) ------------------------------------
// torch.matmul for 1-D and 2-D operands and for batched operands whose batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// beta * c + alpha * (a @ b), with a [n,k], b [k,m], c broadcastable to [n,m].
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, double beta = 1.0,
             double alpha = 1.0);
// Batched: a [B,n,k] @ b [B,k,m] -> [B,n,m].
Tensor bmm(const Tensor& a, const Tensor& b);

// ---- softmax ------------------------------------------------------------------------------
Tensor softmax(const Tensor& t, int64_t d);
Tensor log_softmax(const Tensor& t, int64_t d);

// ---- joining and padding ------------------------------------------------------------------
// Concatenate along d; all other sizes and all dtypes must agree (dtypes promote).
Tensor cat(const std::vector<Tensor>& tensors, int64_t d = 0);
// Stack along a new dim d; all shapes must agree.
Tensor stack(const std::vector<Tensor>& tensors, int64_t d = 0);
// Constant padding of `before` and `after` elements along dim d.
Tensor pad(const Tensor& t, int64_t d, int64_t before, int64_t after, double value = 0.0);
// Inverse of pad: a view without the first `before` and last `after` elements along d.
Tensor unpad(const Tensor& t, int64_t d, int64_t before, int64_t after);

// ---- comparisons --------------------------------------------------------------------------
// Same shape and every element equal (after promotion). Different shapes give false.
bool equal(const Tensor& a, const Tensor& b);
// Same shape and |a - b| <= atol + rtol * |b| elementwise; NaNs compare unequal.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// max |a - b| over elements (a and b must have one shape); 0 for empty tensors, NaN if any NaN.
double max_abs_diff(const Tensor& a, const Tensor& b);
// True when any element is NaN or +-Inf.
bool has_nonfinite(const Tensor& t);

}  // namespace spmd
