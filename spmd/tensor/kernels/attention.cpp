// spmd/tensor/kernels/attention.cpp: attention on the CPU in blocks of keys, forward and
// backward, never holding the whole [Sq, Sk] scores.
//
// Note [Blocked attention]
// scaled_dot_product_attention on CPU tensors of F32 or F64 (ops/nn.cpp) runs here, as a flash
// attention kernel does on a GPU. The forward takes a block of kQueryBlock query rows of one item
// and walks the keys in blocks of kKeyBlock: the block's scores (one GEMM, scale folded in), the
// masks, then the online softmax: each row keeps its running max m, its running sum l of
// exp(s - m) and its output accumulator, which is rescaled by exp(m_old - m_new) when the max
// grows, and the block's exp(s - m) times v is added (a second GEMM). The output is the
// accumulator over l. A causal block stops at the last key its rows see. The backward
// (attention_backward) first runs the forward's pass again for the rows' logsumexp (m + log l)
// and their output, for delta = rowsum(g * out) (so attention saves only q, k and v, as the
// composed backward needs), then recomputes each tile's probabilities from the logsumexp and takes
//   dv += p^T g;  dp = g v^T;  ds = p (dp - delta);
//   dq += scale ds k;  dk += scale ds^T q,
// the query gradient over query blocks, the kv gradients over kv items (each one's query items
// in turn: the GQA sum has a fixed order and no two threads write one row). Memory beyond the
// inputs and outputs: a tile per thread and two floats per query row.
// - Work splits over (item, query block) forward, items for dq, kv items for dk and dv; the
//   split never changes a bit, since a row's arithmetic does not depend on which thread runs it.
// - Rows a mask hides entirely give NaN, as softmax over nothing does (the composed path's
//   result); a NaN score makes its row NaN. With no keys at all (Sk = 0) the output is 0, the
//   composed p v's empty sum.
// - exp runs on x - m <= 0: in float through expf_nonpositive's vector lanes (within 1.22 ulp,
//   Note [F32 softmax]) in a loop compiled per ISA (Note [Vector math clones]), in double through
//   std::exp. Results differ from the composed path (softmax, then a GEMM) in the last bits.
// - BF16/F16, and devices without the kernel (CUDA), take the composed path: attention() returns
//   false. The dry run keeps the composed backward (Note [Fused attention accounting] in
//   ops/ops.h), which is what it models.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <spmd/core/check.h>
#include <spmd/core/parallel.h>
#include <spmd/tensor/element_ops.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/kernels/loops.h>

namespace spmd::cpu_kernels {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;

// Row reductions in eight interleaved lanes, combined in a fixed order at the end, so that the
// loops vectorize (an in-order running max or sum does not) and the bits do not depend on the ISA
// (Note [Vector math clones]).
template <class T>
inline T lanes_max(const T* x, int64_t n) {
  constexpr T kHidden = -std::numeric_limits<T>::infinity();
  T part[8] = {kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kHidden};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int j = 0; j < 8; ++j) part[j] = x[c + j] > part[j] ? x[c + j] : part[j];
  }
  for (; c < n; ++c) part[0] = x[c] > part[0] ? x[c] : part[0];
  T m = kHidden;
  for (T p : part) m = p > m ? p : m;
  return m;
}

template <class T>
inline T lanes_sum(const T* x, int64_t n) {
  T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int j = 0; j < 8; ++j) part[j] += x[c + j];
  }
  for (; c < n; ++c) part[0] += x[c];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// The largest of x[0..n), NaN left out (a NaN score makes its own exp NaN).
SPMD_MATH_CLONES float row_max_f32(const float* x, int64_t n) {
  return lanes_max(x, n);
}

float row_max(const float* x, int64_t n) {
  return row_max_f32(x, n);
}

double row_max(const double* x, int64_t n) {
  return lanes_max(x, n);
}

// exp(x[c] - shift) into x for c < n (x[c] - shift <= 0, or NaN), returning their sum; hidden
// entries (-inf) give exactly 0.
SPMD_MATH_CLONES float exp_shifted_f32(float* x, int64_t n, float shift) {
  for (int64_t c = 0; c < n; ++c) {
    x[c] = x[c] == -INFINITY ? 0.0f : element::expf_nonpositive(x[c] - shift);
  }
  return lanes_sum(x, n);
}

double exp_shifted(double* x, int64_t n, double shift) {
  for (int64_t c = 0; c < n; ++c) x[c] = x[c] == -INFINITY ? 0.0 : std::exp(x[c] - shift);
  return lanes_sum(x, n);
}

float exp_shifted(float* x, int64_t n, float shift) {
  return exp_shifted_f32(x, n, shift);
}

// The problem in raw pointers.
template <class T>
struct Problem {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  int64_t items = 0, sq = 0, sk = 0, d = 0, dv = 0;
  T scale = 1;
  bool causal = false;
  int64_t row_offset = 0;
  const std::vector<int64_t>* kv_of = nullptr;
  const bool* bool_mask = nullptr;
  const T* float_mask = nullptr;
  int64_t mask_row = 0;  // the mask's strides along the rows and the keys
  int64_t mask_col = 0;
  std::vector<int64_t> mask_base;  // each item's [Sq, Sk] mask at this element offset

  const T* q_rows(int64_t b, int64_t i0) const { return q + (b * sq + i0) * d; }
  const T* k_rows(int64_t b, int64_t j0) const { return k + ((*kv_of)[b] * sk + j0) * d; }
  const T* v_rows(int64_t b, int64_t j0) const { return v + ((*kv_of)[b] * sk + j0) * dv; }
  // The keys rows [i0, i0 + rows) see: all of them, or up to the last row's diagonal.
  int64_t key_end(int64_t i0, int64_t rows) const {
    return causal ? std::clamp<int64_t>(row_offset + i0 + rows, 0, sk) : sk;
  }
};

template <class T>
Problem<T> problem_of(const AttentionKernelArgs& a) {
  Problem<T> p;
  p.q = at<T>(a.q);
  p.k = at<T>(a.k);
  p.v = at<T>(a.v);
  p.items = a.q.size(0);
  p.sq = a.q.size(1);
  p.sk = a.k.size(1);
  p.d = a.q.size(2);
  p.dv = a.v.size(2);
  p.scale = static_cast<T>(a.scale);
  p.causal = a.causal;
  p.row_offset = a.row_offset;
  p.kv_of = &a.kv_of;
  if (a.mask.defined()) {
    const Tensor& m = a.mask;
    const int64_t nd = m.dim();
    p.mask_row = m.stride(nd - 2);
    p.mask_col = m.stride(nd - 1);
    p.mask_base.resize(static_cast<size_t>(p.items));
    for (int64_t b = 0; b < p.items; ++b) {  // b unravelled over the mask's leading dims
      int64_t rest = b;
      int64_t offset = 0;
      for (int64_t dim = nd - 3; dim >= 0; --dim) {
        offset += (rest % m.size(dim)) * m.stride(dim);
        rest /= m.size(dim);
      }
      p.mask_base[static_cast<size_t>(b)] = offset;
    }
    if (m.dtype() == DType::Bool) {
      p.bool_mask = at<bool>(m);
    } else {
      p.float_mask = at<T>(m);
    }
  }
  return p;
}

// s[r * kKeyBlock + c] for rows [i0, i0 + rows) and keys [j0, j0 + cols) of item b: scale q k^T,
// then the causal mask or the given one (-inf where hidden; a floating mask added).
template <class T>
void score_tile(const Problem<T>& p, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                T* s) {
  gemm_on_thread(s, kKeyBlock, rows, cols, p.d, p.q_rows(b, i0), p.d, false, p.k_rows(b, j0), p.d,
                 true, p.scale, T(0));
  constexpr T kHidden = -std::numeric_limits<T>::infinity();
  if (p.causal) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t first_hidden = std::max<int64_t>(p.row_offset + i0 + r + 1 - j0, 0);
      for (int64_t c = first_hidden; c < cols; ++c) s[r * kKeyBlock + c] = kHidden;
    }
  }
  if (p.bool_mask == nullptr && p.float_mask == nullptr) return;
  const int64_t base = p.mask_base[static_cast<size_t>(b)];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = base + (i0 + r) * p.mask_row + j0 * p.mask_col;
    T* sr = s + r * kKeyBlock;
    if (p.bool_mask != nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        if (!p.bool_mask[row + c * p.mask_col]) sr[c] = kHidden;
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) sr[c] += p.float_mask[row + c * p.mask_col];
    }
  }
}

// Running softmax state of a block of rows.
template <class T>
struct RowState {
  std::vector<T> max, sum;
  explicit RowState(int64_t rows)
      : max(static_cast<size_t>(rows), -std::numeric_limits<T>::infinity()),
        sum(static_cast<size_t>(rows), T(0)) {}
};

// Folds the scores of one tile (rows x cols, row stride kKeyBlock) into the running state and
// turns them into exp(s - max) in place; `acc` (rows x width, may be null) is rescaled to the new
// maxima.
template <class T>
void online_softmax_step(RowState<T>& st, T* s, int64_t rows, int64_t cols, T* acc, int64_t width) {
  constexpr T kHidden = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* sr = s + r * kKeyBlock;
    const T block_max = row_max(sr, cols);
    T& m = st.max[static_cast<size_t>(r)];
    const T next = std::max(m, block_max);
    if (next == kHidden) {  // nothing seen yet in this row
      std::fill(sr, sr + cols, T(0));
      continue;
    }
    const T rescale = m == kHidden ? T(0) : static_cast<T>(std::exp(m - next));
    T& l = st.sum[static_cast<size_t>(r)];
    l = l * rescale + exp_shifted(sr, cols, next);
    if (acc != nullptr && rescale != T(1)) {
      T* ar = acc + r * width;
      for (int64_t c = 0; c < width; ++c) ar[c] *= rescale;
    }
    m = next;
  }
}

// Forward: rows [i0, i0 + rows) of item b into out_rows (rows x Dv, contiguous), and their
// logsumexp into lse_rows when given (-inf for a row with every key hidden).
template <class T>
void forward_block(const Problem<T>& p, int64_t b, int64_t i0, int64_t rows, T* out_rows,
                   T* lse_rows, std::vector<T>& tile) {
  RowState<T> st(rows);
  T* acc = out_rows;
  std::fill(acc, acc + rows * p.dv, T(0));
  const int64_t end = p.key_end(i0, rows);
  for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
    const int64_t cols = std::min(kKeyBlock, end - j0);
    score_tile(p, b, i0, rows, j0, cols, tile.data());
    online_softmax_step(st, tile.data(), rows, cols, acc, p.dv);
    gemm_on_thread(acc, p.dv, rows, p.dv, cols, tile.data(), kKeyBlock, false, p.v_rows(b, j0),
                   p.dv, false, T(1), T(1));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T l = st.sum[static_cast<size_t>(r)];  // 0 for a row with every key hidden: 0/0 = NaN
    T* ar = acc + r * p.dv;
    for (int64_t c = 0; c < p.dv; ++c) ar[c] = ar[c] / l;
    if (lse_rows != nullptr) {
      lse_rows[r] = st.max[static_cast<size_t>(r)] + static_cast<T>(std::log(l));
    }
  }
}

template <class T>
void forward(const Tensor& out, const AttentionKernelArgs& a) {
  const Problem<T> p = problem_of<T>(a);
  const int64_t blocks = (p.sq + kQueryBlock - 1) / kQueryBlock;
  T* o = at<T>(out);
  const int64_t work = p.sk * (p.d + p.dv) * std::min(p.sq, kQueryBlock);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(work, 1));
  parallel_for(p.items * blocks, grain, [&](int64_t first, int64_t last) {
    std::vector<T> tile(static_cast<size_t>(kQueryBlock * kKeyBlock));
    for (int64_t t = first; t < last; ++t) {
      const int64_t b = t / blocks;
      const int64_t i0 = (t % blocks) * kQueryBlock;
      forward_block(p, b, i0, std::min(kQueryBlock, p.sq - i0), o + (b * p.sq + i0) * p.dv,
                    static_cast<T*>(nullptr), tile);
    }
  });
}

// The logsumexp of every row of item b and delta = rowsum(grad * out), the output's rows made
// again (the forward's pass: attention keeps only q, k and v for its backward).
template <class T>
void row_stats(const Problem<T>& p, int64_t b, const T* grad, T* lse, T* delta,
               std::vector<T>& tile, std::vector<T>& out_rows) {
  for (int64_t i0 = 0; i0 < p.sq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, p.sq - i0);
    forward_block(p, b, i0, rows, out_rows.data(), lse + i0, tile);
    for (int64_t r = 0; r < rows; ++r) {
      const T* g = grad + (b * p.sq + i0 + r) * p.dv;
      const T* o = out_rows.data() + r * p.dv;
      T sum = 0;
      for (int64_t c = 0; c < p.dv; ++c) sum += g[c] * o[c];
      delta[i0 + r] = sum;
    }
  }
}

// The probabilities of a tile from the rows' logsumexp: exp(s - lse), 0 where hidden.
template <class T>
void probabilities(T* s, int64_t rows, int64_t cols, const T* lse) {
  for (int64_t r = 0; r < rows; ++r) exp_shifted(s + r * kKeyBlock, cols, lse[r]);
}

// ds = p (dp - delta) in place of dp, for a tile.
template <class T>
void score_gradient(T* dp, const T* prob, int64_t rows, int64_t cols, const T* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dr = dp + r * kKeyBlock;
    const T* pr = prob + r * kKeyBlock;
    for (int64_t c = 0; c < cols; ++c) dr[c] = pr[c] * (dr[c] - delta[r]);
  }
}

// Where a gradient goes: contiguous rows with row stride `ld` and item stride `item`.
template <class T>
struct Rows {
  T* data = nullptr;
  int64_t ld = 0;
  int64_t item = 0;
  T* at(int64_t b, int64_t i) const { return data + b * item + i * ld; }
};

template <class T>
Rows<T> rows_of(const Tensor& t) {
  if (!t.defined()) return {};
  return {cpu_kernels::at<T>(t), t.stride(1), t.stride(0)};
}

template <class T>
void backward(const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t, const Tensor& grad_t,
              const AttentionKernelArgs& a) {
  const Problem<T> p = problem_of<T>(a);
  const T* grad = at<T>(grad_t);
  const Rows<T> dq = rows_of<T>(dq_t);
  const Rows<T> dk = rows_of<T>(dk_t);
  const Rows<T> dv = rows_of<T>(dv_t);
  // Every row's logsumexp and delta first.
  std::vector<T> lse(static_cast<size_t>(p.items * p.sq));
  std::vector<T> delta(lse.size());
  const int64_t item_work = p.sq * p.sk * (p.d + 1);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(item_work, 1));
  parallel_for(p.items, grain, [&](int64_t first, int64_t last) {
    std::vector<T> tile(static_cast<size_t>(kQueryBlock * kKeyBlock));
    std::vector<T> out_rows(static_cast<size_t>(kQueryBlock * p.dv));
    for (int64_t b = first; b < last; ++b) {
      row_stats(p, b, grad, lse.data() + b * p.sq, delta.data() + b * p.sq, tile, out_rows);
    }
  });
  const bool kv = dk.data != nullptr || dv.data != nullptr;
  // dq: per item, query block after query block.
  if (dq.data != nullptr) {
    parallel_for(p.items, grain, [&](int64_t first, int64_t last) {
      std::vector<T> prob(static_cast<size_t>(kQueryBlock * kKeyBlock));
      std::vector<T> dp(prob.size());
      for (int64_t b = first; b < last; ++b) {
        for (int64_t i0 = 0; i0 < p.sq; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, p.sq - i0);
          T* dq_rows = dq.at(b, i0);
          for (int64_t r = 0; r < rows; ++r)
            std::fill(dq_rows + r * dq.ld, dq_rows + r * dq.ld + p.d, T(0));
          const int64_t end = p.key_end(i0, rows);
          const T* row_lse = lse.data() + b * p.sq + i0;
          for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
            const int64_t cols = std::min(kKeyBlock, end - j0);
            score_tile(p, b, i0, rows, j0, cols, prob.data());
            probabilities(prob.data(), rows, cols, row_lse);
            gemm_on_thread(dp.data(), kKeyBlock, rows, cols, p.dv, grad + (b * p.sq + i0) * p.dv,
                           p.dv, false, p.v_rows(b, j0), p.dv, true, T(1), T(0));
            score_gradient(dp.data(), prob.data(), rows, cols, delta.data() + b * p.sq + i0);
            gemm_on_thread(dq_rows, dq.ld, rows, p.d, cols, dp.data(), kKeyBlock, false,
                           p.k_rows(b, j0), p.d, false, p.scale, T(1));
          }
        }
      }
    });
  }
  if (!kv) return;
  // dk and dv: per kv item, key block after key block, over the query items that use it.
  const int64_t kv_items = a.k.size(0);
  std::vector<std::vector<int64_t>> users(static_cast<size_t>(kv_items));
  for (int64_t b = 0; b < p.items; ++b) users[static_cast<size_t>((*p.kv_of)[b])].push_back(b);
  const int64_t kv_grain =
      std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(item_work, 1));
  parallel_for(kv_items, kv_grain, [&](int64_t first, int64_t last) {
    std::vector<T> prob(static_cast<size_t>(kQueryBlock * kKeyBlock));
    std::vector<T> dp(prob.size());
    for (int64_t kb = first; kb < last; ++kb) {
      for (int64_t j0 = 0; j0 < p.sk; j0 += kKeyBlock) {
        const int64_t cols = std::min(kKeyBlock, p.sk - j0);
        T* dk_rows = dk.data != nullptr ? dk.at(kb, j0) : nullptr;
        T* dv_rows = dv.data != nullptr ? dv.at(kb, j0) : nullptr;
        for (int64_t c = 0; c < cols; ++c) {
          if (dk_rows != nullptr) std::fill(dk_rows + c * dk.ld, dk_rows + c * dk.ld + p.d, T(0));
          if (dv_rows != nullptr) std::fill(dv_rows + c * dv.ld, dv_rows + c * dv.ld + p.dv, T(0));
        }
        for (int64_t b : users[static_cast<size_t>(kb)]) {
          for (int64_t i0 = 0; i0 < p.sq; i0 += kQueryBlock) {
            const int64_t rows = std::min(kQueryBlock, p.sq - i0);
            if (p.key_end(i0, rows) <= j0) continue;  // every key of the block hidden (causal)
            const int64_t visible = std::min(cols, p.key_end(i0, rows) - j0);
            score_tile(p, b, i0, rows, j0, visible, prob.data());
            probabilities(prob.data(), rows, visible, lse.data() + b * p.sq + i0);
            const T* g = grad + (b * p.sq + i0) * p.dv;
            if (dv_rows != nullptr) {
              gemm_on_thread(dv_rows, dv.ld, visible, p.dv, rows, prob.data(), kKeyBlock, true, g,
                             p.dv, false, T(1), T(1));
            }
            if (dk_rows != nullptr) {
              gemm_on_thread(dp.data(), kKeyBlock, rows, visible, p.dv, g, p.dv, false,
                             p.v_rows(b, j0), p.dv, true, T(1), T(0));
              score_gradient(dp.data(), prob.data(), rows, visible, delta.data() + b * p.sq + i0);
              gemm_on_thread(dk_rows, dk.ld, visible, p.d, rows, dp.data(), kKeyBlock, true,
                             p.q_rows(b, i0), p.d, false, p.scale, T(1));
            }
          }
        }
      }
    }
  });
}

bool supported(const AttentionKernelArgs& a) {
  const DType t = a.q.dtype();
  return (t == DType::F32 || t == DType::F64) && a.k.dtype() == t && a.v.dtype() == t &&
         (!a.mask.defined() || a.mask.dtype() == DType::Bool || a.mask.dtype() == t);
}

void check_args(const AttentionKernelArgs& a) {
  SPMD_CHECK(a.q.dim() == 3 && a.k.dim() == 3 && a.v.dim() == 3);
  SPMD_CHECK(a.q.is_contiguous() && a.k.is_contiguous() && a.v.is_contiguous());
  SPMD_CHECK(a.q.size(2) == a.k.size(2) && a.k.size(1) == a.v.size(1) &&
             a.k.size(0) == a.v.size(0));
  SPMD_CHECK(static_cast<int64_t>(a.kv_of.size()) == a.q.size(0));
  for (int64_t kv : a.kv_of) SPMD_CHECK(kv >= 0 && kv < a.k.size(0));
}

}  // namespace

bool attention(const Tensor& out, const AttentionKernelArgs& a) {
  if (!supported(a)) return false;
  check_args(a);
  SPMD_CHECK(out.is_contiguous() && out.dtype() == a.q.dtype());
  if (out.numel() == 0) return true;
  if (a.k.size(1) == 0) {  // no keys: a sum over none, as the composed p v gives
    fill(out, 0.0);
    return true;
  }
  if (a.q.dtype() == DType::F32) {
    forward<float>(out, a);
  } else {
    forward<double>(out, a);
  }
  return true;
}

bool attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& grad,
                        const AttentionKernelArgs& a) {
  if (!supported(a)) return false;
  check_args(a);
  for (const Tensor* t : {&dq, &dk, &dv}) {
    SPMD_CHECK(!t->defined() || (t->dtype() == a.q.dtype() && t->dim() == 3 && t->stride(2) == 1));
  }
  SPMD_CHECK(grad.is_contiguous() && grad.dtype() == a.q.dtype());
  if (a.q.dtype() == DType::F32) {
    backward<float>(dq, dk, dv, grad, a);
  } else {
    backward<double>(dq, dk, dv, grad, a);
  }
  return true;
}

}  // namespace spmd::cpu_kernels
