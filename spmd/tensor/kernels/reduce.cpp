// spmd/tensor/kernels/reduce.cpp: CPU reductions (sum, mean, amax, amin over dims) and softmax.
//
// A reduction walks the input in its own memory order with the output's strides zeroed along
// the reduced dims, accumulating into a buffer of the output's size: runs along a reduced dim
// fold into one accumulator, runs along a kept dim update a row of accumulators, so both
// `sum(x, {0})` and `sum(x, {1})` read memory sequentially. Floating sums accumulate in double
// (BF16/F16/F32 then round once), integer and Bool sums in wrapping 64-bit arithmetic.
//
// Note [Parallel reductions]
// A large reduction or softmax runs on parallel_for's threads (core/parallel.h), split into
// slices along one dim it keeps: for a reduction the first dim where the output has more than one
// element (so each slice of the output is contiguous: the dims before it have size 1), for softmax
// the first dim other than the softmax dim with more than one element. Each output element (each
// softmax row) is then computed by the same loop, in the same order, as on one thread, so the
// bits do not depend on the thread count (tests/tensor/ops_test.cpp,
// Reductions.SplitOverThreadsIsBitwiseTheSame, checks 1 thread against 4). Column sums (a bias
// gradient: a sum over the rows) split their columns, row sums their rows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <spmd/core/check.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/kernels/loops.h>

namespace spmd::cpu_kernels {
namespace {

// fn(out slice, in slice) over slices of dim p (Note [Parallel reductions]), or fn(out, in) once
// when p is -1 or the work is small.
template <class Fn>
void split_along(const Tensor& out, const Tensor& in, int64_t p, Fn&& fn) {
  const int64_t size = p < 0 ? 1 : in.size(p);
  if (size < 2 || in.numel() < 2 * kElementwiseGrain) {
    fn(out, in);
    return;
  }
  const int64_t per_slice = std::max<int64_t>(in.numel() / size, 1);
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / per_slice);
  parallel_for(size, grain, [&](int64_t first, int64_t last) {
    fn(out.narrow(p, first, last - first), in.narrow(p, first, last - first));
  });
}

// The first dim where `t` has more than one element and that is not `skip`, or -1.
int64_t first_wide_dim(const Tensor& t, int64_t skip = -1) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d != skip && t.size(d) > 1) return d;
  }
  return -1;
}

// The output's strides expanded to the input's rank, 0 along reduced dims.
Strides accumulator_strides(const Tensor& out, const std::vector<int64_t>& dims) {
  Strides strides = contiguous_strides(out.shape());
  for (int64_t d : dims) strides[static_cast<std::size_t>(d)] = 0;
  return strides;
}

template <class T>
void sum_typed(Reduction op, const Tensor& out, const Tensor& in,
               const std::vector<int64_t>& dims) {
  using Acc = std::conditional_t<std::is_integral_v<T>, uint64_t, double>;
  std::vector<Acc> acc(static_cast<std::size_t>(out.numel()), Acc{0});
  const Strides acc_strides = accumulator_strides(out, dims);
  StridedLoop<2> loop(in.shape(), {&acc_strides, &in.strides()}, /*order_by=*/1);
  const T* pi = at<T>(in);
  loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
    Acc* a = acc.data() + off[0];
    const T* x = pi + off[1];
    if (st[0] == 0) {
      // Independent lanes let the compiler vectorize without reassociating one sum.
      constexpr int kLanes = 8;
      Acc lanes[kLanes] = {};
      int64_t i = 0;
      if (st[1] == 1) {
        for (; i + kLanes <= n; i += kLanes) {
          for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<Acc>(load(x[i + l]));
        }
      }
      for (; i < n; ++i) lanes[0] += static_cast<Acc>(load(x[i * st[1]]));
      Acc total{0};
      for (Acc lane : lanes) total += lane;
      *a += total;
    } else {
      for (int64_t i = 0; i < n; ++i) a[i * st[0]] += static_cast<Acc>(load(x[i * st[1]]));
    }
  });
  const double count = out.numel() == 0 ? 0.0 : static_cast<double>(in.numel() / out.numel());
  dispatch_arithmetic(out.dtype(), "reduction", [&]<class O>() {
    O* po = at<O>(out);
    for (std::size_t i = 0; i < acc.size(); ++i) {
      if constexpr (std::is_integral_v<Acc>) {
        po[i] = convert_element<O>(static_cast<int64_t>(acc[i]));
      } else if (op == Reduction::Mean) {
        po[i] = convert_element<O>(acc[i] / count);
      } else {
        po[i] = convert_element<O>(acc[i]);
      }
    }
  });
}

template <class T>
void extremum_typed(Reduction op, const Tensor& out, const Tensor& in,
                    const std::vector<int64_t>& dims) {
  using C = compute_t<T>;
  const bool is_max = op == Reduction::Amax;
  C init;
  if constexpr (std::is_floating_point_v<C>) {
    init = is_max ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
  } else {
    init = is_max ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
  // Bytes stand in for bool (std::vector<bool> has no data()).
  using Acc = std::conditional_t<std::is_same_v<C, bool>, uint8_t, C>;
  std::vector<Acc> acc(static_cast<std::size_t>(out.numel()), static_cast<Acc>(init));
  const Strides acc_strides = accumulator_strides(out, dims);
  StridedLoop<2> loop(in.shape(), {&acc_strides, &in.strides()}, /*order_by=*/1);
  const T* pi = at<T>(in);
  // NaN wins: once the accumulator is NaN, nothing compares past it.
  auto better = [is_max](C v, C cur) {
    return v != v || (cur == cur && (is_max ? v > cur : v < cur));
  };
  loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
    Acc* a = acc.data() + off[0];
    const T* x = pi + off[1];
    for (int64_t i = 0; i < n; ++i) {
      const C v = load(x[i * st[1]]);
      Acc& cur = a[i * st[0]];
      if (better(v, static_cast<C>(cur))) cur = static_cast<Acc>(v);
    }
  });
  T* po = at<T>(out);
  for (std::size_t i = 0; i < acc.size(); ++i) po[i] = store<T>(static_cast<C>(acc[i]));
}

template <class T>
void softmax_typed(const Tensor& out, const Tensor& in, int64_t d, bool log) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto ud = static_cast<std::size_t>(d);
  const int64_t length = in.shape()[ud];
  const int64_t in_step = in.strides()[ud];
  const int64_t out_step = out.strides()[ud];
  Shape rows = in.shape();
  rows[ud] = 1;
  StridedLoop<2> loop(rows, {&out.strides(), &in.strides()});
  T* po = at<T>(out);
  const T* pi = at<T>(in);
  std::vector<C> buffer(static_cast<std::size_t>(length));
  // Rows computed in float (F32, BF16, F16) take the F32 row kernel, through a contiguous copy
  // where the row is strided or narrower, so the values do not depend on the layout (Note [F32
  // softmax] in tensor/kernels/elementwise.cpp).
  std::vector<float> row_in, row_out;
  if constexpr (std::is_same_v<C, float>) {
    if (!std::is_same_v<T, float> || in_step != 1 || out_step != 1) {
      row_in.resize(static_cast<std::size_t>(length));
      row_out.resize(static_cast<std::size_t>(length));
    }
  }
  loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
    for (int64_t r = 0; r < n; ++r) {
      const T* x = pi + off[1] + r * st[1];
      T* o = po + off[0] + r * st[0];
      if constexpr (std::is_same_v<C, float>) {
        if (row_in.empty()) {
          if constexpr (std::is_same_v<T, float>) softmax_row_f32(o, x, length, log, buffer.data());
        } else {
          for (int64_t i = 0; i < length; ++i) {
            row_in[static_cast<std::size_t>(i)] = static_cast<float>(load(x[i * in_step]));
          }
          softmax_row_f32(row_out.data(), row_in.data(), length, log, buffer.data());
          for (int64_t i = 0; i < length; ++i) {
            o[i * out_step] = convert_element<T>(row_out[static_cast<std::size_t>(i)]);
          }
        }
        continue;
      }
      C max = -std::numeric_limits<C>::infinity();
      for (int64_t i = 0; i < length; ++i) {
        const C v = static_cast<C>(load(x[i * in_step]));
        if (v > max || v != v) max = v;
        if (max != max) break;
      }
      // `buffer` keeps x - max for log-softmax and exp(x - max) for softmax.
      C total = 0;
      for (int64_t i = 0; i < length; ++i) {
        const C s = static_cast<C>(load(x[i * in_step])) - max;
        const C e = std::exp(s);
        buffer[static_cast<std::size_t>(i)] = log ? s : e;
        total += e;
      }
      const C scale = log ? -std::log(total) : C(1) / total;
      for (int64_t i = 0; i < length; ++i) {
        const C b = buffer[static_cast<std::size_t>(i)];
        o[i * out_step] = convert_element<T>(log ? b + scale : b * scale);
      }
    }
  });
}

}  // namespace

void reduce(Reduction op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims) {
  SPMD_CHECK(out.is_contiguous());
  SPMD_CHECK_EQ(out.dim(), in.dim());
  dispatch_arithmetic(in.dtype(), "reduction", [&]<class T>() {
    split_along(out, in, first_wide_dim(out), [&](const Tensor& o, const Tensor& i) {
      if (op == Reduction::Sum || op == Reduction::Mean) {
        sum_typed<T>(op, o, i, dims);
      } else {
        extremum_typed<T>(op, o, i, dims);
      }
    });
  });
}

void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) {
  SPMD_CHECK(out.dtype() == in.dtype() && is_floating(in.dtype()));
  dispatch_arithmetic(in.dtype(), "softmax", [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      split_along(out, in, first_wide_dim(in, d),
                  [&](const Tensor& o, const Tensor& i) { softmax_typed<T>(o, i, d, log); });
    }
  });
}

}  // namespace spmd::cpu_kernels
