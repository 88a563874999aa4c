// spmd/backends/nccl/watchdog.cpp: the watchdog thread (Note [NCCL watchdog]) and the dump of the
// last collectives.
#include <spmd/backends/nccl/watchdog.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spmd/collectives/trace.h>
#include <spmd/core/call_site.h>
#include <spmd/core/format.h>
#include <spmd/tensor/cuda/device.h>

namespace spmd {
namespace {

// How often the thread looks; a failure is noticed within this of the deadline.
constexpr std::chrono::milliseconds kPollInterval{100};

}  // namespace

Watchdog::Watchdog(double timeout_s, std::timed_mutex& nccl_api,
                   std::function<void(const std::string&)> on_failure)
    : timeout_s_(timeout_s),
      nccl_api_(nccl_api),
      on_failure_(std::move(on_failure)),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  // Events are not destroyed: at process exit the CUDA runtime may already be gone, and a live
  // backend is destroyed once per process.
}

void Watchdog::add_comm(ncclComm_t comm, std::string name) {
  std::lock_guard lock(mutex_);
  comms_.emplace_back(comm, std::move(name));
}

void Watchdog::remove_comm(ncclComm_t comm) {
  std::lock_guard lock(mutex_);
  std::erase_if(comms_, [&](const auto& entry) { return entry.first == comm; });
}

std::vector<ncclComm_t> Watchdog::comms() const {
  std::lock_guard lock(mutex_);
  std::vector<ncclComm_t> out;
  for (const auto& entry : comms_) out.push_back(entry.first);
  return out;
}

cudaEvent_t Watchdog::take_event(int device) {
  {
    std::lock_guard lock(mutex_);
    std::vector<cudaEvent_t>& free = free_events_[device];
    if (!free.empty()) {
      cudaEvent_t event = free.back();
      free.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  gpu::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags",
             device);
  return event;
}

void Watchdog::track(int device, cudaStream_t stream, std::string what) {
  gpu::set_device(device);
  cudaEvent_t event = take_event(device);
  gpu::check(cudaEventRecord(event, stream), "cudaEventRecord", device);
  std::lock_guard lock(mutex_);
  pending_.push_back(Pending{device, event, Clock::now(), std::move(what)});
}

std::size_t Watchdog::pending() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

void Watchdog::set_quiet(bool quiet) {
  std::lock_guard lock(mutex_);
  quiet_ = quiet;
}

std::string Watchdog::check_once() {
  std::lock_guard lock(mutex_);
  // Completed operations leave in order; the oldest unfinished one decides the timeout.
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    // The event's own device: a thread that never set one would make device 0 current and give
    // this process a context there.
    (void)cudaSetDevice(p.device);
    const cudaError_t state = cudaEventQuery(p.event);
    if (state == cudaSuccess) {
      free_events_[p.device].push_back(p.event);
      pending_.pop_front();
      continue;
    }
    if (state != cudaErrorNotReady) {
      return fmt::format("{} failed on the GPU: cudaEventQuery: {} ({})", p.what,
                         cudaGetErrorString(state), cudaGetErrorName(state));
    }
    const double age = std::chrono::duration<double>(Clock::now() - p.start).count();
    if (age > timeout_s_) {
      return fmt::format(
          "{} has not completed after {:.0f} s (--spmd-timeout={}): a peer may have died, "
          "hung, or be waiting in a different collective",
          p.what, age, timeout_s_);
    }
    break;
  }
  if (quiet_) return {};
  std::unique_lock<std::timed_mutex> api(nccl_api_, std::try_to_lock);
  if (!api.owns_lock()) return {};  // the calling thread is in NCCL and polls errors itself
  for (const auto& [comm, name] : comms_) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) continue;
    if (state != ncclSuccess && state != ncclInProgress) {
      return fmt::format("{} reported an asynchronous error: {} (NCCL's last error: {})", name,
                         ncclGetErrorString(state), ncclGetLastError(comm));
    }
  }
  return {};
}

void Watchdog::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, kPollInterval, [this] { return stop_; });
      if (stop_) return;
    }
    const std::string failure = check_once();
    if (!failure.empty()) {
      on_failure_(failure);
      return;
    }
  }
}

void print_last_collectives(std::FILE* out, const std::vector<int>& ranks, std::size_t count) {
  const std::vector<TraceRecord> records = trace().records();
  for (int rank : ranks) {
    std::vector<const TraceRecord*> mine;
    for (const TraceRecord& r : records) {
      if (r.rank == rank) mine.push_back(&r);
    }
    const std::size_t first = mine.size() > count ? mine.size() - count : 0;
    fmt::print(out, "[rank {}] its last {} collective(s), oldest first{}:\n", rank,
               mine.size() - first, mine.empty() ? " (none recorded)" : "");
    for (std::size_t i = first; i < mine.size(); ++i) {
      const TraceRecord& r = *mine[i];
      fmt::print(out, "[rank {}]   #{} {} over '{}' {} [{}] {} group {} at {}{}\n", rank,
                 r.sequence, r.op, r.dim_name, r.detail, fmt::join(r.shape, ", "), r.dtype,
                 ranks_str(r.group_ranks), site_text(r.file, r.line),
                 r.end_us > 0 ? "" : "  <- not finished");
    }
  }
  std::fflush(out);
}

}  // namespace spmd
