// spmd/tensor/cuda/cuda_ops.cpp: the DeviceOps of CUDA tensors: host <-> device copies, kernel
// launches (tensor/cuda/kernels.h) and cuBLAS matmul.
//
// Each op makes the tensor's device current, walks its operands with an Indexer (strides
// merged, at most kMaxDims dims; wider walks are split along dim 0) and enqueues on the device's
// stream (Note [CUDA streams and sync points]). Semantics are the CPU kernels' (contract in
// tensor/device_ops.h): elementwise arithmetic bit for bit (nvcc runs with --fmad=false), except
// the last bit of exp/log/tanh/erf and of floating sums and products accumulated in another order.
#include <spmd/tensor/cuda/cuda_ops.h>

#include <cublas_v2.h>

#include <array>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/tensor/cuda/device.h>
#include <spmd/tensor/cuda/kernels.h>
#include <spmd/tensor/factory.h>

namespace spmd::gpu {
namespace {

namespace ck = cuda_kernels;
using cuda_math::Indexer;

static_assert(static_cast<int>(ck::Elt::F32) == static_cast<int>(DType::F32) &&
              static_cast<int>(ck::Elt::F64) == static_cast<int>(DType::F64) &&
              static_cast<int>(ck::Elt::BF16) == static_cast<int>(DType::BF16) &&
              static_cast<int>(ck::Elt::F16) == static_cast<int>(DType::F16) &&
              static_cast<int>(ck::Elt::I32) == static_cast<int>(DType::I32) &&
              static_cast<int>(ck::Elt::I64) == static_cast<int>(DType::I64) &&
              static_cast<int>(ck::Elt::Bool) == static_cast<int>(DType::Bool));
// The kernels switch on these enums' values (tensor/cuda/elementwise.cu, reduce.cu).
static_assert(static_cast<int>(Reduction::Sum) == 0 && static_cast<int>(Reduction::Amin) == 3);

ck::Elt elt(DType dtype) {
  // The CUDA kernels are not compiled for the float8 storage formats yet (Note [Float8]).
  if (is_float8(dtype)) throw_no_float8_kernel(dtype, "cuda kernel");
  return static_cast<ck::Elt>(dtype);
}

int index_of(const Tensor& t) {
  return t.device().index;
}

void check_kernel(cudaError_t error, std::string_view kernel, int device) {
  if (error != cudaSuccess) check(error, fmt::format("{} kernel", kernel).c_str(), device);
}

// Runs launch(indexer, operands) over N operands of one shape; when their merged walk has more
// than kMaxDims dims, once per index of dim 0.
template <int N, class Launch>
void elementwise(const std::array<Tensor, N>& operands, Launch&& launch) {
  std::array<const Strides*, N> strides;
  for (int k = 0; k < N; ++k)
    strides[static_cast<size_t>(k)] = &operands[static_cast<size_t>(k)].strides();
  Indexer<N> ix;
  try {
    ix = cuda_math::make_indexer<N>(operands[0].shape(), strides);
  } catch (const std::length_error&) {
    for (int64_t i = 0; i < operands[0].size(0); ++i) {
      std::array<Tensor, N> slice;
      for (size_t k = 0; k < static_cast<size_t>(N); ++k) slice[k] = operands[k].select(0, i);
      elementwise<N>(slice, launch);
    }
    return;
  }
  launch(ix, operands);
}

template <int N>
Indexer<N> indexer_or_throw(std::string_view op, const Shape& shape,
                            const std::array<const Strides*, N>& strides) {
  try {
    return cuda_math::make_indexer<N>(shape, strides);
  } catch (const std::length_error&) {
    spmd::throw_error<Unsupported>(
        "{}: shape {} has more than {} dims the CUDA kernel cannot merge", op, shape_str(shape),
        cuda_math::kMaxDims);
  }
}

// ---- copies ---------------------------------------------------------------------------------

void memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, int device) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream(device)), "cudaMemcpyAsync", device);
}

// dst = src, both on `device`: a memcpy when layouts and dtypes agree, else the copy kernel.
void device_copy(const Tensor& dst, const Tensor& src, int device) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    memcpy_async(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, device);
    return;
  }
  elementwise<2>({dst, src}, [&](const Indexer<2>& ix, const std::array<Tensor, 2>& t) {
    check_kernel(ck::copy(elt(t[0].dtype()), t[0].data_ptr(), elt(t[1].dtype()), t[1].data_ptr(),
                          ix, t[0].numel(), stream(device)),
                 "copy", device);
  });
}

// Host -> device: the host data made contiguous in its own dtype, copied over, then converted and
// strided on the device when the destination needs it. Pageable memory: once cudaMemcpyAsync
// returns, the host buffer may be freed.
void host_to_device(const Tensor& dst, const Tensor& src) {
  const int device = index_of(dst);
  set_device(device);
  const Tensor host = src.contiguous();
  if (dst.dtype() == host.dtype() && dst.is_contiguous()) {
    memcpy_async(dst.data_ptr(), host.data_ptr(), dst.nbytes(), cudaMemcpyHostToDevice, device);
    return;
  }
  const Tensor staged = empty(host.shape(), host.dtype(), dst.device());
  memcpy_async(staged.data_ptr(), host.data_ptr(), staged.nbytes(), cudaMemcpyHostToDevice, device);
  device_copy(dst, staged, device);
}

// Device -> host: converted and made contiguous on the device first, copied over, and strided on
// the host when the destination needs it. Returns after the data has arrived.
void device_to_host(const Tensor& dst, const Tensor& src) {
  const int device = index_of(src);
  set_device(device);
  Tensor packed = src;
  if (src.dtype() != dst.dtype() || !src.is_contiguous()) {
    packed = empty(src.shape(), dst.dtype(), src.device());
    device_copy(packed, src, device);
  }
  if (dst.is_contiguous()) {
    memcpy_async(dst.data_ptr(), packed.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToHost, device);
    synchronize(device);
    return;
  }
  const Tensor host = empty(src.shape(), dst.dtype());
  memcpy_async(host.data_ptr(), packed.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost, device);
  synchronize(device);
  cpu_ops().copy(dst, host);
}

// ---- cuBLAS ---------------------------------------------------------------------------------

constexpr int kMaxDevices = 64;

void check_blas(cublasStatus_t status, const char* call, int device) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  spmd::throw_error<Error>("{} failed on {}: {} ({})", call, where(device),
                           cublasGetStatusString(status), cublasGetStatusName(status));
}

// The device's cuBLAS handle, bound to its stream. F16 GEMMs may not reduce in half precision
// (the contract: BF16/F16 accumulate in F32 and round once); F32 does not use TF32 (the default
// math mode with CUBLAS_COMPUTE_32F).
cublasHandle_t blas_handle(int device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<cublasHandle_t, kMaxDevices> handles{};
  if (device < 0 || device >= kMaxDevices) {
    spmd::throw_error<Unsupported>("cuda:{}: device indices run from 0 to {}", device,
                                   kMaxDevices - 1);
  }
  std::call_once(once[static_cast<size_t>(device)], [&] {
    set_device(device);
    cublasHandle_t handle = nullptr;
    check_blas(cublasCreate(&handle), "cublasCreate", device);
    check_blas(cublasSetStream(handle, stream(device)), "cublasSetStream", device);
    check_blas(cublasSetMathMode(handle, static_cast<cublasMath_t>(
                                             CUBLAS_DEFAULT_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
               "cublasSetMathMode", device);
    handles[static_cast<size_t>(device)] = handle;
  });
  return handles[static_cast<size_t>(device)];
}

// How one batch's [rows, cols] matrix sits in memory (tensor/kernels/matmul.cpp's mappable):
// unit stride along one dim, and a leading dimension that keeps rows (or columns) apart.
struct MatrixLayout {
  bool row_major = true;
  int64_t ld = 1;
};

std::optional<MatrixLayout> mappable(const Tensor& t) {
  const int64_t rows = t.size(1);
  const int64_t cols = t.size(2);
  if (rows == 0 || cols == 0) return MatrixLayout{true, std::max<int64_t>(cols, 1)};
  const int64_t rs = rows == 1 ? cols : t.stride(1);
  const int64_t cs = cols == 1 ? rows : t.stride(2);
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) return MatrixLayout{true, rs};
  if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) return MatrixLayout{false, cs};
  return std::nullopt;
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    spmd::throw_error<Unsupported>("matmul: {} {} exceeds cuBLAS's int range", what, v);
  }
  return static_cast<int>(v);
}

// Note [Row-major GEMM in cuBLAS]
// cuBLAS is column-major. A row-major [n, m] matrix C read column-major is C^T, and
// C^T = B^T A^T, so cuBLAS computes (m, n, k) with its A = our b and its B = our a. Our b
// [k, m] row-major (leading dim ld) read column-major is exactly b^T, the m x k operand wanted:
// no transpose; column-major b (unit row stride) reads as b itself: transpose. The same for a.
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  const int device = index_of(out);
  const int64_t batch = out.size(0);
  const int64_t n = out.size(1);
  const int64_t m = out.size(2);
  const int64_t k = a.size(2);
  const MatrixLayout la = *mappable(a);
  const MatrixLayout lb = *mappable(b);
  const cublasOperation_t op_b = lb.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_a = la.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  cudaDataType type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (out.dtype()) {
    case DType::F32:
      break;
    case DType::F64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      break;
    case DType::BF16:
      type = CUDA_R_16BF;
      break;
    case DType::F16:
      type = CUDA_R_16F;
      break;
    default:
      SPMD_CHECK_MSG(false, "gemm on {}", out.dtype());
  }
  const float alpha32 = static_cast<float>(alpha);
  const float beta32 = static_cast<float>(beta);
  const bool f64 = out.dtype() == DType::F64;
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha) : &alpha32;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta) : &beta32;
  set_device(device);
  check_blas(
      cublasGemmStridedBatchedEx(
          blas_handle(device), op_b, op_a, to_int(m, "size"), to_int(n, "size"), to_int(k, "size"),
          alpha_ptr, b.data_ptr(), type, to_int(lb.ld, "leading dim"), b.stride(0), a.data_ptr(),
          type, to_int(la.ld, "leading dim"), a.stride(0), beta_ptr, out.data_ptr(), type,
          to_int(m, "size"), n * m, to_int(batch, "batch count"), compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx", device);
}

// ---- the DeviceOps --------------------------------------------------------------------------

class CudaOps final : public DeviceOps {
 public:
  void fill(const Tensor& dst, double value) override {
    const int device = index_of(dst);
    set_device(device);
    const uint64_t bits = dispatch_dtype(dst.dtype(), [&]<class T>() {
      const T v = convert_element<T>(value);
      uint64_t b = 0;
      std::memcpy(&b, &v, sizeof v);
      return b;
    });
    if (bits == 0 && dst.is_contiguous()) {
      if (dst.nbytes() > 0) {
        check(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream(device)), "cudaMemsetAsync",
              device);
      }
      return;
    }
    elementwise<1>({dst}, [&](const Indexer<1>& ix, const std::array<Tensor, 1>& t) {
      check_kernel(ck::fill(static_cast<int>(t[0].itemsize()), t[0].data_ptr(), ix, t[0].numel(),
                            bits, stream(device)),
                   "fill", device);
    });
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    SPMD_CHECK(dst.shape() == src.shape());
    if (dst.numel() == 0) return;
    const Device to = dst.device();
    const Device from = src.device();
    if (to.is_cpu()) {
      device_to_host(dst, src);
    } else if (from.is_cpu()) {
      host_to_device(dst, src);
    } else if (to == from) {
      set_device(to.index);
      device_copy(dst, src, to.index);
    } else {
      // Between two GPUs: through host memory (rare; not a hot path).
      const Tensor host = empty(src.shape(), src.dtype());
      device_to_host(host, src);
      host_to_device(dst, host);
    }
  }

  void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) override {
    const int device = index_of(out);
    set_device(device);
    elementwise<3>({out, a, b}, [&](const Indexer<3>& ix, const std::array<Tensor, 3>& t) {
      check_kernel(ck::binary(op, elt(a.dtype()), t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(),
                              ix, t[0].numel(), stream(device)),
                   element::name_of<element::BinaryOps>(op), device);
    });
  }

  void unary(int op, const Tensor& out, const Tensor& in) override {
    const int device = index_of(out);
    set_device(device);
    elementwise<2>({out, in}, [&](const Indexer<2>& ix, const std::array<Tensor, 2>& t) {
      check_kernel(ck::unary(op, elt(out.dtype()), t[0].data_ptr(), t[1].data_ptr(), ix,
                             t[0].numel(), stream(device)),
                   element::name_of<element::UnaryOps>(op), device);
    });
  }

  void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                      const Tensor& result) override {
    const int device = index_of(out);
    set_device(device);
    elementwise<4>(
        {out, grad, in, result}, [&](const Indexer<4>& ix, const std::array<Tensor, 4>& t) {
          check_kernel(ck::unary_backward(op, elt(out.dtype()), t[0].data_ptr(), t[1].data_ptr(),
                                          t[2].data_ptr(), t[3].data_ptr(), ix, t[0].numel(),
                                          stream(device)),
                       element::name_of<element::UnaryOps>(op), device);
        });
  }

  void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad, const Tensor& a,
                       const Tensor& b) override {
    const int device = index_of(out);
    set_device(device);
    elementwise<4>({out, grad, a, b}, [&](const Indexer<4>& ix, const std::array<Tensor, 4>& t) {
      check_kernel(
          ck::binary_backward(op, wrt, elt(out.dtype()), t[0].data_ptr(), t[1].data_ptr(),
                              t[2].data_ptr(), t[3].data_ptr(), ix, t[0].numel(), stream(device)),
          element::name_of<element::BinaryOps>(op), device);
    });
  }

  void reduce(Reduction op, const Tensor& out, const Tensor& in,
              const std::vector<int64_t>& dims) override {
    SPMD_CHECK(out.is_contiguous());
    SPMD_CHECK_EQ(out.dim(), in.dim());
    const int device = index_of(out);
    set_device(device);
    // kept: out's positions -> in's offsets (reduced dims have size 1 in out's shape);
    // reduced: positions along the reduced dims -> in's offsets.
    Shape reduced_shape = in.shape();
    std::vector<bool> is_reduced(static_cast<size_t>(in.dim()), false);
    for (int64_t d : dims) is_reduced[static_cast<size_t>(d)] = true;
    int64_t n_red = 1;
    for (size_t d = 0; d < reduced_shape.size(); ++d) {
      if (is_reduced[d]) {
        n_red *= reduced_shape[d];
      } else {
        reduced_shape[d] = 1;
      }
    }
    const Indexer<1> kept = indexer_or_throw<1>(op_name(op), out.shape(), {&in.strides()});
    const Indexer<1> reduced = indexer_or_throw<1>(op_name(op), reduced_shape, {&in.strides()});
    const double count = out.numel() == 0 ? 0.0 : static_cast<double>(in.numel() / out.numel());
    check_kernel(
        ck::reduce(static_cast<int>(op), elt(in.dtype()), elt(out.dtype()), out.data_ptr(),
                   in.data_ptr(), kept, reduced, out.numel(), n_red, count, stream(device)),
        op_name(op), device);
  }

  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
              double beta) override {
    SPMD_CHECK(out.is_contiguous() && out.dim() == 3 && a.dim() == 3 && b.dim() == 3);
    SPMD_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype());
    if (out.numel() == 0) return;
    const int device = index_of(out);
    set_device(device);
    const DType dtype = out.dtype();
    if (dtype == DType::I32 || dtype == DType::I64) {
      const int64_t a_strides[3] = {a.stride(0), a.stride(1), a.stride(2)};
      const int64_t b_strides[3] = {b.stride(0), b.stride(1), b.stride(2)};
      const auto ta = static_cast<uint64_t>(convert_element<int64_t>(alpha));
      const auto tb = static_cast<uint64_t>(convert_element<int64_t>(beta));
      check_kernel(ck::matmul_integer(elt(dtype), out.data_ptr(), a.data_ptr(), b.data_ptr(),
                                      out.size(0), out.size(1), out.size(2), a.size(2), a_strides,
                                      b_strides, ta, tb, stream(device)),
                   "matmul", device);
      return;
    }
    SPMD_CHECK_MSG(is_floating(dtype), "matmul on {} reached the CUDA kernels", dtype);
    if (a.size(2) == 0) {
      check_kernel(ck::scale(elt(dtype), out.data_ptr(), out.numel(), beta, stream(device)),
                   "matmul scale", device);
      return;
    }
    const Tensor a2 = mappable(a) ? a : a.contiguous();
    const Tensor b2 = mappable(b) ? b : b.contiguous();
    gemm(out, a2, b2, alpha, beta);
  }

  void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) override {
    SPMD_CHECK(out.dtype() == in.dtype() && is_floating(in.dtype()));
    const int device = index_of(out);
    set_device(device);
    const auto ud = static_cast<size_t>(d);
    Shape rows = in.shape();
    rows[ud] = 1;
    const char* name = log ? "log_softmax" : "softmax";
    const Indexer<2> ix = indexer_or_throw<2>(name, rows, {&out.strides(), &in.strides()});
    check_kernel(
        ck::softmax(elt(in.dtype()), out.data_ptr(), in.data_ptr(), ix, shape_numel(rows),
                    in.shape()[ud], out.strides()[ud], in.strides()[ud], log, stream(device)),
        name, device);
  }

  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    SPMD_CHECK(cond.dtype() == DType::Bool && a.dtype() == out.dtype() && b.dtype() == out.dtype());
    const int device = index_of(out);
    set_device(device);
    elementwise<4>({out, cond, a, b}, [&](const Indexer<4>& ix, const std::array<Tensor, 4>& t) {
      check_kernel(
          ck::where(elt(out.dtype()), t[0].data_ptr(), static_cast<const bool*>(t[1].data_ptr()),
                    t[2].data_ptr(), t[3].data_ptr(), ix, t[0].numel(), stream(device)),
          "where", device);
    });
  }

  bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
              int64_t limit) override {
    SPMD_CHECK(index.dtype() == DType::I64 && out.dtype() == in.dtype());
    SPMD_CHECK(index.shape() == out.shape() && in.dim() == out.dim());
    const int device = index_of(out);
    set_device(device);
    Strides base = in.strides();
    base[static_cast<size_t>(dim)] = 0;
    const Indexer<3> ix =
        indexer_or_throw<3>("gather", out.shape(), {&out.strides(), &index.strides(), &base});
    return with_flag(out, [&](unsigned int* bad) {
      check_kernel(
          ck::gather(elt(out.dtype()), out.data_ptr(),
                     static_cast<const int64_t*>(index.data_ptr()), in.data_ptr(), ix, out.numel(),
                     offset, limit, in.size(dim), in.stride(dim), bad, stream(device)),
          "gather", device);
    });
  }

  bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                   int64_t offset, int64_t limit) override {
    SPMD_CHECK(index.dtype() == DType::I64 && out.dtype() == src.dtype());
    SPMD_CHECK(index.shape() == src.shape() && out.dim() == src.dim());
    SPMD_CHECK(out.dtype() == DType::F32 || out.dtype() == DType::F64);
    const int device = index_of(out);
    set_device(device);
    Strides base = out.strides();
    base[static_cast<size_t>(dim)] = 0;
    const Indexer<3> ix =
        indexer_or_throw<3>("scatter_add", src.shape(), {&src.strides(), &index.strides(), &base});
    return with_flag(out, [&](unsigned int* bad) {
      check_kernel(ck::scatter_add(elt(out.dtype()), out.data_ptr(),
                                   static_cast<const int64_t*>(index.data_ptr()), src.data_ptr(),
                                   ix, src.numel(), offset, limit, out.size(dim), out.stride(dim),
                                   bad, stream(device)),
                   "scatter_add", device);
    });
  }

  bool equal(const Tensor& a, const Tensor& b) override {
    return compare(ck::Compare::Equal, a, b, 0, 0).flag == 0;
  }

  bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) override {
    return compare(ck::Compare::AllClose, a, b, rtol, atol).flag == 0;
  }

  double max_abs_diff(const Tensor& a, const Tensor& b) override {
    const ck::CompareResult r = compare(ck::Compare::MaxAbsDiff, a, b, 0, 0);
    if (r.flag != 0) return NAN;
    return cuda_math::bits_double(r.max_bits);
  }

  bool has_nonfinite(const Tensor& t) override {
    if (!is_floating(t.dtype())) return false;
    return compare(ck::Compare::HasNonfinite, t, t, 0, 0).flag != 0;
  }

 private:
  // Runs launch(flag) with a zeroed device flag and returns whether it stayed 0 (a sync point:
  // the index kernels report indices out of range through it).
  template <class Launch>
  static bool with_flag(const Tensor& like, Launch&& launch) {
    const int device = index_of(like);
    const Tensor flag =
        empty({static_cast<int64_t>(sizeof(unsigned int))}, DType::Bool, like.device());
    auto* bad = static_cast<unsigned int*>(flag.data_ptr());
    check(cudaMemsetAsync(bad, 0, sizeof(unsigned int), stream(device)), "cudaMemsetAsync", device);
    launch(bad);
    unsigned int host = 0;
    memcpy_async(&host, bad, sizeof host, cudaMemcpyDeviceToHost, device);
    synchronize(device);
    return host == 0;
  }

  // Runs one comparison kernel into a zeroed device result and copies the result back.
  static ck::CompareResult compare(ck::Compare what, const Tensor& a, const Tensor& b, double rtol,
                                   double atol) {
    ck::CompareResult host{};
    if (a.numel() == 0) return host;
    const int device = index_of(a);
    set_device(device);
    const Tensor result =
        empty({static_cast<int64_t>(sizeof(ck::CompareResult))}, DType::Bool, a.device());
    auto* r = static_cast<ck::CompareResult*>(result.data_ptr());
    check(cudaMemsetAsync(r, 0, sizeof(ck::CompareResult), stream(device)), "cudaMemsetAsync",
          device);
    elementwise<2>({a, b}, [&](const Indexer<2>& ix, const std::array<Tensor, 2>& t) {
      check_kernel(ck::compare(what, elt(a.dtype()), t[0].data_ptr(), t[1].data_ptr(), ix,
                               t[0].numel(), rtol, atol, r, stream(device)),
                   "compare", device);
    });
    memcpy_async(&host, r, sizeof host, cudaMemcpyDeviceToHost, device);
    synchronize(device);
    return host;
  }
};

}  // namespace

DeviceOps& device_ops() {
  static CudaOps ops;
  return ops;
}

}  // namespace spmd::gpu
