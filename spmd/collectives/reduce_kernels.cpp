// spmd/collectives/reduce_kernels.cpp: blocked, cache-resident reductions in fixed rank order.
#include <spmd/collectives/reduce_kernels.h>

#include <algorithm>
#include <functional>
#include <type_traits>

#include <spmd/core/error.h>
#include <spmd/core/parallel.h>

namespace spmd {
namespace {

// Elements per block: the accumulator block stays in L1 while all k inputs stream through it.
constexpr int64_t kBlock = 2048;
// Blocks per parallel chunk (about 64K elements): below that the pool costs more than it gives.
constexpr int64_t kBlocksPerTask = 32;

template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<BFloat16> {
  using type = float;
};
template <>
struct Acc<Half> {
  using type = float;
};

template <class A>
inline A combine(ReduceOp op, A acc, A v) {
  if constexpr (std::is_same_v<A, bool>) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        return acc || v;
      case ReduceOp::Product:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        return acc && v;
      case ReduceOp::BXor:
        return acc != v;
      case ReduceOp::Avg:
        break;
    }
    return acc;
  } else if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        return static_cast<A>(static_cast<U>(acc) + static_cast<U>(v));
      case ReduceOp::Product:
        return static_cast<A>(static_cast<U>(acc) * static_cast<U>(v));
      case ReduceOp::Min:
        return std::min(acc, v);
      case ReduceOp::Max:
        return std::max(acc, v);
      case ReduceOp::BAnd:
        return acc & v;
      case ReduceOp::BOr:
        return acc | v;
      case ReduceOp::BXor:
        return acc ^ v;
    }
    return acc;
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        return acc + v;
      case ReduceOp::Product:
        return acc * v;
      case ReduceOp::Min:
        return (v < acc || v != v) ? v : acc;
      case ReduceOp::Max:
        return (v > acc || v != v) ? v : acc;
      default:
        return acc;
    }
  }
}

// The inner loop specialised per op so the compiler can vectorise it.
template <class A, class T>
void fold(ReduceOp op, A* acc, const T* in, int64_t m) {
  auto loop = [&](auto f) {
    for (int64_t i = 0; i < m; ++i) acc[i] = f(acc[i], static_cast<A>(in[i]));
  };
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      for (int64_t i = 0; i < m; ++i) acc[i] += static_cast<A>(in[i]);
      return;
    }
  }
  loop([op](A a, A v) { return combine(op, a, v); });
}

template <class T>
void reduce_typed(ReduceOp op, const void* const* inputs, int64_t k, void* out_raw, int64_t n) {
  using A = typename Acc<T>::type;
  T* out = static_cast<T*>(out_raw);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  auto body = [&](int64_t b0, int64_t b1) {
    A acc[kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * kBlock;
      const int64_t m = std::min(kBlock, n - begin);
      const T* first = static_cast<const T*>(inputs[0]) + begin;
      for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<A>(first[i]);
      for (int64_t j = 1; j < k; ++j) fold(op, acc, static_cast<const T*>(inputs[j]) + begin, m);
      if (op == ReduceOp::Avg) {
        if constexpr (!std::is_same_v<A, bool>) {
          for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] / static_cast<A>(k));
        }
      }
      T* dst = out + begin;
      for (int64_t i = 0; i < m; ++i) dst[i] = static_cast<T>(acc[i]);
    }
  };
  // What parallel_for would run inline, without building its std::function: small reductions
  // are most of a small collective's calls.
  if (blocks < 2 * kBlocksPerTask) {
    body(0, blocks);
    return;
  }
  // std::ref: the std::function parallel_for takes then holds a reference, no heap copy.
  parallel_for(blocks, kBlocksPerTask, std::ref(body));
}

}  // namespace

void reduce_buffers(DType dtype, ReduceOp op, const void* const* inputs, int64_t k, void* out,
                    int64_t n) {
  if (k <= 0 || n < 0) throw_error<InternalError>("reduce_buffers: k={} n={}", k, n);
  if (is_bitwise(op) && is_floating(dtype)) {
    throw_error<Unsupported>("reduce: op {} is not defined for {}", op, dtype);
  }
  if (is_float8(dtype)) throw_no_float8_kernel(dtype, "reduce");
  if (op == ReduceOp::Avg && dtype == DType::Bool) {
    throw_error<Unsupported>("reduce: op avg is not defined for bool");
  }
  if (n == 0) return;
  dispatch_arithmetic(dtype, "reduce", [&]<class T>() { reduce_typed<T>(op, inputs, k, out, n); });
}

}  // namespace spmd
