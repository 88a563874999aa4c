// spmd/tensor/meta.cpp: the meta_tensors() switch and the shape-only error.
#include <spmd/tensor/meta.h>

#include <atomic>
#include <mutex>

#include <spmd/tensor/tensor.h>

namespace spmd {
namespace {
std::atomic<bool> g_meta_tensors{false};
thread_local int t_scope = -1;  // -1: no scope open on this thread
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
std::atomic<uint64_t> g_next_id{1};
std::atomic<int64_t> g_at_backward{-1};
thread_local int t_uncounted = 0;  // open MetaUncountedScopes on this thread
thread_local MetaStream t_stream = MetaStream::compute;
std::mutex g_listener_mutex;
std::atomic<MetaAllocationListener*> g_listener{nullptr};

void count_bytes(int64_t delta) {
  const int64_t live = g_live_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
}
}  // namespace

namespace detail {
static uint64_t counted(int64_t bytes) {
  const uint64_t id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  count_bytes(bytes);
  if (g_listener.load(std::memory_order_acquire) != nullptr) {
    std::lock_guard lock(g_listener_mutex);
    if (MetaAllocationListener* l = g_listener.load(std::memory_order_relaxed)) {
      l->allocated(id, bytes, t_stream);
    }
  }
  return id;
}

uint64_t meta_allocated(int64_t bytes) {
  return t_uncounted > 0 ? 0 : counted(bytes);
}

void note_backward_start() {
  int64_t none = -1;
  g_at_backward.compare_exchange_strong(none, g_live_bytes.load(std::memory_order_relaxed));
}

void meta_freed(uint64_t id, int64_t bytes) {
  count_bytes(-bytes);
  if (g_listener.load(std::memory_order_acquire) != nullptr) {
    std::lock_guard lock(g_listener_mutex);
    if (MetaAllocationListener* l = g_listener.load(std::memory_order_relaxed)) l->freed(id, bytes);
  }
}
}  // namespace detail

MetaAllocationListener* set_meta_allocation_listener(MetaAllocationListener* listener) {
  std::lock_guard lock(g_listener_mutex);
  return g_listener.exchange(listener, std::memory_order_acq_rel);
}

MetaUncountedScope::MetaUncountedScope() {
  ++t_uncounted;
}

MetaUncountedScope::~MetaUncountedScope() {
  --t_uncounted;
}

std::string_view meta_stream_name(MetaStream stream) {
  switch (stream) {
    case MetaStream::compute:
      return "compute";
    case MetaStream::reduce_scatter:
      return "reduce-scatter";
  }
  return "?";
}

MetaStream meta_stream() {
  return t_stream;
}

MetaStreamScope::MetaStreamScope(MetaStream stream) : saved_(t_stream) {
  t_stream = stream;
}

MetaStreamScope::~MetaStreamScope() {
  t_stream = saved_;
}

int64_t meta_live_bytes() {
  return g_live_bytes.load(std::memory_order_relaxed);
}

int64_t meta_peak_bytes() {
  return g_peak_bytes.load(std::memory_order_relaxed);
}

void reset_meta_peak_bytes() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  g_at_backward.store(-1, std::memory_order_relaxed);
}

int64_t meta_bytes_at_backward() {
  return g_at_backward.load(std::memory_order_relaxed);
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
