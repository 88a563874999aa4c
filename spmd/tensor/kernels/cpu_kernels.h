// spmd/tensor/kernels/cpu_kernels.h: the CPU kernels behind cpu_ops() (tensor/device_ops.h).
//
// Internal to tensor/. Each function has the contract of the DeviceOps method of the same name;
// the translation units split them by weight: elementwise.cpp (fill, copy, binary, unary, where,
// comparisons), index.cpp (gather, scatter_add), reduce.cpp (reductions, softmax), matmul.cpp
// (OpenBLAS, else Eigen), attention.cpp (blocked attention).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spmd/tensor/device_ops.h>

namespace spmd::cpu_kernels {

void fill(const Tensor& dst, double value);
void copy(const Tensor& dst, const Tensor& src);
void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b);
void unary(int op, const Tensor& out, const Tensor& in);
void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                    const Tensor& result);
void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad, const Tensor& a,
                     const Tensor& b);
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// One AdamW step of every element (DeviceOps::adamw), F32, F64, BF16 and F16.
bool adamw(const Tensor& out, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
           const AdamWKernelArgs& a);
bool equal(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol);
double max_abs_diff(const Tensor& a, const Tensor& b);
bool has_nonfinite(const Tensor& t);

void reduce(Reduction op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims);
void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log);
// softmax (log: log_softmax) of one contiguous F32 row x[0..n) into o, `buffer` n floats of
// scratch (Note [F32 softmax] in tensor/kernels/elementwise.cpp).
void softmax_row_f32(float* o, const float* x, int64_t n, bool log, float* buffer);

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
// c[n, m] = alpha op(a) op(b) + beta c on the calling thread (no parallel_for), row-major with
// leading dims ldc, lda, ldb; op(a) = a [n, k], or with trans_a a stored as [k, n]; op(b) = b
// [k, m], or with trans_b b stored as [m, k]. beta == 0 ignores c's old values. On OpenBLAS
// where loaded (Note [Matmul on BLAS]), else Eigen. For kernels that multiply tiles themselves.
void gemm_on_thread(float* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const float* a,
                    int64_t lda, bool trans_a, const float* b, int64_t ldb, bool trans_b,
                    float alpha, float beta);
void gemm_on_thread(double* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const double* a,
                    int64_t lda, bool trans_a, const double* b, int64_t ldb, bool trans_b,
                    double alpha, double beta);

// Attention in blocks of keys, never the whole [Sq, Sk] scores (Note [Blocked attention] in
// tensor/kernels/attention.cpp); F32 and F64 (false otherwise: the caller composes it).
bool attention(const Tensor& out, const AttentionKernelArgs& a);
bool attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& grad,
                        const AttentionKernelArgs& a);

// What F32/F64 products run on, loading it if no product has yet: "OpenBLAS <its kernel set>"
// (Note [OpenBLAS core type]) or "Eigen".
std::string matmul_library();

bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
            int64_t limit);
bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                 int64_t offset, int64_t limit);

}  // namespace spmd::cpu_kernels
