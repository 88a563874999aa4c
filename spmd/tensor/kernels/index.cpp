// spmd/tensor/kernels/index.cpp: the CPU gather and scatter-add along one dim (the kernels of
// index_select, gather and embedding, and of their backward).
//
// Both walk the positions of the index with StridedLoop over three operands: the data side's
// strides with the indexed dim's stride set to 0 give the base offset of every position, and the
// index value (minus the offset of the rank's block) selects along that dim.
#include <atomic>

#include <spmd/core/check.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/kernels/loops.h>

namespace spmd::cpu_kernels {
namespace {

// `t`'s strides with dim d's set to 0: the base offset of a position, the index adding the rest.
Strides without_dim(const Tensor& t, int64_t d) {
  Strides s = t.strides();
  s[static_cast<size_t>(d)] = 0;
  return s;
}

}  // namespace

bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
            int64_t limit) {
  SPMD_CHECK(index.dtype() == DType::I64 && out.dtype() == in.dtype());
  SPMD_CHECK(index.shape() == out.shape() && in.dim() == out.dim());
  const Strides base = without_dim(in, dim);
  const int64_t step = in.stride(dim);
  const int64_t size = in.size(dim);
  std::atomic<bool> ok{true};
  dispatch_arithmetic(out.dtype(), "index kernel", [&]<class T>() {
    StridedLoop<3> loop(out.shape(), {&out.strides(), &index.strides(), &base});
    T* po = at<T>(out);
    const int64_t* pi = at<int64_t>(index);
    const T* px = at<T>(in);
    loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = pi[off[1] + i * st[1]];
        T& o = po[off[0] + i * st[0]];
        if (v < 0 || v >= limit) {
          ok.store(false, std::memory_order_relaxed);
          o = convert_element<T>(0.0);
          continue;
        }
        const int64_t j = v - offset;
        o = j >= 0 && j < size ? px[off[2] + i * st[2] + j * step] : convert_element<T>(0.0);
      }
    });
  });
  return ok.load();
}

bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                 int64_t offset, int64_t limit) {
  SPMD_CHECK(index.dtype() == DType::I64 && out.dtype() == src.dtype());
  SPMD_CHECK(index.shape() == src.shape() && out.dim() == src.dim());
  SPMD_CHECK(out.dtype() == DType::F32 || out.dtype() == DType::F64);
  const Strides base = without_dim(out, dim);
  const int64_t step = out.stride(dim);
  const int64_t size = out.size(dim);
  bool ok = true;
  dispatch_arithmetic(out.dtype(), "index kernel", [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      // In src's order, one thread: the sums are the same on every run and backend.
      StridedLoop<3> loop(src.shape(), {&src.strides(), &index.strides(), &base});
      T* po = at<T>(out);
      const int64_t* pi = at<int64_t>(index);
      const T* ps = at<T>(src);
      loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t v = pi[off[1] + i * st[1]];
          if (v < 0 || v >= limit) {
            ok = false;
            continue;
          }
          const int64_t j = v - offset;
          if (j >= 0 && j < size) po[off[2] + i * st[2] + j * step] += ps[off[0] + i * st[0]];
        }
      });
    }
  });
  return ok;
}

}  // namespace spmd::cpu_kernels
