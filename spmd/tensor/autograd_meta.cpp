// spmd/tensor/autograd_meta.cpp: grad mode and the hook through which Tensor methods reach the
// tape.
#include <spmd/tensor/autograd_meta.h>

#include <atomic>

namespace spmd {
namespace {
thread_local bool t_grad_enabled = true;
std::atomic<detail::MethodRecorder> g_method_recorder{nullptr};
}  // namespace

bool grad_enabled() {
  return t_grad_enabled;
}

void set_grad_enabled(bool enabled) {
  t_grad_enabled = enabled;
}

namespace detail {

void set_method_recorder(MethodRecorder recorder) {
  g_method_recorder.store(recorder, std::memory_order_release);
}

Tensor record_method(TensorMethod method, const Tensor& input, std::span<const int64_t> ints,
                     const Tensor& result) {
  MethodRecorder recorder = g_method_recorder.load(std::memory_order_acquire);
  if (recorder == nullptr || !grad_enabled() || !input.requires_grad()) return result;
  return recorder(method, input, ints, result);
}

}  // namespace detail
}  // namespace spmd
