// spmd/tensor/kernels/matmul.cpp: CPU batched matmul on Eigen.
//
// The only translation unit that includes Eigen. F32 and F64 map each batch's matrices in place
// (Eigen::Map with the view's strides, row- or column-major as the strides say, so transposed
// operands are not copied) and run Eigen's GEMM. BF16/F16 convert to F32, multiply, and round
// once. Integers use a plain loop with wrapping 64-bit accumulation.
//
// Note [Parallel matmul]
// A large product runs on parallel_for's threads (core/parallel.h): its batch items, or, with one
// item, blocks of output rows. It runs inline where parallel_for does: inside another parallel_for
// (the sim backend's per-rank math, which already spreads ranks over the cores) or while a rank
// thread holds the pool (threads). The split never changes a bit of the result, so digests do not
// depend on the thread count or on timing: each output element is the same dot product, summed
// over k in Eigen's k-blocks (their size depends on k and the cache sizes only) along the same
// micro-kernel path. Eigen picks that path by the row's position modulo its register block (at
// most 3 packets of 16 floats: 48 rows), so row blocks start at multiples of kRowAlign, and a
// product goes through GEMM both whole and split (at least kMinSplitCols columns: a matrix-vector
// product takes Eigen's GEMV, whose row peeling follows the pointer's alignment).
// tests/tensor/linalg_test.cpp (Matmul.SplitOverThreadsIsBitwiseTheSame) checks it bit for bit.
#include <Eigen/Core>
#include <algorithm>
#include <optional>
#include <type_traits>

#include <spmd/core/check.h>
#include <spmd/core/parallel.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/kernels/loops.h>

namespace spmd::cpu_kernels {
namespace {

// How one batch's [rows, cols] matrix of a 3-d operand sits in memory.
struct MatrixLayout {
  bool row_major = true;
  int64_t outer_stride = 0;
};

// The layout Eigen can map directly, if any: unit stride along one matrix dim and an outer
// stride that does not make rows (or columns) overlap.
std::optional<MatrixLayout> mappable(const Tensor& t) {
  const int64_t rows = t.size(1);
  const int64_t cols = t.size(2);
  if (rows == 0 || cols == 0) return MatrixLayout{true, std::max<int64_t>(cols, 1)};  // unread
  const int64_t rs = rows == 1 ? cols : t.stride(1);
  const int64_t cs = cols == 1 ? rows : t.stride(2);
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) return MatrixLayout{true, rs};
  if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) return MatrixLayout{false, cs};
  return std::nullopt;
}

// Note [Parallel matmul]: row blocks start at multiples of this (Eigen's largest register block,
// 3 AVX-512 packets of floats, divides it); products narrower than kMinSplitCols columns or with
// fewer than kMinSplitWork multiply-adds per chunk are not split.
constexpr int64_t kRowAlign = 48;
constexpr int64_t kMinSplitCols = 16;
constexpr int64_t kMinSplitWork = int64_t{1} << 19;

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <class M>
using ConstMap = Eigen::Map<const M, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T, class MapA, class MapB>
void gemm(T* out, int64_t n, int64_t m, const MapA& a, const MapB& b, T alpha, T beta) {
  Eigen::Map<RowMajor<T>> c(out, n, m);
  if (beta == T(0)) {
    c.setZero();
  } else if (beta != T(1)) {
    c *= beta;
  }
  if (alpha == T(1)) {
    c.noalias() += a * b;
  } else {
    c.noalias() += alpha * a * b;
  }
}

template <class T>
void matmul_eigen(const Tensor& out, Tensor a, Tensor b, double alpha, double beta) {
  std::optional<MatrixLayout> la = mappable(a);
  if (!la) {
    a = a.contiguous();
    la = mappable(a);
  }
  std::optional<MatrixLayout> lb = mappable(b);
  if (!lb) {
    b = b.contiguous();
    lb = mappable(b);
  }
  SPMD_CHECK(la && lb);
  const int64_t batch = out.size(0);
  const int64_t n = out.size(1);
  const int64_t m = out.size(2);
  const int64_t k = a.size(2);
  const T ta = static_cast<T>(alpha);
  const T tb = static_cast<T>(beta);
  // Rows [r0, r1) of batch item i.
  auto product = [&](int64_t i, int64_t r0, int64_t r1) {
    T* c = at<T>(out, i * n * m + r0 * m);
    const T* pa = at<T>(a, i * a.stride(0));
    const T* pb = at<T>(b, i * b.stride(0));
    const int64_t rows = r1 - r0;
    // Four layout combinations, each its own GEMM instantiation.
    auto with_b = [&](const auto& ma) {
      if (lb->row_major) {
        gemm(c, rows, m, ma,
             ConstMap<RowMajor<T>>(pb, k, m, Eigen::OuterStride<>(lb->outer_stride)), ta, tb);
      } else {
        gemm(c, rows, m, ma,
             ConstMap<ColMajor<T>>(pb, k, m, Eigen::OuterStride<>(lb->outer_stride)), ta, tb);
      }
    };
    if (la->row_major) {
      with_b(ConstMap<RowMajor<T>>(pa + r0 * la->outer_stride, rows, k,
                                   Eigen::OuterStride<>(la->outer_stride)));
    } else {
      with_b(ConstMap<ColMajor<T>>(pa + r0, rows, k, Eigen::OuterStride<>(la->outer_stride)));
    }
  };
  // Note [Parallel matmul]: batch items, else row blocks of kRowAlign rows, each chunk at least
  // kMinSplitWork multiply-adds.
  const int64_t item = n * m * k;
  if (batch > 1 && item >= kMinSplitWork / 4) {
    const int64_t grain = std::max<int64_t>(1, kMinSplitWork / std::max<int64_t>(item, 1));
    parallel_for(batch, grain, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) product(i, 0, n);
    });
    return;
  }
  // The last block takes the rows after the last multiple of kRowAlign: a block of a few rows
  // would take Eigen's GEMV or coefficient-wise path.
  const int64_t blocks = n / kRowAlign;
  if (batch == 1 && m >= kMinSplitCols && blocks >= 2 && item >= 2 * kMinSplitWork) {
    const int64_t per_block = kRowAlign * m * k;
    const int64_t grain = std::max<int64_t>(1, kMinSplitWork / per_block);
    parallel_for(blocks, grain, [&](int64_t first, int64_t last) {
      product(0, first * kRowAlign, last == blocks ? n : last * kRowAlign);
    });
    return;
  }
  for (int64_t i = 0; i < batch; ++i) product(i, 0, n);
}

template <class T>
void matmul_integer(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
                    double beta) {
  const int64_t batch = out.size(0);
  const int64_t n = out.size(1);
  const int64_t m = out.size(2);
  const int64_t k = a.size(2);
  const auto ta = static_cast<uint64_t>(convert_element<int64_t>(alpha));
  const auto tb = static_cast<uint64_t>(convert_element<int64_t>(beta));
  T* po = at<T>(out);
  const T* pa = at<T>(a);
  const T* pb = at<T>(b);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        uint64_t acc = 0;
        for (int64_t l = 0; l < k; ++l) {
          const T x = pa[bi * a.stride(0) + i * a.stride(1) + l * a.stride(2)];
          const T y = pb[bi * b.stride(0) + l * b.stride(1) + j * b.stride(2)];
          acc += static_cast<uint64_t>(static_cast<int64_t>(x)) *
                 static_cast<uint64_t>(static_cast<int64_t>(y));
        }
        T& o = po[(bi * n + i) * m + j];
        const uint64_t old = beta == 0 ? 0 : static_cast<uint64_t>(static_cast<int64_t>(o));
        o = static_cast<T>(static_cast<int64_t>(ta * acc + tb * old));
      }
    }
  }
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  SPMD_CHECK(out.is_contiguous() && out.dim() == 3 && a.dim() == 3 && b.dim() == 3);
  SPMD_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype());
  if (out.numel() == 0) return;
  switch (out.dtype()) {
    case DType::F32:
      return matmul_eigen<float>(out, a, b, alpha, beta);
    case DType::F64:
      return matmul_eigen<double>(out, a, b, alpha, beta);
    case DType::BF16:
    case DType::F16: {
      Tensor wide = beta == 0 ? empty(out.shape()) : out.to(DType::F32);
      matmul_eigen<float>(wide, a.to(DType::F32), b.to(DType::F32), alpha, beta);
      copy(out, wide);
      return;
    }
    case DType::I32:
      return matmul_integer<int32_t>(out, a, b, alpha, beta);
    case DType::I64:
      return matmul_integer<int64_t>(out, a, b, alpha, beta);
    case DType::Bool:
      break;
  }
  SPMD_CHECK_MSG(false, "matmul on bool reached the CPU kernel");
}

}  // namespace spmd::cpu_kernels
