// spmd/backends/nccl/state.h: the nccl backend's process-wide state: the held ranks (device,
// stream, event, pinned buffer), the API lock, the nonblocking waits, the live communicators and
// their lifetimes, the watchdog, and the runtime a process-wide abort reaches.
//
// Internal to backends/nccl: backend.h only names NcclRuntime. Namespace spmd::nccl holds what
// the folder's files share beyond it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/backends/nccl/backend.h>
#include <spmd/backends/nccl/watchdog.h>
#include <spmd/core/error.h>

namespace spmd {
namespace nccl {

using ApiLock = std::lock_guard<std::timed_mutex>;  // Note [NCCL API lock]

// Collectives a failing rank prints (per held rank).
inline constexpr std::size_t kLastCollectives = 8;
// The longest ncclCommAbort may take before the process exits anyway.
inline constexpr std::chrono::seconds kAbortWait{10};

// Pinned host memory (cudaHostAlloc), so the fingerprint exchange's copies run asynchronously and
// the host polls instead of blocking inside CUDA.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);  // may fail at exit; nothing to do then
  }
  void* get(std::size_t bytes, int device);

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace nccl

// ---- the runtime --------------------------------------------------------------------------------

struct HeldRank {
  int rank = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;  // the calling thread's waits
  nccl::PinnedBuffer pinned;    // host side of the exchanges
};

// One communicator handle and the rank it serves, for waits and messages.
struct CommRef {
  ncclComm_t comm;
  int rank;
};

// The process's held ranks, their streams, the live communicators and the watchdog: one per
// NcclBackend, shared with its communicators.
class NcclRuntime {
 public:
  explicit NcclRuntime(const NcclConfig& config);

  std::vector<HeldRank> held;
  const int world_size;
  const double timeout_s;
  const bool fingerprint;
  const bool native_alltoall_gather_scatter;
  const std::vector<int> ranks;
  // Note [NCCL API lock]
  // NCCL's communicator state is not safe to touch from two threads at once, and that includes
  // ncclCommGetAsyncError: on a nonblocking communicator it also joins NCCL's launch thread and
  // frees its job. Every NCCL call of this process holds `api`; the watchdog only polls when it
  // gets the lock at once (the calling thread, when it holds the lock, polls itself), and an
  // abort takes it if it can within a few seconds and aborts regardless otherwise.
  std::timed_mutex api;
  std::unique_ptr<Watchdog> watchdog;
  std::atomic<bool> failed{false};     // an NCCL error or timeout was reported
  std::atomic<bool> reporting{false};  // someone is printing the failure and aborting
  std::atomic<bool> aborted{false};    // every communicator was aborted (freed)
  std::atomic<bool> shut_down{false};
  std::recursive_mutex lifecycle;  // communicator creation and destruction, shutdown
  std::vector<ncclComm_t> live;    // every communicator not yet destroyed, creation order

  // "rank 3" or "ranks 2,3": the held ranks, for messages.
  std::string label() const;

  // Throws CommError with `message` after noting that the backend failed (the watchdog then
  // stays quiet about communicator errors, which the caller reports).
  // E: CommError, or TimeoutError for a wait that reached the deadline.
  template <class E = CommError>
  [[noreturn]] void fail(const std::string& message) {
    failed = true;
    watchdog->set_quiet(true);
    throw_error<E>("{}", message);
  }

  // Throws CommError naming `what` when the backend failed, was aborted or was shut down.
  void check_usable(std::string_view what);

  // Accepts ncclSuccess and ncclInProgress (nonblocking communicators); fails otherwise.
  void check(ncclResult_t result, const char* call, int rank, ncclComm_t comm,
             const std::function<std::string()>& context);

  // Waits until no communicator of `comms` is ncclInProgress any more (nonblocking init, split,
  // finalize and enqueueing); fails at the first error or after timeout_s.
  void wait_ready(const std::vector<CommRef>& comms, const std::function<std::string()>& what);

  // Records each held rank's event on its stream and waits until all have completed, polling
  // `comms` for errors; fails at the first error or after timeout_s.
  void wait_streams(const std::vector<size_t>& slots, const std::vector<CommRef>& comms,
                    const std::function<std::string()>& what);

  // A new communicator, live until destroy_comm; the watchdog polls it as `name`.
  void add_comm(ncclComm_t comm, std::string name);

  // Finalizes and destroys `comm` (aborts it after a failure or when finalizing fails). Never
  // throws: called from destructors.
  void destroy_comm(ncclComm_t comm, int rank);

  // ncclCommAbort on every live communicator, on a helper thread the caller waits for at most
  // kAbortWait (an abort stuck on a dead peer must not keep the process alive).
  void abort_all();

  // The watchdog found a hang or an asynchronous error (Note [NCCL watchdog]).
  void on_watchdog_failure(const std::string& message);
};

namespace nccl {

// The runtime of this process's live backend, which nccl_abort_communicators aborts: set by
// NcclBackend's constructor, forgotten by its shutdown (only when it is still `runtime`).
void set_live_runtime(const std::shared_ptr<NcclRuntime>& runtime);
void forget_live_runtime(const std::shared_ptr<NcclRuntime>& runtime);
// Null when no backend is alive.
std::shared_ptr<NcclRuntime> live_runtime();

}  // namespace nccl
}  // namespace spmd
