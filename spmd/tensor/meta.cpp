// spmd/tensor/meta.cpp: the meta_tensors() switch and the shape-only error.
#include <spmd/tensor/meta.h>

#include <atomic>

#include <spmd/tensor/tensor.h>

namespace spmd {
namespace {
std::atomic<bool> g_meta_tensors{false};
thread_local int t_scope = -1;  // -1: no scope open on this thread
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
}  // namespace

namespace detail {
void count_meta_bytes(int64_t delta) {
  const int64_t live = g_live_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
}
}  // namespace detail

int64_t meta_live_bytes() {
  return g_live_bytes.load(std::memory_order_relaxed);
}

int64_t meta_peak_bytes() {
  return g_peak_bytes.load(std::memory_order_relaxed);
}

void reset_meta_peak_bytes() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

bool meta_tensors() {
  if (t_scope >= 0) return t_scope != 0;
  return g_meta_tensors.load(std::memory_order_relaxed);
}

MetaTensorsScope::MetaTensorsScope(bool on) : saved_(t_scope) {
  t_scope = on ? 1 : 0;
}

MetaTensorsScope::~MetaTensorsScope() {
  t_scope = saved_;
}

void set_meta_tensors(bool on) {
  g_meta_tensors.store(on, std::memory_order_relaxed);
}

void throw_shape_only(std::string_view op, const Tensor& t) {
  throw_error<ShapeOnlyError>(
      "{}: the tensor (shape {}, {}) is shape-only (--spmd-tensors=meta) and has no values to "
      "read; a dry run can print shapes, not values (guard value reads with is_meta())",
      op, shape_str(t.shape()), t.dtype());
}

}  // namespace spmd
