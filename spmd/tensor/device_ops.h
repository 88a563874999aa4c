// spmd/tensor/device_ops.h: the kernel seam between tensor ops and the devices that run them.
//
// Every op of the op table (ops/ops.h: its meta validates the inputs and works out the result's
// shape and dtype), and Tensor's fill_, copy_, contiguous and to, allocate the result and then
// hand the arithmetic to the DeviceOps of the inputs' device, chosen by kernels_for(). The CPU
// kernels (tensor/kernels/) are always there; another device type plugs in at run time with
// register_device_ops (the NCCL backend will register CUDA). Kernels receive inputs already
// checked, broadcast and converted, so a device implements arithmetic, not policy:
//   - every tensor argument lies on the device the ops were registered for (copy excepted);
//   - inputs may have any strides, including 0 (broadcast) strides; outputs never overlap
//     themselves or an input;
//   - unless stated, all tensor arguments of one call share one dtype.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include <spmd/tensor/tensor.h>

namespace spmd {

enum class Reduction : uint8_t { Sum, Mean, Amax, Amin };

// "sum", "mean", "amax", "amin": the names errors use.
std::string_view op_name(Reduction op);

// The operands of a fused attention kernel (Note [Blocked attention] in
// tensor/kernels/attention.cpp): q [Bq, Sq, D], k [Bk, Sk, D] and v [Bk, Sk, Dv], contiguous, of
// one floating dtype; query item b attends to k/v item kv_of[b] (grouped-query attention maps
// several query heads to one kv head); `mask` undefined, or Bool or q's dtype with shape [...,
// Sq, Sk] (any strides, 0 too) whose leading dims hold Bq items in q's order (Bool: false hides
// the key; floating: added to the score). causal hides key j from query row i when
// j > row_offset + i (row_offset: the global index of row 0, for a piece of the rows).
struct AttentionKernelArgs {
  Tensor q, k, v, mask;
  std::vector<int64_t> kv_of;
  double scale = 1.0;
  bool causal = false;
  int64_t row_offset = 0;
};

// One step of AdamW on one parameter (op::adamw_step, Note [Fused AdamW] in ops/optim.cpp): the
// factors as the composed update uses them, each rounded to the compute type first (float for
// BF16/F16) as a scalar operand is.
struct AdamWKernelArgs {
  double beta1 = 0.9, one_minus_beta1 = 0.1;
  double beta2 = 0.999, one_minus_beta2 = 0.001;
  double inv_sqrt_correction = 1.0;  // 1 / sqrt(1 - beta2^t)
  double eps = 1e-8;
  double decay = 1.0;       // 1 - lr * weight_decay
  double step_size = 1e-3;  // lr / (1 - beta1^t)
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // Every element of `dst` = `value` converted to dst's dtype.
  virtual void fill(const Tensor& dst, double value) = 0;
  // dst = src elementwise, converting src's dtype to dst's (the two may differ). Same shape.
  // One of the two may be on the CPU: host <-> device copies are routed to the device's ops.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // out = a op b elementwise, `op` the index of the op's functor in element::BinaryOps
  // (tensor/element_ops.h), which is also the math: a and b have out's shape (broadcast already
  // applied as 0 strides) and one dtype the functor's domain accepts; out has that dtype too, or
  // Bool for a comparison (element::is_predicate).
  virtual void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // out = op(in) elementwise, `op` the index of the op's functor in element::UnaryOps; in has a
  // dtype the functor's domain accepts.
  virtual void unary(int op, const Tensor& out, const Tensor& in) = 0;
  // out = grad * df(in, result) for the op at index `op` of element::UnaryOps (its derivative);
  // every operand has out's shape and a floating dtype, out's.
  virtual void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                              const Tensor& result) = 0;
  // out = da(grad, a, b) (wrt 0) or db(grad, a, b) (wrt 1) for the op at index `op` of
  // element::BinaryOps; every operand has out's shape (broadcast as 0 strides) and floating dtype.
  virtual void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad,
                               const Tensor& a, const Tensor& b) = 0;
  // out has in's shape with every dim of `dims` (sorted, unique, non-empty unless in is 0-d) of
  // size 1. Sum: integer and Bool inputs accumulate into an I64 `out`; floating inputs into out of
  // the input dtype, accumulating in at least F32. Mean: floating only, sum / count. Amax/Amin:
  // same dtype, NaN propagates; never called with an empty reduction of a non-empty `out`.
  virtual void reduce(Reduction op, const Tensor& out, const Tensor& in,
                      const std::vector<int64_t>& dims) = 0;
  // out[i] = alpha * a[i] @ b[i] + beta * out[i] for out [B,n,m] (contiguous), a [B,n,k],
  // b [B,k,m]; beta == 0 ignores out's old values (NaN included). BF16/F16 accumulate in F32
  // and round once. Not called with Bool.
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
                      double beta) = 0;
  // Softmax (or log-softmax when `log`) of `in` along dim `d` into `out` (contiguous, same
  // shape); floating dtypes only, computed stably (max subtracted first).
  virtual void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) = 0;
  // out [Bq, Sq, Dv] (contiguous, q's dtype) = softmax(scale q k^T, masked) v without a
  // [Sq, Sk] buffer. Returns false where the device has no such kernel for the dtype: the caller
  // then composes attention from matmul and softmax.
  virtual bool attention(const Tensor& out, const AttentionKernelArgs& a) {
    (void)out, (void)a;
    return false;
  }
  // The gradients of that attention given the output's gradient `grad` ([Bq, Sq, Dv],
  // contiguous): dq [Bq, Sq, D], dk [Bk, Sk, D] and dv [Bk, Sk, Dv], each undefined when not
  // wanted, with contiguous rows (any row and item strides); dk and dv sum over the query items
  // of their kv item. Returns false as attention() does.
  virtual bool attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                  const Tensor& grad, const AttentionKernelArgs& a) {
    (void)dq, (void)dk, (void)dv, (void)grad, (void)a;
    return false;
  }

  // out [3, ...] (contiguous, p's dtype) = the parameter, first moment and second moment after one
  // AdamW step, given p, its gradient g and the moments m and v (contiguous, of p's shape and
  // dtype), rounded after each operation as the composed update's ops round (Note [Fused AdamW]
  // in ops/optim.cpp). Returns false where the device has no such kernel: the caller composes it.
  virtual bool adamw(const Tensor& out, const Tensor& p, const Tensor& g, const Tensor& m,
                     const Tensor& v, const AdamWKernelArgs& a) {
    (void)out, (void)p, (void)g, (void)m, (void)v, (void)a;
    return false;
  }

  // out = cond ? a : b elementwise: cond Bool, a and b of out's dtype, every operand of out's
  // shape (broadcast as 0 strides).
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  // Gather along `dim`: out[p] = in[p with dim replaced by index[p] - offset] where that lies in
  // [0, in.size(dim)), else 0 (the masked lookup of a vocabulary shard). `index` is I64 of out's
  // shape (any strides, 0 included); in has out's dtype and, on the other dims, at least out's
  // sizes. Returns false when some index lies outside [0, limit) (its position gets 0): the caller
  // reports it.
  virtual bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index,
                      int64_t offset, int64_t limit) = 0;
  // Scatter-add along `dim`: out[p with dim replaced by index[p] - offset] += src[p] for every
  // position p of src where that lies in [0, out.size(dim)); `index` is I64 of src's shape; out
  // (F32 or F64, src's dtype) has at least src's sizes on the other dims. Returns false when some
  // index lies outside [0, limit). The CPU adds in src's row-major order; the CUDA kernel adds
  // atomically (floating sums in another order).
  virtual bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                           int64_t offset, int64_t limit) = 0;

  // Comparisons of two tensors of one shape and dtype.
  virtual bool equal(const Tensor& a, const Tensor& b) = 0;
  // |a - b| <= atol + rtol * |b| everywhere; equal infinities are close, NaN is never close.
  virtual bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) = 0;
  // max |a - b|; 0 when empty, NaN when any element of either is NaN.
  virtual double max_abs_diff(const Tensor& a, const Tensor& b) = 0;
  virtual bool has_nonfinite(const Tensor& t) = 0;
};

// Installs the kernels for `type` (not CPU); nullptr uninstalls. The object must outlive its
// use. Tensors of a device type with no kernels can be allocated (given an allocator) but no op
// runs on them: each throws Unsupported("op: no kernels registered for device cuda:0").
void register_device_ops(DeviceType type, DeviceOps* ops);

// The built-in CPU kernels.
DeviceOps& cpu_ops();

// The kernels for `device`; Unsupported naming `op` and the device when none are registered.
DeviceOps& kernels_for(std::string_view op, Device device);
// The kernels for the device all `tensors` are on: Unsupported naming `op` and both devices
// when two differ, Error naming `op` when one is undefined (default-constructed).
DeviceOps& kernels_for(std::string_view op, std::initializer_list<const Tensor*> tensors);

}  // namespace spmd
