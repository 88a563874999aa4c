// spmd/tensor/cuda/kernels.h: the CUDA kernel launchers behind the CUDA DeviceOps.
//
// Internal to tensor/cuda. The two .cu files (elementwise.cu, reduce.cu) implement these and
// include nothing of spmdsim but tensor/cuda/element.h, so nvcc compiles little; the checks, the
// error messages and the choice of kernel live in the C++ callers (cuda_ops.cpp and the nccl
// backend). Every launcher enqueues on `stream` and returns cudaGetLastError() of its launch:
// the caller checks it. Element types are given as spmd::DType values (Elt mirrors them) and
// operators as the values of the spmd enums the comment names; n == 0 launches nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <spmd/tensor/cuda/element.h>

namespace spmd::cuda_kernels {

// The values of spmd::DType (checked by static_assert in cuda_ops.cpp).
enum class Elt : uint8_t { F32, F64, BF16, F16, I32, I64, Bool };

using cuda_math::Indexer;

// For the .cu files: calls f(T{}) with T the storage type of `type`.
template <class F>
cudaError_t dispatch(Elt type, F&& f) {
  switch (type) {
    case Elt::F32:
      return f(float{});
    case Elt::F64:
      return f(double{});
    case Elt::BF16:
      return f(cuda_math::Bf16{});
    case Elt::F16:
      return f(cuda_math::F16{});
    case Elt::I32:
      return f(int32_t{});
    case Elt::I64:
      return f(int64_t{});
    case Elt::Bool:
      return f(bool{});
  }
  return cudaErrorInvalidValue;
}

// Writes the `elt_size`-byte pattern `bits` to the n elements Indexer<1> walks.
cudaError_t fill(int elt_size, void* dst, const Indexer<1>& ix, int64_t n, uint64_t bits,
                 cudaStream_t stream);

// dst = convert(src) elementwise; operands 0 = dst, 1 = src.
cudaError_t copy(Elt dst_type, void* dst, Elt src_type, const void* src, const Indexer<2>& ix,
                 int64_t n, cudaStream_t stream);

// out = a op b, op an index into element::BinaryOps (tensor/element_ops.h); operands 0 = out, 1 =
// a, 2 = b.
cudaError_t binary(int op, Elt type, void* out, const void* a, const void* b, const Indexer<3>& ix,
                   int64_t n, cudaStream_t stream);

// out = op(in), op an index into element::UnaryOps; operands 0 = out, 1 = in.
cudaError_t unary(int op, Elt type, void* out, const void* in, const Indexer<2>& ix, int64_t n,
                  cudaStream_t stream);

// out = grad * df(in, result) for the op at index `op` of element::UnaryOps; operands 0 = out,
// 1 = grad, 2 = in, 3 = result; floating types.
cudaError_t unary_backward(int op, Elt type, void* out, const void* grad, const void* in,
                           const void* result, const Indexer<4>& ix, int64_t n,
                           cudaStream_t stream);

// out = da(grad, a, b) (wrt 0) or db(grad, a, b) (wrt 1) for the op at index `op` of
// element::BinaryOps; operands 0 = out, 1 = grad, 2 = a, 3 = b; floating types.
cudaError_t binary_backward(int op, int wrt, Elt type, void* out, const void* grad, const void* a,
                            const void* b, const Indexer<4>& ix, int64_t n, cudaStream_t stream);

// out = cond ? a : b; operands 0 = out, 1 = cond (bool), 2 = a, 3 = b.
cudaError_t where(Elt type, void* out, const bool* cond, const void* a, const void* b,
                  const Indexer<4>& ix, int64_t n, cudaStream_t stream);

// Gather along one dim (DeviceOps::gather): operands 0 = out, 1 = index (int64), 2 = in with the
// gathered dim's stride 0; `step` and `size` are that dim's stride and size in `in`. Sets *bad to 1
// where an index lies outside [0, limit).
cudaError_t gather(Elt type, void* out, const int64_t* index, const void* in, const Indexer<3>& ix,
                   int64_t n, int64_t offset, int64_t limit, int64_t size, int64_t step,
                   unsigned int* bad, cudaStream_t stream);

// Scatter-add along one dim (DeviceOps::scatter_add), atomically; F32 and F64 only: operands 0 =
// src, 1 = index (int64), 2 = out with the scattered dim's stride 0.
cudaError_t scatter_add(Elt type, void* out, const int64_t* index, const void* src,
                        const Indexer<3>& ix, int64_t n, int64_t offset, int64_t limit,
                        int64_t size, int64_t step, unsigned int* bad, cudaStream_t stream);

// What compare() computes over element pairs (operands 0 = a, 1 = b).
enum class Compare : uint8_t { Equal, AllClose, MaxAbsDiff, HasNonfinite };
// Device-side result of compare(): zero it before the launch.
struct CompareResult {
  unsigned int flag;            // Equal: some pair differs; AllClose: some pair is not close;
                                // MaxAbsDiff: some element is NaN; HasNonfinite: found one
  unsigned long long max_bits;  // MaxAbsDiff: bits of the largest |a - b| (a non-negative double)
};
cudaError_t compare(Compare what, Elt type, const void* a, const void* b, const Indexer<2>& ix,
                    int64_t n, double rtol, double atol, CompareResult* result,
                    cudaStream_t stream);

// ---- reduce.cu ---------------------------------------------------------------------------------

// out[o] = op over r < n_red of in[kept(o) + reduced(r)], for o < n_out (out contiguous); op a
// spmd::Reduction value. Sum accumulates floating inputs in double and integer/bool inputs in
// wrapping uint64; Mean divides the double sum by `count`; Amax/Amin keep the input type and let
// NaN win.
cudaError_t reduce(int op, Elt in_type, Elt out_type, void* out, const void* in,
                   const Indexer<1>& kept, const Indexer<1>& reduced, int64_t n_out, int64_t n_red,
                   double count, cudaStream_t stream);

// Softmax (or log-softmax) along rows of `length` elements: row r starts at offsets
// rows.offsets(r) (0 = out, 1 = in) and steps by out_step / in_step.
cudaError_t softmax(Elt type, void* out, const void* in, const Indexer<2>& rows, int64_t n_rows,
                    int64_t length, int64_t out_step, int64_t in_step, bool log,
                    cudaStream_t stream);

// out[b, i, j] = alpha * sum_l a[b, i, l] * b[b, l, j] + beta * out[b, i, j] in wrapping 64-bit
// arithmetic (I32/I64); out contiguous [batch, n, m]; strides of a and b in elements.
cudaError_t matmul_integer(Elt type, void* out, const void* a, const void* b, int64_t batch,
                           int64_t n, int64_t m, int64_t k, const int64_t* a_strides,
                           const int64_t* b_strides, uint64_t alpha, uint64_t beta,
                           cudaStream_t stream);

// out = beta * out (beta == 0: zeros, old values ignored) for n contiguous floating elements,
// computed in F32 (F64 for F64) and rounded once: matmul with an empty inner dim.
cudaError_t scale(Elt type, void* out, int64_t n, double beta, cudaStream_t stream);

// out[i] = in[i] op in[stride + i] op ... op in[(k-1) * stride + i] for i < n, in group order
// (Note [Reduction order] of collectives/reduce_kernels.h); op a spmd::ReduceOp value. `out` may
// not overlap `in`.
cudaError_t reduce_stacked(int op, Elt type, const void* in, int64_t k, int64_t stride, void* out,
                           int64_t n, cudaStream_t stream);

// data[i] &= 1 for n bytes: the parity of a byte sum (Bool BXor as a uint8 sum).
cudaError_t keep_low_bit(uint8_t* data, int64_t n, cudaStream_t stream);

}  // namespace spmd::cuda_kernels
