// spmd/tensor/kernels/elementwise.cpp: CPU fill, copy (with dtype conversion), binary and unary
// elementwise kernels, and the comparisons.
//
// Each kernel walks its operands with StridedLoop and special-cases the run shapes that matter
// for speed (all contiguous, one operand a broadcast scalar) so the compiler vectorizes them;
// any other strides take the generic loop. BF16/F16 compute in float and round once per element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <spmd/core/check.h>
#include <spmd/tensor/element_ops.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/kernels/loops.h>

namespace spmd::cpu_kernels {
namespace {

// ---- fill and copy --------------------------------------------------------------------------

template <class T>
void fill_typed(const Tensor& dst, T value) {
  StridedLoop<1> loop(dst.shape(), {&dst.strides()});
  T* base = at<T>(dst);
  loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
    T* p = base + off[0];
    if (st[0] == 1) {
      std::fill_n(p, n, value);
    } else {
      for (int64_t i = 0; i < n; ++i) p[i * st[0]] = value;
    }
  });
}

template <class D, class S>
void copy_typed(const Tensor& dst, const Tensor& src) {
  StridedLoop<2> loop(dst.shape(), {&dst.strides(), &src.strides()});
  D* out = at<D>(dst);
  const S* in = at<S>(src);
  loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
    D* o = out + off[0];
    const S* x = in + off[1];
    if (st[0] == 1 && st[1] == 1) {
      if constexpr (std::is_same_v<D, S>) {
        std::memcpy(o, x, static_cast<std::size_t>(n) * sizeof(D));
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = convert_element<D>(x[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = convert_element<D>(x[i * st[1]]);
    }
  });
}

// Note [Transposed copies]
// When source and destination step through memory along different ones of the last two dims
// (x.transpose(-1, -2).contiguous()), the plain walk strides across memory on one side for
// every element. Copying kTile x kTile tiles keeps the lines of both sides in cache. Small
// tiles: with power-of-two row lengths a tile's lines share one L1 set, and 8 fit its ways
// (tensor_bench BM_ContiguousOfTranspose, 4096^2 floats: 63 ms untiled, 35 ms with 8, 43 with
// 16, 70 with 64).
constexpr int64_t kTile = 8;

bool is_transposed_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dim() < 2 || dst.size(-2) < kTile || dst.size(-1) < kTile) return false;
  auto crosses = [](const Tensor& unit, const Tensor& other) {
    return unit.stride(-1) == 1 && other.stride(-2) == 1 && other.stride(-1) != 1;
  };
  return crosses(dst, src) || crosses(src, dst);
}

template <class D, class S>
void copy_tiled(const Tensor& dst, const Tensor& src) {
  const int64_t rows = dst.size(-2);
  const int64_t cols = dst.size(-1);
  const int64_t dr = dst.stride(-2);
  const int64_t dc = dst.stride(-1);
  const int64_t sr = src.stride(-2);
  const int64_t sc = src.stride(-1);
  Shape outer = dst.shape();
  outer[outer.size() - 2] = 1;
  outer.back() = 1;
  StridedLoop<2> loop(outer, {&dst.strides(), &src.strides()});
  D* out = at<D>(dst);
  const S* in = at<S>(src);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (kTile * cols));
  loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
    for (int64_t m = 0; m < n; ++m) {
      D* o = out + off[0] + m * st[0];
      const S* x = in + off[1] + m * st[1];
      parallel_for(row_tiles, grain, [&](int64_t first, int64_t last) {
        for (int64_t i0 = first * kTile; i0 < std::min(rows, last * kTile); i0 += kTile) {
          const int64_t i1 = std::min(i0 + kTile, rows);
          for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
            const int64_t j1 = std::min(j0 + kTile, cols);
            for (int64_t i = i0; i < i1; ++i) {
              for (int64_t j = j0; j < j1; ++j)
                o[i * dr + j * dc] = convert_element<D>(x[i * sr + j * sc]);
            }
          }
        }
      });
    }
  });
}

// ---- binary ---------------------------------------------------------------------------------

// The element a binary op stores: its own dtype's value, or a comparison's bool.
template <class T, class Op, class R>
inline auto emit(R r) {
  if constexpr (element::is_predicate<Op>) {
    return static_cast<bool>(r);
  } else {
    return store<T>(r);
  }
}

template <class T, class Op>
void binary_typed(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  using Out = std::conditional_t<element::is_predicate<Op>, bool, T>;
  StridedLoop<3> loop(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  Out* po = at<Out>(out);
  const T* pa = at<T>(a);
  const T* pb = at<T>(b);
  loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
    Out* __restrict o = po + off[0];
    const T* __restrict x = pa + off[1];
    const T* __restrict y = pb + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = emit<T, Op>(op(load(x[i]), load(y[i])));
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
      const auto yv = load(*y);
      for (int64_t i = 0; i < n; ++i) o[i] = emit<T, Op>(op(load(x[i]), yv));
    } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
      const auto xv = load(*x);
      for (int64_t i = 0; i < n; ++i) o[i] = emit<T, Op>(op(xv, load(y[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        o[i * st[0]] = emit<T, Op>(op(load(x[i * st[1]]), load(y[i * st[2]])));
      }
    }
  });
}

// ---- vector math clones ---------------------------------------------------------------------

// Note [Vector math clones]
// The package is compiled for baseline x86-64 (SSE2): no -march in what we ship. The few loops
// whose arithmetic, not memory, sets their speed (F32 tanh, GELU's tanh form forward and
// backward: math_tanh in double with no library call) are compiled three times, for AVX-512,
// AVX2 and the baseline, and the loader picks one for the CPU (SPMD_MATH_CLONES in
// tensor/kernels/loops.h: target_clones, as Philox's lanes in tensor/random.cpp). They compute the
// same IEEE operations in the same order as the scalar code, so the bits do not depend on the CPU
// or on which loop ran. The file is compiled with -ffp-contract=off (GCC's default for C++ would
// fuse multiply-adds in the AVX-512 clones) and -fno-trapping-math (without it GCC keeps the
// selects as branches and the loops scalar; it changes no value), in spmd/tensor/CMakeLists.txt.
// Off under ThreadSanitizer, whose runtime cannot take the ifunc resolver. (Softmax in float has
// its own exp in float lanes: Note [F32 softmax].)
SPMD_MATH_CLONES void tanh_f32_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = element::math_tanh(x[i]);
}

SPMD_MATH_CLONES void gelu_tanh_f32_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = element::GeluTanh{}(x[i]);
}

SPMD_MATH_CLONES void gelu_tanh_backward_f32_run(float* o, const float* g, const float* x,
                                                 int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] * element::GeluTanh::df(x[i], 0.0f);
}

// The contiguous F32 run of unary op Op through its clones, if it has them.
template <class T, class Op>
bool unary_run_cloned(T* o, const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, element::Tanh>) {
    tanh_f32_run(o, x, n);
    return true;
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, element::GeluTanh>) {
    gelu_tanh_f32_run(o, x, n);
    return true;
  }
  return false;
}

// The contiguous F32 run of op Op's derivative, o = g * Op::df(x), through its clones, if it has
// them.
template <class T, class Op>
bool derivative_run_cloned(T* o, const T* g, const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, element::GeluTanh>) {
    gelu_tanh_backward_f32_run(o, g, x, n);
    return true;
  }
  return false;
}

// ---- AdamW ----------------------------------------------------------------------------------

// The factors of an AdamW step in the compute type, in the order adamw_run reads them.
enum AdamWFactor { kBeta1, kOneMinusBeta1, kBeta2, kOneMinusBeta2, kInvSqrt, kEps, kDecay, kStep };

// Note [Fused AdamW] (ops/optim.cpp): the composed update's operations in its order, each result
// rounded to T (`round`: identity for F32 and F64), so the bits are the composed ops' bits.
template <class T>
void adamw_run(T* __restrict po, T* __restrict pm, T* __restrict pv, const T* p, const T* g,
               const T* m, const T* v, int64_t n, const compute_t<T>* k) {
  using C = compute_t<T>;
  auto round = [](C x) { return load(store<T>(x)); };
  for (int64_t i = 0; i < n; ++i) {
    const C gi = load(g[i]);
    const C m1 = round(round(load(m[i]) * k[kBeta1]) + round(gi * k[kOneMinusBeta1]));
    const C v1 = round(round(load(v[i]) * k[kBeta2]) + round(round(gi * gi) * k[kOneMinusBeta2]));
    const C denom = round(round(round(std::sqrt(v1)) * k[kInvSqrt]) + k[kEps]);
    const C value = round(load(p[i]) * k[kDecay]);
    po[i] = store<T>(value - round(round(m1 / denom) * k[kStep]));
    pm[i] = store<T>(m1);
    pv[i] = store<T>(v1);
  }
}

// F32 through the vector clones (sqrt and division vectorize and round as the scalar ones do).
SPMD_MATH_CLONES void adamw_f32_run(float* __restrict po, float* __restrict pm,
                                    float* __restrict pv, const float* p, const float* g,
                                    const float* m, const float* v, int64_t n, const float* k) {
  adamw_run<float>(po, pm, pv, p, g, m, v, n, k);
}

// ---- unary ----------------------------------------------------------------------------------

template <class T, class Op>
void unary_typed(const Tensor& out, const Tensor& in, Op op) {
  StridedLoop<2> loop(out.shape(), {&out.strides(), &in.strides()});
  T* po = at<T>(out);
  const T* pi = at<T>(in);
  loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
    T* __restrict o = po + off[0];
    const T* __restrict x = pi + off[1];
    if (st[0] == 1 && st[1] == 1) {
      if (unary_run_cloned<T, Op>(o, x, n)) return;
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(op(load(x[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = store<T>(op(load(x[i * st[1]])));
    }
  });
}

// ---- derivatives ----------------------------------------------------------------------------

// out = fn(o0, o1, o2) elementwise for three operands of out's shape (any strides).
// `run(o, a, b, c, n)` may take a contiguous run instead (true when it did).
template <class T, class Fn, class Run = bool (*)(T*, const T*, const T*, const T*, int64_t)>
void ternary_typed(
    const Tensor& out, const Tensor& x0, const Tensor& x1, const Tensor& x2, Fn fn,
    Run run = [](T*, const T*, const T*, const T*, int64_t) { return false; }) {
  StridedLoop<4> loop(out.shape(), {&out.strides(), &x0.strides(), &x1.strides(), &x2.strides()});
  T* po = at<T>(out);
  const T* p0 = at<T>(x0);
  const T* p1 = at<T>(x1);
  const T* p2 = at<T>(x2);
  loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
    T* o = po + off[0];
    const T* a = p0 + off[1];
    const T* b = p1 + off[2];
    const T* c = p2 + off[3];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
      if (run(o, a, b, c, n)) return;
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(fn(load(a[i]), load(b[i]), load(c[i])));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      o[i * st[0]] = store<T>(fn(load(a[i * st[1]]), load(b[i * st[2]]), load(c[i * st[3]])));
    }
  });
}

// ---- comparisons ----------------------------------------------------------------------------

// Calls fn(a_i, b_i) for every element pair, in order, until fn returns false.
template <class T, class F>
void each_pair(const Tensor& a, const Tensor& b, F&& fn) {
  StridedLoop<2> loop(a.shape(), {&a.strides(), &b.strides()});
  const T* pa = at<T>(a);
  const T* pb = at<T>(b);
  bool go = true;
  loop.for_each_run(0, loop.numel(), [&](const auto& off, const auto& st, int64_t n) {
    for (int64_t i = 0; i < n && go; ++i) go = fn(pa[off[0] + i * st[0]], pb[off[1] + i * st[1]]);
  });
}

template <class T>
double to_double(T v) {
  return convert_element<double>(v);
}

}  // namespace

// Note [F32 softmax]
// The softmax of a row computed in float (F32, and BF16/F16 rows widened to it; a strided row
// through a contiguous copy, so the values do not depend on the layout): its max (a NaN anywhere
// makes the row NaN), x - max, exp of that in float lanes (expf_nonpositive: within 1.22 ulp, no
// library call), the sum in eight interleaved partial sums added in a fixed order at the end
// (the same additions in every clone, so the bits do not depend on the CPU), then one multiply
// by the inverse sum (softmax) or one subtraction of its log (log_softmax). tensor_bench
// BM_SoftmaxRows ([4096, 1024] F32): 2.14 ms against 12.3 ms with glibc's expf per element and
// one running sum; F32, BF16 and F16 values moved by about an ulp (once, here). F64 keeps
// exp in double.
SPMD_MATH_CLONES void softmax_row_f32(float* o, const float* x, int64_t n, bool log,
                                      float* buffer) {
  float max = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    max = x[i] > max ? x[i] : max;
    nan = nan || x[i] != x[i];
  }
  if (nan) max = NAN;
  for (int64_t i = 0; i < n; ++i) buffer[i] = x[i] - max;
  float* e = log ? o : buffer;  // log_softmax keeps x - max in buffer, exp goes to o
  for (int64_t i = 0; i < n; ++i) e[i] = element::expf_nonpositive(buffer[i]);
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += e[i + j];
  }
  for (; i < n; ++i) part[i % 8] += e[i];
  const float total =
      ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  if (log) {
    const float shift = std::log(total);
    for (int64_t k = 0; k < n; ++k) o[k] = buffer[k] - shift;
  } else {
    const float scale = 1.0f / total;
    for (int64_t k = 0; k < n; ++k) o[k] = buffer[k] * scale;
  }
}

void fill(const Tensor& dst, double value) {
  dispatch_dtype(dst.dtype(), [&]<class T>() { fill_typed<T>(dst, convert_element<T>(value)); });
}

void copy(const Tensor& dst, const Tensor& src) {
  SPMD_CHECK(dst.shape() == src.shape());
  dispatch_dtype(dst.dtype(), [&]<class D>() {
    dispatch_dtype(src.dtype(), [&]<class S>() {
      if (is_transposed_copy(dst, src)) {
        copy_tiled<D, S>(dst, src);
      } else {
        copy_typed<D, S>(dst, src);
      }
    });
  });
}

void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) {
  SPMD_CHECK(a.dtype() == b.dtype());
  dispatch_arithmetic(a.dtype(), "elementwise binary", [&]<class T>() {
    using C = compute_t<T>;
    const bool known = element::visit<element::BinaryOps>(op, [&]<class F>() {
      SPMD_CHECK(out.dtype() == (element::is_predicate<F> ? DType::Bool : a.dtype()));
      if constexpr (element::accepts<F, C>) {
        binary_typed<T>(out, a, b, F{});
      } else {
        SPMD_CHECK_MSG(false, "{} on {} reached the CPU kernel", F::name, out.dtype());
      }
    });
    SPMD_CHECK_MSG(known, "binary elementwise op {} is not in element::BinaryOps", op);
  });
}

void unary(int op, const Tensor& out, const Tensor& in) {
  SPMD_CHECK(in.dtype() == out.dtype());
  dispatch_arithmetic(out.dtype(), "elementwise unary", [&]<class T>() {
    using C = compute_t<T>;
    const bool known = element::visit<element::UnaryOps>(op, [&]<class F>() {
      if constexpr (element::accepts<F, C>) {
        unary_typed<T>(out, in, F{});
      } else {
        SPMD_CHECK_MSG(false, "{} on {} reached the CPU kernel", F::name, out.dtype());
      }
    });
    SPMD_CHECK_MSG(known, "unary elementwise op {} is not in element::UnaryOps", op);
  });
}

void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                    const Tensor& result) {
  SPMD_CHECK(is_floating(out.dtype()));
  dispatch_arithmetic(out.dtype(), "elementwise backward", [&]<class T>() {
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const bool known = element::visit<element::UnaryOps>(op, [&]<class F>() {
        ternary_typed<T>(
            out, grad, in, result, [](C g, C x, C y) { return g * F::df(x, y); },
            [](T* o, const T* g, const T* x, const T*, int64_t n) {
              return derivative_run_cloned<T, F>(o, g, x, n);
            });
      });
      SPMD_CHECK_MSG(known, "unary elementwise op {} is not in element::UnaryOps", op);
    }
  });
}

void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad, const Tensor& a,
                     const Tensor& b) {
  SPMD_CHECK(is_floating(out.dtype()));
  dispatch_arithmetic(out.dtype(), "elementwise backward", [&]<class T>() {
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const bool known = element::visit<element::BinaryOps>(op, [&]<class F>() {
        if constexpr (element::is_predicate<F>) {
          SPMD_CHECK_MSG(false, "{} has no derivative", F::name);
        } else if (wrt == 0) {
          ternary_typed<T>(out, grad, a, b, [](C g, C x, C y) { return F::da(g, x, y); });
        } else {
          ternary_typed<T>(out, grad, a, b, [](C g, C x, C y) { return F::db(g, x, y); });
        }
      });
      SPMD_CHECK_MSG(known, "binary elementwise op {} is not in element::BinaryOps", op);
    }
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  SPMD_CHECK(cond.dtype() == DType::Bool && a.dtype() == out.dtype() && b.dtype() == out.dtype());
  dispatch_arithmetic(out.dtype(), "where", [&]<class T>() {
    StridedLoop<4> loop(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()});
    T* po = at<T>(out);
    const bool* pc = at<bool>(cond);
    const T* pa = at<T>(a);
    const T* pb = at<T>(b);
    loop.parallel_runs(kElementwiseGrain, [&](const auto& off, const auto& st, int64_t n) {
      T* o = po + off[0];
      const bool* c = pc + off[1];
      const T* x = pa + off[2];
      const T* y = pb + off[3];
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = c[i * st[1]] ? x[i * st[2]] : y[i * st[3]];
    });
  });
}

bool adamw(const Tensor& out, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
           const AdamWKernelArgs& a) {
  for (const Tensor* t : {&out, &p, &g, &m, &v}) SPMD_CHECK(t->is_contiguous());
  SPMD_CHECK(out.numel() == 3 * p.numel());
  bool done = false;
  dispatch_arithmetic(p.dtype(), "adamw", [&]<class T>() {
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      const C k[] = {static_cast<C>(a.beta1),
                     static_cast<C>(a.one_minus_beta1),
                     static_cast<C>(a.beta2),
                     static_cast<C>(a.one_minus_beta2),
                     static_cast<C>(a.inv_sqrt_correction),
                     static_cast<C>(a.eps),
                     static_cast<C>(a.decay),
                     static_cast<C>(a.step_size)};
      const int64_t n = p.numel();
      T* o = at<T>(out);
      parallel_for(n, kElementwiseGrain, [&](int64_t first, int64_t last) {
        const int64_t len = last - first;
        T* po = o + first;
        T* pm = o + n + first;
        T* pv = o + 2 * n + first;
        const T* x[] = {at<T>(p, first), at<T>(g, first), at<T>(m, first), at<T>(v, first)};
        if constexpr (std::is_same_v<T, float>) {
          adamw_f32_run(po, pm, pv, x[0], x[1], x[2], x[3], len, k);
        } else {
          adamw_run<T>(po, pm, pv, x[0], x[1], x[2], x[3], len, k);
        }
      });
      done = true;
    }
  });
  return done;
}

bool equal(const Tensor& a, const Tensor& b) {
  bool same = true;
  dispatch_dtype(a.dtype(),
                 [&]<class T>() { each_pair<T>(a, b, [&](T x, T y) { return same = (x == y); }); });
  return same;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  bool close = true;
  dispatch_dtype(a.dtype(), [&]<class T>() {
    each_pair<T>(a, b, [&](T x, T y) {
      const double u = to_double(x);
      const double v = to_double(y);
      // Infinities are close only to themselves; NaN to nothing.
      return close = (u == v || (std::isfinite(u) && std::isfinite(v) &&
                                 std::abs(u - v) <= atol + rtol * std::abs(v)));
    });
  });
  return close;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  dispatch_dtype(a.dtype(), [&]<class T>() {
    each_pair<T>(a, b, [&](T x, T y) {
      const double u = to_double(x);
      const double v = to_double(y);
      if (u != u || v != v) {
        worst = NAN;
        return false;
      }
      if (u != v) worst = std::max(worst, std::abs(u - v));
      return true;
    });
  });
  return worst;
}

bool has_nonfinite(const Tensor& t) {
  bool found = false;
  dispatch_dtype(t.dtype(), [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      each_pair<T>(t, t, [&](T x, T) { return !(found = !std::isfinite(to_double(x))); });
    }
  });
  return found;
}

}  // namespace spmd::cpu_kernels
