// spmd/tensor/kernels/matmul.cpp: CPU batched matmul on OpenBLAS (else Eigen).
//
// The only translation unit that includes Eigen and cblas.h. F32 and F64 pass each batch's
// matrices in place (row- or column-major as the strides say, so transposed operands are not
// copied) to OpenBLAS's sgemm/dgemm, or, without OpenBLAS (not built or not found at run time), map
// them with Eigen::Map and run Eigen's GEMM. BF16/F16 convert to F32, multiply, and round once.
// Integers use a plain loop with wrapping 64-bit accumulation.
//
// Note [Matmul on BLAS]
// OpenBLAS as Debian builds it (DYNAMIC_ARCH) picks its kernels for the CPU it runs on at load
// time: AVX-512 or AVX2 + FMA where present, SSE2 on any x86-64, NEON on arm64, so the package
// needs no -march. The parallelism is ours (Note [Parallel matmul]), so sim's per-rank math on a
// few cores does not start a BLAS thread team per rank: OpenBLAS must run on one thread. It reads
// OPENBLAS_NUM_THREADS once, when it loads, and starts its worker threads then (1 thread: none);
// openblas_set_num_threads(1) later leaves those threads alive. One idle worker is enough to cost
// every tiny op: a process with a second thread loses glibc's single-thread fast paths (malloc,
// shared_ptr counts: 7.4 against 20.0 ns per malloc/free + copy measured), and the worker spins
// ~0.1 s of CPU in sched_yield at start-up in every process. So the library is not linked: the
// first product loads it (dlopen) with OPENBLAS_NUM_THREADS=1 set for the load where the user has
// not set it, then unset again (like any setenv, this races with a getenv that another thread
// makes at that very moment), and looks up cblas_sgemm/dgemm. The file is the one CMake found
// (SPMD_OPENBLAS_PATH, the pthread variant's directory when Debian's layout has one), else
// libopenblas.so.0; the environment variable SPMD_OPENBLAS names another file instead (a newer
// OpenBLAS knows newer CPUs), or is `none` for Eigen. The pthread or OpenMP build is required
// (openblas_get_parallel() != 0): calls from several threads at once are safe there, while the
// serial build has no locks. A missing or serial library, or a dimension or leading dimension
// above INT_MAX (OpenBLAS's 32-bit interface), takes Eigen's GEMM. A library that cannot be
// used is said once on stderr (unless SPMD_OPENBLAS is `none`): Eigen's GEMM is several times
// slower here and rounds differently, so the run's F32/F64 digests are not OpenBLAS's.
//
// Note [OpenBLAS core type]
// OpenBLAS chooses its kernels by CPU family and model, and a CPU newer than the library falls
// back to the last set it knows for that vendor: Debian 12's 0.3.21 runs AMD's Zen 5 (family 1Ah,
// AVX-512 on full-width units) on its Haswell (AVX2) kernels, half the speed its SkylakeX
// (AVX-512) kernels reach there: sgemm 122 against 211 GFLOP/s on one core at [128, 256] x
// [256, 256], dgemm 55 against 96. Where the CPU has every AVX-512 subset the SkylakeX kernels use
// (F, CD, BW, DQ, VL), the load sets OPENBLAS_CORETYPE=SkylakeX, as OPENBLAS_NUM_THREADS above and
// only where the user has not set it: an Intel or AMD CPU that OpenBLAS knows gets that same
// GEMM kernel anyway (Cooper Lake's and Sapphire Rapids' sgemm/dgemm are SkylakeX's; newer
// OpenBLAS maps Zen 4 and 5 to them too). OPENBLAS_VERBOSE=2 prints the set loaded, and
// tensor_bench's BM_Matmul512Blas names it (the bench page quotes it). Results are the chosen
// kernel's: a different core type rounds products differently, so F32/F64 digests are those of the
// machine's OpenBLAS kernel, as they always were.
//
// Note [Parallel matmul]
// A large product runs on parallel_for's threads (core/parallel.h): its batch items, or, with one
// item, chunks of output rows. It runs inline where parallel_for does: inside another parallel_for
// (the sim backend's per-rank math, which already spreads ranks over the cores) or while a rank
// thread holds the pool (threads). The split never changes a bit of the result, so digests do not
// depend on the thread count or on timing: a batch item is always one GEMM call, and a single
// item's row chunks are a function of its shape alone (at least kChunkRows rows, a multiple of
// kRowAlign, at least kMinChunkWork multiply-adds, at most kMaxChunks), each one GEMM call,
// whether the chunks then run on one thread or many. (OpenBLAS's result for a row can depend on
// the rows around it in the same call: its small-matrix kernels and blocking follow the call's
// sizes; Eigen's path follows the row's position modulo its register block.)
// tests/tensor/linalg_test.cpp (Matmul.SplitOverThreadsIsBitwiseTheSame) checks it bit
// for bit.
#include <Eigen/Core>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <optional>
#include <type_traits>

#if SPMD_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>
#endif

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

// Note [Parallel matmul]: a single product's row chunks: at least kChunkRows rows (OpenBLAS
// keeps ~90% of its whole-matrix speed there), a multiple of kRowAlign rows (so that a
// power-of-two row count splits into equal chunks: 512 rows are 4 chunks, even on 2 or 4
// threads), at least kMinChunkWork multiply-adds, and at most kMaxChunks of them. Only a product
// of at least kMinSplitWork multiply-adds per batch item spreads its items.
constexpr int64_t kRowAlign = 64;
constexpr int64_t kChunkRows = 128;
constexpr int64_t kMaxChunks = 16;
constexpr int64_t kMinChunkWork = int64_t{1} << 21;
constexpr int64_t kMinSplitWork = int64_t{1} << 19;

// Rows per chunk of a single [n, k] x [k, m] product: a function of the shape alone.
int64_t chunk_rows(int64_t n, int64_t m, int64_t k) {
  const int64_t per_row = std::max<int64_t>(m * k, 1);
  int64_t rows = std::max(
      {kChunkRows, (kMinChunkWork + per_row - 1) / per_row, (n + kMaxChunks - 1) / kMaxChunks});
  return (rows + kRowAlign - 1) / kRowAlign * kRowAlign;
}

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <class M>
using ConstMap = Eigen::Map<const M, Eigen::Unaligned, Eigen::OuterStride<>>;

#if SPMD_HAVE_OPENBLAS
// The OpenBLAS entry points, loaded by the first product (Note [Matmul on BLAS]).
struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  decltype(&openblas_get_corename) core_name = nullptr;
};

// Note [OpenBLAS core type]: whether this CPU runs OpenBLAS's SkylakeX (AVX-512) kernels.
bool has_avx512_gemm() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// Note [Matmul on BLAS]: why F32/F64 products leave OpenBLAS for Eigen, said once on stderr.
void say_no_blas(const std::string& why) {
  fmt::print(stderr,
             "spmdsim: warning: {}; F32/F64 products run on Eigen's GEMM instead (several times "
             "slower, and rounded differently, so digests differ from a run on OpenBLAS). Install "
             "libopenblas0-pthread, or set SPMD_OPENBLAS to an OpenBLAS library file (none: use "
             "Eigen without this warning)\n",
             why);
}

// OpenBLAS loaded on one thread, or nullptr (none, or the serial build): Eigen then.
const Blas* load_blas() {
  const char* chosen = std::getenv("SPMD_OPENBLAS");
  if (chosen != nullptr && std::string_view(chosen) == "none") return nullptr;
  std::vector<std::string> files;
  if (chosen != nullptr && *chosen != '\0') {
    files = {chosen};
  } else {
    files = {SPMD_OPENBLAS_PATH, "libopenblas.so.0"};
  }
  const bool set_threads = std::getenv("OPENBLAS_NUM_THREADS") == nullptr;
  const bool set_core = std::getenv("OPENBLAS_CORETYPE") == nullptr && has_avx512_gemm();
  if (set_threads) setenv("OPENBLAS_NUM_THREADS", "1", 0);
  if (set_core) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  void* lib = nullptr;
  std::string errors, loaded;
  for (const std::string& file : files) {
    lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    loaded = file;
    if (lib != nullptr) break;
    const char* error = dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", error != nullptr ? error : file);
  }
  if (set_threads) unsetenv("OPENBLAS_NUM_THREADS");
  if (set_core) unsetenv("OPENBLAS_CORETYPE");
  if (lib == nullptr) {
    say_no_blas(fmt::format("OpenBLAS could not be loaded ({})", errors));
    return nullptr;
  }
  auto parallel =
      reinterpret_cast<decltype(&openblas_get_parallel)>(dlsym(lib, "openblas_get_parallel"));
  auto threads =
      reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(lib, "openblas_set_num_threads"));
  static Blas blas;
  blas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
  blas.dgemm = reinterpret_cast<decltype(&cblas_dgemm)>(dlsym(lib, "cblas_dgemm"));
  blas.core_name =
      reinterpret_cast<decltype(&openblas_get_corename)>(dlsym(lib, "openblas_get_corename"));
  if (parallel == nullptr || threads == nullptr || blas.sgemm == nullptr || blas.dgemm == nullptr) {
    say_no_blas(fmt::format(
        "{} lacks OpenBLAS's entry points (cblas_sgemm, cblas_dgemm, openblas_get_parallel, "
        "openblas_set_num_threads)",
        loaded));
    return nullptr;
  }
  if (parallel() == 0) {
    say_no_blas(fmt::format(
        "{} is OpenBLAS's serial build, which is not safe to call from several threads at once",
        loaded));
    return nullptr;
  }
  threads(1);  // where the user's OPENBLAS_NUM_THREADS started more
  return &blas;
}

const Blas* blas_library() {
  static const Blas* const blas = load_blas();
  return blas;
}

bool fits_blas(std::initializer_list<int64_t> sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [](int64_t v) { return v <= INT_MAX; });
}

#endif

// gemm_on_thread with Eigen: row-major c with leading dim ldc; a and b row-major, or transposed
// (stored row-major as [k, n] and [m, k]: column-major maps).
template <class T>
void gemm_eigen_strided(T* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const T* a, int64_t lda,
                        bool trans_a, const T* b, int64_t ldb, bool trans_b, T alpha, T beta) {
  using Out = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
  Out cm(c, n, m, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    cm.setZero();
  } else if (beta != T(1)) {
    cm *= beta;
  }
  auto with_b = [&](const auto& ma) {
    if (trans_b) {
      cm.noalias() += alpha * ma * ConstMap<ColMajor<T>>(b, k, m, Eigen::OuterStride<>(ldb));
    } else {
      cm.noalias() += alpha * ma * ConstMap<RowMajor<T>>(b, k, m, Eigen::OuterStride<>(ldb));
    }
  };
  if (trans_a) {
    with_b(ConstMap<ColMajor<T>>(a, n, k, Eigen::OuterStride<>(lda)));
  } else {
    with_b(ConstMap<RowMajor<T>>(a, n, k, Eigen::OuterStride<>(lda)));
  }
}

// One GEMM on the calling thread: each of matmul's batch items and row chunks (Note [Parallel
// matmul]), and gemm_on_thread for kernels that multiply tiles themselves.
template <class T>
void gemm_on_thread_impl(T* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const T* a,
                         int64_t lda, bool trans_a, const T* b, int64_t ldb, bool trans_b, T alpha,
                         T beta) {
  if (n == 0 || m == 0) return;
#if SPMD_HAVE_OPENBLAS
  const Blas* blas = k > 0 && fits_blas({n, m, k, lda, ldb, ldc}) ? blas_library() : nullptr;
  if (blas != nullptr) {
    const auto ta = trans_a ? CblasTrans : CblasNoTrans;
    const auto tb = trans_b ? CblasTrans : CblasNoTrans;
    const auto n32 = static_cast<int>(n);
    const auto m32 = static_cast<int>(m);
    const auto k32 = static_cast<int>(k);
    const auto lda32 = static_cast<int>(lda);
    const auto ldb32 = static_cast<int>(ldb);
    const auto ldc32 = static_cast<int>(ldc);
    if constexpr (std::is_same_v<T, float>) {
      blas->sgemm(CblasRowMajor, ta, tb, n32, m32, k32, alpha, a, lda32, b, ldb32, beta, c, ldc32);
    } else {
      blas->dgemm(CblasRowMajor, ta, tb, n32, m32, k32, alpha, a, lda32, b, ldb32, beta, c, ldc32);
    }
    return;
  }
#endif
  gemm_eigen_strided(c, ldc, n, m, k, a, lda, trans_a, b, ldb, trans_b, alpha, beta);
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
  // Rows [r0, r1) of batch item i: one GEMM call (OpenBLAS, else Eigen).
  auto product = [&](int64_t i, int64_t r0, int64_t r1) {
    const T* pa = at<T>(a, i * a.stride(0));
    const T* first = la->row_major ? pa + r0 * la->outer_stride : pa + r0;
    gemm_on_thread_impl(at<T>(out, i * n * m + r0 * m), m, r1 - r0, m, k, first, la->outer_stride,
                        !la->row_major, at<T>(b, i * b.stride(0)), lb->outer_stride, !lb->row_major,
                        ta, tb);
  };
  // Note [Parallel matmul]: batch items, each whole, at least kMinSplitWork multiply-adds a task.
  const int64_t item = n * m * k;
  if (batch > 1 && item >= kMinSplitWork / 4) {
    const int64_t grain = std::max<int64_t>(1, kMinSplitWork / std::max<int64_t>(item, 1));
    parallel_for(batch, grain, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) product(i, 0, n);
    });
    return;
  }
  // One item: row chunks fixed by the shape, each one GEMM call.
  const int64_t rows = chunk_rows(n, m, k);
  const int64_t chunks = (n + rows - 1) / rows;
  if (batch == 1 && chunks >= 2 && item >= 2 * kMinSplitWork) {
    parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
      for (int64_t j = first; j < last; ++j) product(0, j * rows, std::min(n, (j + 1) * rows));
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

void gemm_on_thread(float* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const float* a,
                    int64_t lda, bool trans_a, const float* b, int64_t ldb, bool trans_b,
                    float alpha, float beta) {
  gemm_on_thread_impl(c, ldc, n, m, k, a, lda, trans_a, b, ldb, trans_b, alpha, beta);
}

void gemm_on_thread(double* c, int64_t ldc, int64_t n, int64_t m, int64_t k, const double* a,
                    int64_t lda, bool trans_a, const double* b, int64_t ldb, bool trans_b,
                    double alpha, double beta) {
  gemm_on_thread_impl(c, ldc, n, m, k, a, lda, trans_a, b, ldb, trans_b, alpha, beta);
}

std::string matmul_library() {
#if SPMD_HAVE_OPENBLAS
  if (const Blas* blas = blas_library()) {
    const char* core = blas->core_name != nullptr ? blas->core_name() : nullptr;
    return std::string("OpenBLAS ") + (core != nullptr ? core : "(kernel set unknown)");
  }
#endif
  return "Eigen";
}

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
    case DType::F8E4M3FN:
    case DType::F8E5M2:
      throw_no_float8_kernel(out.dtype(), "matmul");
  }
  SPMD_CHECK_MSG(false, "matmul on bool reached the CPU kernel");
}

}  // namespace spmd::cpu_kernels
