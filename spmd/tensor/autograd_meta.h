// spmd/tensor/autograd_meta.h: what a Tensor carries for autograd, grad mode, and NoGradGuard.
//
// The tape and backward() live with the op table (ops/autograd.h, Note [Autograd]); a Tensor only
// holds its AutogradMeta (shared by the copies of the handle, like its storage): whether it is a
// leaf that wants a gradient, the gradient accumulated into it, and the tape node that made it.
// Grad mode is per thread (each rank thread of the threads backend has its own).
//
//   Tensor w = randn({4, 3}, 0).requires_grad_();
//   Tensor loss = sum(matmul(x, w));
//   backward(loss);                 // ops/autograd.h
//   Tensor dw = w.grad();
//   { NoGradGuard no_grad; w = w - 0.1 * w.grad(); }   // not recorded
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <spmd/tensor/tensor.h>

namespace spmd {

struct Node;          // ops/autograd.h
struct GradHookList;  // ops/autograd.h

struct AutogradMeta {
  virtual ~AutogradMeta() = default;
  // A leaf whose gradient backward() accumulates into `grad` (the LocalTensor and DTensor kinds
  // extend this with a gradient of their own type).
  bool requires_grad = false;
  Tensor grad;
  // The node of the op that made this tensor (null for leaves and untracked tensors).
  std::shared_ptr<Node> grad_fn;
  // A leaf's gradient hooks (register_hook, Note [Gradient hooks] in ops/autograd.h).
  std::shared_ptr<GradHookList> hooks;
};

// Whether ops on this thread are recorded for backward (default true).
bool grad_enabled();
void set_grad_enabled(bool enabled);

// Turns recording off on this thread for its lifetime (nestable).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// The Tensor methods that make new tensors from one input (views, copies, casts), for the tape.
enum class TensorMethod : uint8_t {
  Narrow,      // ints: d, start, length
  Select,      // ints: d, index
  Transpose,   // ints: a, b
  Permute,     // ints: the dims
  Reshape,     // ints: the shape (reshape and view)
  Unsqueeze,   // ints: d
  Squeeze,     // ints: d
  Expand,      // ints: the shape
  Contiguous,  // ints: none
  Clone,       // ints: none
  Cast,        // ints: the dtype
};

namespace detail {
// Records `result` = `method`(input) on the tape (installed by ops/autograd.cpp; called by the
// Tensor methods when the input takes part in autograd and grad mode is on). Returns the result
// with its tape node.
using MethodRecorder = Tensor (*)(TensorMethod method, const Tensor& input,
                                  std::span<const int64_t> ints, const Tensor& result);
void set_method_recorder(MethodRecorder recorder);
Tensor record_method(TensorMethod method, const Tensor& input, std::span<const int64_t> ints,
                     const Tensor& result);
}  // namespace detail

}  // namespace spmd
