// spmd/tensor/kernels/cpu_kernels.h: the CPU kernels behind cpu_ops() (tensor/device_ops.h).
//
// Internal to tensor/. Each function has the contract of the DeviceOps method of the same name;
// the translation units split them by weight: elementwise.cpp (fill, copy, binary, unary, where,
// comparisons), index.cpp (gather, scatter_add), reduce.cpp (reductions, softmax), matmul.cpp
// (Eigen).
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
// What F32/F64 products run on, loading it if no product has yet: "OpenBLAS <its kernel set>"
// (Note [OpenBLAS core type]) or "Eigen".
std::string matmul_library();

bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
            int64_t limit);
bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                 int64_t offset, int64_t limit);

}  // namespace spmd::cpu_kernels
