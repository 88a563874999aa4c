// spmd/tensor/cuda/reduce.cu: reductions over dims, softmax, integer matmul, the matmul scale for
// an empty inner dim, and the stacked reductions the nccl backend's fallbacks use
// (tensor/cuda/kernels.h).
//
// A reduction with few elements per output runs one thread per output, in the CPU kernel's
// order; longer ones run one block per output, each thread folding a strided slice before a
// shared-memory tree. Floating sums accumulate in double, so F32 results match the CPU kernel
// (also double) except in the last bit of rare ties; integer sums wrap in uint64 exactly.
#include <spmd/tensor/cuda/kernels.h>

namespace spmd::cuda_kernels {
namespace {

using namespace spmd::cuda_math;

constexpr int kBlockThreads = 256;
// Up to this many elements per output, one thread folds an output alone.
constexpr int64_t kThreadPerOutputMax = 64;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

unsigned int blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// ---- reductions over dims ------------------------------------------------------------------

// spmd::Reduction values.
enum ReductionCode { kSum, kMean, kAmax, kAmin };

// How one reduction folds: the accumulator type, its start, one step, and the stored result.
template <class T, class O>
struct SumFold {
  using Acc = std::conditional_t<std::is_integral_v<compute_t<T>>, unsigned long long, double>;
  double count;
  __device__ Acc init() const { return Acc(0); }
  __device__ Acc value(T x) const { return static_cast<Acc>(load(x)); }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ O finish(Acc a, bool mean) const {
    if constexpr (std::is_integral_v<Acc>) {
      return convert<O>(static_cast<int64_t>(a));
    } else {
      return convert<O>(mean ? a / count : a);
    }
  }
};

template <class T>
struct ExtremumFold {
  using C = compute_t<T>;
  using Acc = C;
  bool is_max;
  __device__ Acc init() const {
    if constexpr (std::is_same_v<C, bool>) {
      return !is_max;
    } else if constexpr (std::is_integral_v<C>) {
      return is_max ? IntLimits<C>::min : IntLimits<C>::max;
    } else {
      return is_max ? C(-INFINITY) : C(INFINITY);
    }
  }
  __device__ Acc value(T x) const { return load(x); }
  __device__ Acc combine(Acc current, Acc v) const {
    return extremum_better(is_max, v, current) ? v : current;
  }
  __device__ T finish(Acc a, bool) const { return store<T>(a); }
};

template <class T, class O, class Fold>
__global__ void reduce_thread_kernel(O* out, const T* in, Indexer<1> kept, Indexer<1> reduced,
                                     int64_t n_out, int64_t n_red, Fold fold, bool mean) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < n_out;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int64_t base[1];
    kept.offsets(o, base);
    auto acc = fold.init();
    for (int64_t r = 0; r < n_red; ++r) {
      int64_t off[1];
      reduced.offsets(r, off);
      acc = fold.combine(acc, fold.value(in[base[0] + off[0]]));
    }
    out[o] = fold.finish(acc, mean);
  }
}

template <class T, class O, class Fold>
__global__ void reduce_block_kernel(O* out, const T* in, Indexer<1> kept, Indexer<1> reduced,
                                    int64_t n_out, int64_t n_red, Fold fold, bool mean) {
  using Acc = typename Fold::Acc;
  __shared__ Acc partial[kBlockThreads];
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    int64_t base[1];
    kept.offsets(o, base);
    Acc acc = fold.init();
    for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x) {
      int64_t off[1];
      reduced.offsets(r, off);
      acc = fold.combine(acc, fold.value(in[base[0] + off[0]]));
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s)
        partial[threadIdx.x] = fold.combine(partial[threadIdx.x], partial[threadIdx.x + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = fold.finish(partial[0], mean);
    __syncthreads();
  }
}

template <class T, class O, class Fold>
cudaError_t launch_reduce(O* out, const T* in, const Indexer<1>& kept, const Indexer<1>& reduced,
                          int64_t n_out, int64_t n_red, Fold fold, bool mean, cudaStream_t stream) {
  if (n_red <= kThreadPerOutputMax) {
    reduce_thread_kernel<T, O, Fold>
        <<<blocks_for(n_out, kBlockThreads), kBlockThreads, 0, stream>>>(out, in, kept, reduced,
                                                                         n_out, n_red, fold, mean);
  } else {
    const int64_t blocks = n_out < kMaxBlocks ? n_out : kMaxBlocks;
    reduce_block_kernel<T, O, Fold>
        <<<static_cast<unsigned int>(blocks), kBlockThreads, 0, stream>>>(out, in, kept, reduced,
                                                                          n_out, n_red, fold, mean);
  }
  return cudaGetLastError();
}

// ---- softmax -------------------------------------------------------------------------------

template <class T>
__global__ void softmax_kernel(T* out, const T* in, Indexer<2> rows, int64_t n_rows, int64_t length,
                               int64_t out_step, int64_t in_step, bool log) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ C partial[kBlockThreads];
  const unsigned int tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    int64_t off[2];
    rows.offsets(r, off);
    const T* x = in + off[1];
    T* o = out + off[0];
    C max = C(-INFINITY);
    for (int64_t i = tid; i < length; i += blockDim.x) {
      const C v = static_cast<C>(load(x[i * in_step]));
      if (v > max || v != v) max = v;
    }
    partial[tid] = max;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) {
        const C other = partial[tid + s];
        if (other > partial[tid] || other != other) partial[tid] = other;
      }
      __syncthreads();
    }
    max = partial[0];
    __syncthreads();
    C total = 0;
    for (int64_t i = tid; i < length; i += blockDim.x) {
      total += math_exp(static_cast<C>(load(x[i * in_step])) - max);
    }
    partial[tid] = total;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) partial[tid] += partial[tid + s];
      __syncthreads();
    }
    total = partial[0];
    __syncthreads();
    const C scale = log ? -math_log(total) : C(1) / total;
    for (int64_t i = tid; i < length; i += blockDim.x) {
      const C shifted = static_cast<C>(load(x[i * in_step])) - max;
      o[i * out_step] = convert<T>(log ? shifted + scale : math_exp(shifted) * scale);
    }
  }
}

// ---- integer matmul and the empty-inner-dim scale --------------------------------------------

template <class T>
__global__ void matmul_integer_kernel(T* out, const T* a, const T* b, int64_t batch, int64_t n,
                                      int64_t m, int64_t k, int64_t a0, int64_t a1, int64_t a2,
                                      int64_t b0, int64_t b1, int64_t b2, uint64_t alpha,
                                      uint64_t beta, bool keep_old) {
  const int64_t total = batch * n * m;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t j = idx % m;
    const int64_t i = (idx / m) % n;
    const int64_t bi = idx / (n * m);
    uint64_t acc = 0;
    for (int64_t l = 0; l < k; ++l) {
      const T x = a[bi * a0 + i * a1 + l * a2];
      const T y = b[bi * b0 + l * b1 + j * b2];
      acc += static_cast<uint64_t>(static_cast<int64_t>(x)) *
             static_cast<uint64_t>(static_cast<int64_t>(y));
    }
    const uint64_t old = keep_old ? static_cast<uint64_t>(static_cast<int64_t>(out[idx])) : 0;
    out[idx] = static_cast<T>(static_cast<int64_t>(alpha * acc + beta * old));
  }
}

template <class T>
__global__ void scale_kernel(T* out, int64_t n, double beta) {
  using C = compute_t<T>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    out[i] = beta == 0.0 ? store<T>(C(0)) : store<T>(load(out[i]) * static_cast<C>(beta));
  }
}

// ---- stacked reductions (collectives/reduce_kernels.cpp's combine) -------------------------

// spmd::ReduceOp values.
enum ReduceOpCode { kRSum, kRAvg, kRProduct, kRMin, kRMax, kRBAnd, kRBOr, kRBXor };

template <class A>
__device__ A combine_op(int op, A acc, A v) {
  if constexpr (std::is_same_v<A, bool>) {
    switch (op) {
      case kRSum:
      case kRMax:
      case kRBOr:
        return acc || v;
      case kRProduct:
      case kRMin:
      case kRBAnd:
        return acc && v;
      case kRBXor:
        return acc != v;
      default:
        return acc;
    }
  } else if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case kRSum:
      case kRAvg:
        return static_cast<A>(static_cast<U>(acc) + static_cast<U>(v));
      case kRProduct:
        return static_cast<A>(static_cast<U>(acc) * static_cast<U>(v));
      case kRMin:
        return v < acc ? v : acc;
      case kRMax:
        return acc < v ? v : acc;
      case kRBAnd:
        return acc & v;
      case kRBOr:
        return acc | v;
      case kRBXor:
        return acc ^ v;
      default:
        return acc;
    }
  } else {
    switch (op) {
      case kRSum:
      case kRAvg:
        return acc + v;
      case kRProduct:
        return acc * v;
      case kRMin:
        return (v < acc || v != v) ? v : acc;
      case kRMax:
        return (v > acc || v != v) ? v : acc;
      default:
        return acc;
    }
  }
}

template <class T>
__global__ void reduce_stacked_kernel(int op, const T* in, int64_t k, int64_t stride, T* out,
                                      int64_t n) {
  using A = compute_t<T>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    A acc = load(in[i]);
    for (int64_t j = 1; j < k; ++j) acc = combine_op(op, acc, load(in[j * stride + i]));
    if constexpr (!std::is_same_v<A, bool>) {
      if (op == kRAvg) acc = static_cast<A>(acc / static_cast<A>(k));
    }
    out[i] = store<T>(acc);
  }
}

__global__ void keep_low_bit_kernel(uint8_t* data, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    data[i] &= 1u;
  }
}

}  // namespace

cudaError_t reduce(int op, Elt in_type, Elt out_type, void* out, const void* in,
                   const Indexer<1>& kept, const Indexer<1>& reduced, int64_t n_out, int64_t n_red,
                   double count, cudaStream_t stream) {
  if (n_out == 0) return cudaSuccess;
  return dispatch(in_type, [&](auto in_tag) {
    using T = decltype(in_tag);
    const T* src = static_cast<const T*>(in);
    if (op == kAmax || op == kAmin) {
      if (out_type != in_type) return cudaErrorInvalidValue;
      return launch_reduce(static_cast<T*>(out), src, kept, reduced, n_out, n_red,
                           ExtremumFold<T>{op == kAmax}, false, stream);
    }
    if (op != kSum && op != kMean) return cudaErrorInvalidValue;
    const bool mean = op == kMean;
    if constexpr (std::is_integral_v<compute_t<T>>) {
      if (out_type != Elt::I64 || mean) return cudaErrorInvalidValue;
      return launch_reduce(static_cast<int64_t*>(out), src, kept, reduced, n_out, n_red,
                           SumFold<T, int64_t>{count}, false, stream);
    } else {
      if (out_type != in_type) return cudaErrorInvalidValue;
      return launch_reduce(static_cast<T*>(out), src, kept, reduced, n_out, n_red,
                           SumFold<T, T>{count}, mean, stream);
    }
  });
}

cudaError_t softmax(Elt type, void* out, const void* in, const Indexer<2>& rows, int64_t n_rows,
                    int64_t length, int64_t out_step, int64_t in_step, bool log,
                    cudaStream_t stream) {
  if (n_rows == 0 || length == 0) return cudaSuccess;
  // Power-of-two block sizes (the trees halve them); short rows take a single warp.
  const int threads = length <= 32 ? 32 : (length <= 128 ? 128 : kBlockThreads);
  const int64_t blocks = n_rows < kMaxBlocks ? n_rows : kMaxBlocks;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<compute_t<T>>) {
      return cudaErrorInvalidValue;
    } else {
      softmax_kernel<T><<<static_cast<unsigned int>(blocks), threads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(in), rows, n_rows, length, out_step, in_step,
          log);
      return cudaGetLastError();
    }
  });
}

cudaError_t matmul_integer(Elt type, void* out, const void* a, const void* b, int64_t batch,
                           int64_t n, int64_t m, int64_t k, const int64_t* a_strides,
                           const int64_t* b_strides, uint64_t alpha, uint64_t beta,
                           cudaStream_t stream) {
  const int64_t total = batch * n * m;
  if (total == 0) return cudaSuccess;
  const bool keep_old = beta != 0;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    matmul_integer_kernel<T><<<blocks_for(total, kBlockThreads), kBlockThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), batch, n, m, k,
        a_strides[0], a_strides[1], a_strides[2], b_strides[0], b_strides[1], b_strides[2], alpha,
        beta, keep_old);
    return cudaGetLastError();
  };
  if (type == Elt::I32) return launch(int32_t{});
  if (type == Elt::I64) return launch(int64_t{});
  return cudaErrorInvalidValue;
}

cudaError_t scale(Elt type, void* out, int64_t n, double beta, cudaStream_t stream) {
  if (n == 0 || beta == 1.0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<compute_t<T>>) {
      return cudaErrorInvalidValue;
    } else {
      scale_kernel<T><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream>>>(
          static_cast<T*>(out), n, beta);
      return cudaGetLastError();
    }
  });
}

cudaError_t reduce_stacked(int op, Elt type, const void* in, int64_t k, int64_t stride, void* out,
                           int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (k < 1) return cudaErrorInvalidValue;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    reduce_stacked_kernel<T><<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream>>>(
        op, static_cast<const T*>(in), k, stride, static_cast<T*>(out), n);
    return cudaGetLastError();
  });
}

cudaError_t keep_low_bit(uint8_t* data, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  keep_low_bit_kernel<<<blocks_for(n, kBlockThreads), kBlockThreads, 0, stream>>>(data, n);
  return cudaGetLastError();
}

}  // namespace spmd::cuda_kernels
