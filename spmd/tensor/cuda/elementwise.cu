// spmd/tensor/cuda/elementwise.cu: fill, copy with conversion, binary and unary elementwise
// kernels, where, gather and scatter-add along a dim, and the comparisons (tensor/cuda/kernels.h).
// One thread per element, grid-stride loops; the arithmetic is tensor/element_ops.h's, the same
// functors the CPU kernels run.
#include <spmd/tensor/cuda/kernels.h>

namespace spmd::cuda_kernels {
namespace {

using namespace spmd::cuda_math;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// ---- fill and copy ---------------------------------------------------------------------------

template <class U>
__global__ void fill_kernel(U* dst, Indexer<1> ix, int64_t n, U value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = value;
  }
}

template <class U>
cudaError_t launch_fill(void* dst, const Indexer<1>& ix, int64_t n, uint64_t bits,
                        cudaStream_t stream) {
  fill_kernel<U>
      <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<U*>(dst), ix, n, static_cast<U>(bits));
  return cudaGetLastError();
}

template <class D, class S>
__global__ void copy_kernel(D* dst, const S* src, Indexer<2> ix, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = convert<D>(src[off[1]]);
  }
}

// ---- binary and unary ----------------------------------------------------------------------

template <class T, class Op>
using binary_out_t = std::conditional_t<element::is_predicate<Op>, bool, T>;

template <class T, class Op>
__global__ void binary_kernel(binary_out_t<T, Op>* out, const T* a, const T* b, Indexer<3> ix,
                              int64_t n, Op op) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[3];
    ix.offsets(i, off);
    if constexpr (element::is_predicate<Op>) {
      out[off[0]] = op(load(a[off[1]]), load(b[off[2]]));
    } else {
      out[off[0]] = store<T>(op(load(a[off[1]]), load(b[off[2]])));
    }
  }
}

template <class T, class Op>
cudaError_t launch_binary(void* out, const void* a, const void* b, const Indexer<3>& ix, int64_t n,
                          cudaStream_t stream) {
  binary_kernel<T, Op><<<blocks_for(n), kThreads, 0, stream>>>(
      static_cast<binary_out_t<T, Op>*>(out), static_cast<const T*>(a), static_cast<const T*>(b),
      ix, n, Op{});
  return cudaGetLastError();
}

// Launches the kernel of functor F (element::visit calls it with the op's functor); a dtype the
// functor does not compute in leaves cudaErrorInvalidValue. (nvcc compiles C++17 here: no template
// lambdas.)
template <class T>
struct BinaryLaunch {
  void* out;
  const void* a;
  const void* b;
  const Indexer<3>& ix;
  int64_t n;
  cudaStream_t stream;
  cudaError_t result = cudaErrorInvalidValue;
  template <class F>
  void operator()() {
    if constexpr (element::accepts<F, compute_t<T>>) {
      result = launch_binary<T, F>(out, a, b, ix, n, stream);
    }
  }
};

template <class T>
cudaError_t binary_typed(int op, void* out, const void* a, const void* b, const Indexer<3>& ix,
                         int64_t n, cudaStream_t stream) {
  BinaryLaunch<T> launch{out, a, b, ix, n, stream};
  element::visit<element::BinaryOps>(op, launch);
  return launch.result;
}

template <class T, class Op>
__global__ void unary_kernel(T* out, const T* in, Indexer<2> ix, int64_t n, Op op) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = store<T>(op(load(in[off[1]])));
  }
}

template <class T, class Op>
cudaError_t launch_unary(void* out, const void* in, const Indexer<2>& ix, int64_t n,
                         cudaStream_t stream) {
  unary_kernel<T, Op><<<blocks_for(n), kThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(in), ix, n, Op{});
  return cudaGetLastError();
}

template <class T>
struct UnaryLaunch {
  void* out;
  const void* in;
  const Indexer<2>& ix;
  int64_t n;
  cudaStream_t stream;
  cudaError_t result = cudaErrorInvalidValue;
  template <class F>
  void operator()() {
    if constexpr (element::accepts<F, compute_t<T>>) {
      result = launch_unary<T, F>(out, in, ix, n, stream);
    }
  }
};

template <class T>
cudaError_t unary_typed(int op, void* out, const void* in, const Indexer<2>& ix, int64_t n,
                        cudaStream_t stream) {
  UnaryLaunch<T> launch{out, in, ix, n, stream};
  element::visit<element::UnaryOps>(op, launch);
  return launch.result;
}

// ---- derivatives -----------------------------------------------------------------------------

template <class T, class Fn>
__global__ void ternary_kernel(T* out, const T* x0, const T* x1, const T* x2, Indexer<4> ix,
                               int64_t n, Fn fn) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = store<T>(fn(load(x0[off[1]]), load(x1[off[2]]), load(x2[off[3]])));
  }
}

template <class F>
struct UnaryDerivative {
  template <class C>
  SPMD_HD C operator()(C g, C x, C y) const {
    return g * F::df(x, y);
  }
};

template <class F, int wrt>
struct BinaryDerivative {
  template <class C>
  SPMD_HD C operator()(C g, C a, C b) const {
    if (wrt == 0) return F::da(g, a, b);
    return F::db(g, a, b);
  }
};

// Launches the derivative kernel of functor F (float and double compute types only).
template <class T, template <class> class Derivative>
struct DerivativeLaunch {
  void* out;
  const void* x0;
  const void* x1;
  const void* x2;
  const Indexer<4>& ix;
  int64_t n;
  cudaStream_t stream;
  cudaError_t result = cudaErrorInvalidValue;
  template <class F>
  void operator()() {
    if constexpr (std::is_floating_point_v<compute_t<T>> && !element::is_predicate<F>) {
      ternary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(x0), static_cast<const T*>(x1),
          static_cast<const T*>(x2), ix, n, Derivative<F>{});
      result = cudaGetLastError();
    }
  }
};

template <class F>
using DerivativeA = BinaryDerivative<F, 0>;
template <class F>
using DerivativeB = BinaryDerivative<F, 1>;

// ---- where, gather, scatter-add ------------------------------------------------------------

template <class T>
__global__ void where_kernel(T* out, const bool* cond, const T* a, const T* b, Indexer<4> ix,
                             int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class T>
__global__ void gather_kernel(T* out, const int64_t* index, const T* in, Indexer<3> ix, int64_t n,
                              int64_t offset, int64_t limit, int64_t size, int64_t step,
                              unsigned int* bad) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t v = index[off[1]];
    if (v < 0 || v >= limit) {
      atomicOr(bad, 1u);
      out[off[0]] = convert<T>(0.0f);
      continue;
    }
    const int64_t j = v - offset;
    out[off[0]] = j >= 0 && j < size ? in[off[2] + j * step] : convert<T>(0.0f);
  }
}

template <class T>
__global__ void scatter_add_kernel(T* out, const int64_t* index, const T* src, Indexer<3> ix,
                                   int64_t n, int64_t offset, int64_t limit, int64_t size,
                                   int64_t step, unsigned int* bad) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t v = index[off[1]];
    if (v < 0 || v >= limit) {
      atomicOr(bad, 1u);
      continue;
    }
    const int64_t j = v - offset;
    if (j >= 0 && j < size) atomicAdd(&out[off[2] + j * step], src[off[0]]);
  }
}

// ---- comparisons ---------------------------------------------------------------------------

template <class T>
__global__ void compare_kernel(Compare what, const T* a, const T* b, Indexer<2> ix, int64_t n,
                               double rtol, double atol, CompareResult* result) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t off[2];
    ix.offsets(i, off);
    const T x = a[off[0]];
    switch (what) {
      case Compare::Equal:
        if (!(load(x) == load(b[off[1]]))) atomicOr(&result->flag, 1u);
        break;
      case Compare::AllClose: {
        const double u = convert<double>(x);
        const double v = convert<double>(b[off[1]]);
        // Infinities are close only to themselves; NaN to nothing.
        const bool close =
            u == v || (isfinite(u) && isfinite(v) && fabs(u - v) <= atol + rtol * fabs(v));
        if (!close) atomicOr(&result->flag, 1u);
        break;
      }
      case Compare::MaxAbsDiff: {
        const double u = convert<double>(x);
        const double v = convert<double>(b[off[1]]);
        if (u != u || v != v) {
          atomicOr(&result->flag, 1u);
        } else if (u != v) {
          // Non-negative doubles order like their bit patterns.
          atomicMax(&result->max_bits, static_cast<unsigned long long>(double_bits(fabs(u - v))));
        }
        break;
      }
      case Compare::HasNonfinite:
        if constexpr (!std::is_integral_v<T>) {
          if (!isfinite(convert<double>(x))) atomicOr(&result->flag, 1u);
        }
        break;
    }
  }
}

}  // namespace

cudaError_t fill(int elt_size, void* dst, const Indexer<1>& ix, int64_t n, uint64_t bits,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (elt_size) {
    case 1:
      return launch_fill<uint8_t>(dst, ix, n, bits, stream);
    case 2:
      return launch_fill<uint16_t>(dst, ix, n, bits, stream);
    case 4:
      return launch_fill<uint32_t>(dst, ix, n, bits, stream);
    case 8:
      return launch_fill<uint64_t>(dst, ix, n, bits, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t copy(Elt dst_type, void* dst, Elt src_type, const void* src, const Indexer<2>& ix,
                 int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(dst_type, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return dispatch(src_type, [&](auto src_tag) {
      using S = decltype(src_tag);
      copy_kernel<D, S><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<D*>(dst),
                                                                static_cast<const S*>(src), ix, n);
      return cudaGetLastError();
    });
  });
}

cudaError_t binary(int op, Elt type, void* out, const void* a, const void* b, const Indexer<3>& ix,
                   int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(
      type, [&](auto tag) { return binary_typed<decltype(tag)>(op, out, a, b, ix, n, stream); });
}

cudaError_t unary(int op, Elt type, void* out, const void* in, const Indexer<2>& ix, int64_t n,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type,
                  [&](auto tag) { return unary_typed<decltype(tag)>(op, out, in, ix, n, stream); });
}

cudaError_t unary_backward(int op, Elt type, void* out, const void* grad, const void* in,
                           const void* result, const Indexer<4>& ix, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    DerivativeLaunch<decltype(tag), UnaryDerivative> launch{out, grad, in, result, ix, n, stream};
    element::visit<element::UnaryOps>(op, launch);
    return launch.result;
  });
}

cudaError_t binary_backward(int op, int wrt, Elt type, void* out, const void* grad, const void* a,
                            const void* b, const Indexer<4>& ix, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (wrt == 0) {
      DerivativeLaunch<T, DerivativeA> launch{out, grad, a, b, ix, n, stream};
      element::visit<element::BinaryOps>(op, launch);
      return launch.result;
    }
    DerivativeLaunch<T, DerivativeB> launch{out, grad, a, b, ix, n, stream};
    element::visit<element::BinaryOps>(op, launch);
    return launch.result;
  });
}

cudaError_t where(Elt type, void* out, const bool* cond, const void* a, const void* b,
                  const Indexer<4>& ix, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(out), cond, static_cast<const T*>(a), static_cast<const T*>(b), ix, n);
    return cudaGetLastError();
  });
}

cudaError_t gather(Elt type, void* out, const int64_t* index, const void* in, const Indexer<3>& ix,
                   int64_t n, int64_t offset, int64_t limit, int64_t size, int64_t step,
                   unsigned int* bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    gather_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(out), index,
                                                             static_cast<const T*>(in), ix, n,
                                                             offset, limit, size, step, bad);
    return cudaGetLastError();
  });
}

cudaError_t scatter_add(Elt type, void* out, const int64_t* index, const void* src,
                        const Indexer<3>& ix, int64_t n, int64_t offset, int64_t limit,
                        int64_t size, int64_t step, unsigned int* bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (type == Elt::F32) {
    scatter_add_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<float*>(out), index, static_cast<const float*>(src), ix, n, offset, limit, size,
        step, bad);
    return cudaGetLastError();
  }
  if (type == Elt::F64) {
    scatter_add_kernel<double><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<double*>(out), index, static_cast<const double*>(src), ix, n, offset, limit,
        size, step, bad);
    return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

cudaError_t compare(Compare what, Elt type, const void* a, const void* b, const Indexer<2>& ix,
                    int64_t n, double rtol, double atol, CompareResult* result,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    compare_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        what, static_cast<const T*>(a), static_cast<const T*>(b), ix, n, rtol, atol, result);
    return cudaGetLastError();
  });
}

}  // namespace spmd::cuda_kernels
