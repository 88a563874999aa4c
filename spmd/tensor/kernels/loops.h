// spmd/tensor/kernels/loops.h: the strided N-d walk every CPU kernel is built on.
//
// Internal to tensor/kernels. A StridedLoop walks one shape with N operands, each with its own
// element strides (0 for broadcast dims), in the memory order of one chosen operand. Dims of
// size 1 are dropped and neighbouring dims that are contiguous for every operand are merged, so
// contiguous same-shape operands become one run and kernels only ever see runs: `n` elements
// at per-operand element offsets, stepping by per-operand inner strides.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include <spmd/core/parallel.h>
#include <spmd/tensor/tensor.h>

namespace spmd::cpu_kernels {

// Positions per parallel chunk of an elementwise kernel; walks under twice this run inline.
// Measured with tensor_bench's BM_AddSizes, SPMD_NUM_THREADS=1 against 2 on two cores: a
// second thread saves ~20% on a 1M-float add and nothing yet at 256K.
inline constexpr int64_t kElementwiseGrain = int64_t{1} << 18;

// A function compiled for AVX-512, AVX2 and baseline x86-64, picked at load time (Note [Vector
// math clones] in tensor/kernels/elementwise.cpp).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define SPMD_MATH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPMD_MATH_CLONES
#endif

// The dims of a walk: up to kInline of them in place, so setting up a kernel allocates nothing
// for tensors of up to 8 dims; more go to the heap.
template <class T>
class DimVec {
 public:
  static constexpr std::size_t kInline = 8;
  DimVec() = default;
  explicit DimVec(std::size_t n) : size_(n) {
    if (n > kInline) heap_.assign(n, T{});
  }
  void push_back(T v) {
    if (size_ < kInline) {
      inline_[size_++] = v;
      return;
    }
    if (size_ == kInline) heap_.assign(inline_.begin(), inline_.end());
    heap_.push_back(v);
    ++size_;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return size_ > kInline ? heap_.data() : inline_.data(); }
  T* end() { return begin() + size_; }
  const T* begin() const { return size_ > kInline ? heap_.data() : inline_.data(); }
  const T* end() const { return begin() + size_; }
  T& operator[](std::size_t i) { return begin()[i]; }
  const T& operator[](std::size_t i) const { return begin()[i]; }
  T& back() { return begin()[size_ - 1]; }

 private:
  std::array<T, kInline> inline_{};
  std::vector<T> heap_;
  std::size_t size_ = 0;
};

template <std::size_t N>
class StridedLoop {
 public:
  using Offsets = std::array<int64_t, N>;

  // `order_by` picks the operand whose memory order the walk follows (largest stride
  // outermost); dims along which that operand does not move (stride 0) go outermost.
  StridedLoop(const Shape& shape, const std::array<const Strides*, N>& strides,
              std::size_t order_by = 0) {
    DimVec<std::size_t> dims;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) numel_ = 0;
      if (shape[d] != 1) dims.push_back(d);
    }
    const Strides& key = *strides[order_by];
    auto rank = [&](std::size_t d) { return key[d] == 0 ? INT64_MAX : key[d]; };
    // A stable insertion sort by rank, largest first (std::stable_sort would allocate a buffer).
    for (std::size_t i = 1; i < dims.size(); ++i) {
      const std::size_t d = dims[i];
      std::size_t j = i;
      for (; j > 0 && rank(dims[j - 1]) < rank(d); --j) dims[j] = dims[j - 1];
      dims[j] = d;
    }
    for (std::size_t d : dims) {
      bool merge = !sizes_.empty();
      for (std::size_t op = 0; op < N && merge; ++op) {
        merge = strides_[op].back() == (*strides[op])[d] * shape[d];
      }
      if (merge) {
        sizes_.back() *= shape[d];
        for (std::size_t op = 0; op < N; ++op) strides_[op].back() = (*strides[op])[d];
      } else {
        sizes_.push_back(shape[d]);
        for (std::size_t op = 0; op < N; ++op) strides_[op].push_back((*strides[op])[d]);
      }
    }
    if (numel_ != 0) {
      for (int64_t s : sizes_) numel_ *= s;
    }
  }

  int64_t numel() const { return numel_; }

  // Calls fn(offsets, inner_strides, n) for runs covering positions [begin, end) of the walk.
  template <class F>
  void for_each_run(int64_t begin, int64_t end, F&& fn) const {
    if (begin >= end) return;
    Offsets offsets{};
    Offsets inner{};
    const std::size_t nd = sizes_.size();
    if (nd == 0) {
      fn(offsets, inner, int64_t{1});
      return;
    }
    for (std::size_t op = 0; op < N; ++op) inner[op] = strides_[op][nd - 1];
    if (nd == 1) {  // the common case after merging: one run
      for (std::size_t op = 0; op < N; ++op) offsets[op] = begin * inner[op];
      fn(offsets, inner, end - begin);
      return;
    }
    DimVec<int64_t> index(nd);
    int64_t rest = begin;
    for (std::size_t d = nd; d-- > 0;) {
      index[d] = rest % sizes_[d];
      rest /= sizes_[d];
      for (std::size_t op = 0; op < N; ++op) offsets[op] += index[d] * strides_[op][d];
    }
    for (int64_t pos = begin; pos < end;) {
      const int64_t n = std::min(sizes_[nd - 1] - index[nd - 1], end - pos);
      fn(offsets, inner, n);
      pos += n;
      index[nd - 1] += n;
      for (std::size_t op = 0; op < N; ++op) offsets[op] += n * inner[op];
      for (std::size_t d = nd - 1; d > 0 && index[d] == sizes_[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
        for (std::size_t op = 0; op < N; ++op) {
          offsets[op] += strides_[op][d - 1] - sizes_[d] * strides_[op][d];
        }
      }
    }
  }

  // for_each_run over the whole walk, split across threads when it has at least 2 * grain
  // positions. Only for kernels whose runs write disjoint elements.
  template <class F>
  void parallel_runs(int64_t grain, F&& fn) const {
    if (numel_ < 2 * grain) {
      for_each_run(0, numel_, fn);
      return;
    }
    parallel_for(numel_, grain, [&](int64_t begin, int64_t end) { for_each_run(begin, end, fn); });
  }

 private:
  DimVec<int64_t> sizes_;
  std::array<DimVec<int64_t>, N> strides_;
  int64_t numel_ = 1;
};

// C++ types kernels compute in: BF16/F16 widen to float, everything else computes as itself.
template <class T>
using compute_t = std::conditional_t<is_narrow_float_v<T>, float, T>;

template <class T>
inline compute_t<T> load(T v) {
  return static_cast<compute_t<T>>(v);
}
template <class T>
inline T store(compute_t<T> v) {
  return static_cast<T>(v);
}

// Element pointer of t at element offset `offset` from its first element.
template <class T>
inline T* at(const Tensor& t, int64_t offset = 0) {
  return static_cast<T*>(t.data_ptr()) + offset;
}

}  // namespace spmd::cpu_kernels
