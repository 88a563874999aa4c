// spmd/sim/local_ops.h: every Tensor op of tensor/ops.h, applied to LocalTensor shard by shard.
//
// Operands must hold the same ranks. A plain Tensor or double operand is the same on every rank.
// When every LocalTensor operand is replicated (Note [Copy-on-write replicas]) the op runs once
// and the result is replicated too.
#pragma once

#include <span>
#include <vector>

#include <spmd/sim/local_tensor.h>
#include <spmd/tensor/ops.h>

namespace spmd {

#define SPMD_LOCAL_BINARY_(name)                                \
  LocalTensor name(const LocalTensor& a, const LocalTensor& b); \
  LocalTensor name(const LocalTensor& a, const Tensor& b);      \
  LocalTensor name(const Tensor& a, const LocalTensor& b);
SPMD_LOCAL_BINARY_(add)
SPMD_LOCAL_BINARY_(sub)
SPMD_LOCAL_BINARY_(mul)
SPMD_LOCAL_BINARY_(div)
SPMD_LOCAL_BINARY_(maximum)
SPMD_LOCAL_BINARY_(minimum)
SPMD_LOCAL_BINARY_(matmul)
SPMD_LOCAL_BINARY_(bmm)
#undef SPMD_LOCAL_BINARY_

#define SPMD_LOCAL_OPERATOR_(op)                                       \
  LocalTensor operator op(const LocalTensor& a, const LocalTensor& b); \
  LocalTensor operator op(const LocalTensor& a, const Tensor& b);      \
  LocalTensor operator op(const Tensor& a, const LocalTensor& b);      \
  LocalTensor operator op(const LocalTensor& a, double b);             \
  LocalTensor operator op(double a, const LocalTensor& b);
SPMD_LOCAL_OPERATOR_(+)
SPMD_LOCAL_OPERATOR_(-)
SPMD_LOCAL_OPERATOR_(*)
SPMD_LOCAL_OPERATOR_(/)
#undef SPMD_LOCAL_OPERATOR_
LocalTensor operator-(const LocalTensor& a);

LocalTensor addmm(const LocalTensor& c, const LocalTensor& a, const LocalTensor& b,
                  double beta = 1.0, double alpha = 1.0);

LocalTensor neg(const LocalTensor& t);
LocalTensor abs(const LocalTensor& t);
LocalTensor exp(const LocalTensor& t);
LocalTensor log(const LocalTensor& t);
LocalTensor sqrt(const LocalTensor& t);
LocalTensor tanh(const LocalTensor& t);
LocalTensor relu(const LocalTensor& t);
LocalTensor gelu(const LocalTensor& t);

LocalTensor sum(const LocalTensor& t);
LocalTensor sum(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
LocalTensor mean(const LocalTensor& t);
LocalTensor mean(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
LocalTensor amax(const LocalTensor& t);
LocalTensor amax(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
LocalTensor amin(const LocalTensor& t);
LocalTensor amin(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim = false);

LocalTensor softmax(const LocalTensor& t, int64_t d);
LocalTensor log_softmax(const LocalTensor& t, int64_t d);

LocalTensor cat(const std::vector<LocalTensor>& tensors, int64_t d = 0);
LocalTensor stack(const std::vector<LocalTensor>& tensors, int64_t d = 0);
LocalTensor pad(const LocalTensor& t, int64_t d, int64_t before, int64_t after, double value = 0.0);
// Per-rank padding amounts (uneven shards pad by different amounts).
LocalTensor pad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                const PerRank<int64_t>& after, double value = 0.0);
LocalTensor unpad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                  const PerRank<int64_t>& after);

// Per-rank comparisons.
PerRank<bool> equal(const LocalTensor& a, const LocalTensor& b);
PerRank<bool> allclose(const LocalTensor& a, const LocalTensor& b, double rtol = 1e-5,
                       double atol = 1e-8);

// Factories over a world's held ranks (each rank gets the same values, stored once).
LocalTensor zeros(const World& world, const Shape& shape, DType dtype = DType::F32);
LocalTensor ones(const World& world, const Shape& shape, DType dtype = DType::F32);
LocalTensor full(const World& world, const Shape& shape, double value, DType dtype = DType::F32);
// Rank r holds randn(shape, seed + r): independent data per rank.
LocalTensor randn_per_rank(const World& world, const Shape& shape, uint64_t seed,
                           DType dtype = DType::F32);

// Sees the name, the LocalTensor operands and the result of every arithmetic op above (the
// binary, scalar, unary and reduction ops, addmm, softmax, log_softmax) while set, for
// --spmd-debug=nan (debug/). Null (the default) costs one relaxed atomic load per op.
using LocalOpObserver = void (*)(const char* op, std::span<const LocalTensor* const> inputs,
                                 const LocalTensor& result);
void set_local_op_observer(LocalOpObserver observer);

}  // namespace spmd
