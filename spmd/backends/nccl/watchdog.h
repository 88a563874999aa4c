// spmd/backends/nccl/watchdog.h: the nccl backend's guard against hangs and asynchronous errors,
// and the dump of this process's last collectives.
//
// Note [NCCL watchdog]
// A real run must never hang forever, yet a collective whose peer died or took another path
// spins on the GPU without end, and NCCL 2.28 has no per-operation timeout. Two guards:
//   - The calling thread never blocks in NCCL or CUDA on its own waits: communicators are
//     nonblocking (cfg.blocking = 0), so init, split and every collective return ncclInProgress
//     and are polled with ncclCommGetAsyncError, and results the host needs are awaited by
//     polling a CUDA event; each poll ends with a CommError at the deadline (the timeout) or at the
//     first NCCL error.
//   - The watchdog thread covers the waits it cannot see (a device -> host copy in user code
//     behind a collective that never finishes): it tracks an event recorded after every
//     collective and polls every live communicator's asynchronous error. When a tracked collective
//     is older than the timeout, or a communicator reports an error, it calls on_failure, which
//     prints the rank's last collectives, aborts every communicator (ncclCommAbort makes spinning
//     kernels exit) and ends the process with exit code 1, so spmdrun or mpirun stops the others.
// The timeout is --spmd-timeout=S (SPMD_TIMEOUT, default 300 s; --spmd-nccl-timeout is its older
// name).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spmd {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_failure(message)` runs on the watchdog thread, at most once. Communicators are polled only
  // while `nccl_api` is free (Note [NCCL API lock] in backends/nccl/state.h).
  Watchdog(double timeout_s, std::timed_mutex& nccl_api,
           std::function<void(const std::string&)> on_failure);
  // Stops and joins the thread; does not abort anything.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Live communicators, polled for asynchronous errors; remove one before destroying it.
  void add_comm(ncclComm_t comm, std::string name);
  void remove_comm(ncclComm_t comm);
  // The registered communicators (for aborting them all).
  std::vector<ncclComm_t> comms() const;

  // Records an event on `stream` (of `device`) after an operation just enqueued there, and
  // tracks it until it completes.
  void track(int device, cudaStream_t stream, std::string what);
  // Operations tracked and not yet seen complete.
  std::size_t pending() const;
  // While quiet (a failure is already being reported by the calling thread), asynchronous errors
  // are not reported again; timeouts still are.
  void set_quiet(bool quiet);

 private:
  struct Pending {
    int device;
    cudaEvent_t event;
    Clock::time_point start;
    std::string what;
  };
  void run();
  // One round of checks; a message when something failed.
  std::string check_once();
  cudaEvent_t take_event(int device);

  const double timeout_s_;
  std::timed_mutex& nccl_api_;
  std::function<void(const std::string&)> on_failure_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool quiet_ = false;
  std::deque<Pending> pending_;
  std::map<int, std::vector<cudaEvent_t>> free_events_;  // per device
  std::vector<std::pair<ncclComm_t, std::string>> comms_;
  std::thread thread_;
};

// Prints this process's last `count` collectives per rank it holds, oldest first, from the trace
// (collectives/trace.h; the flight recorder), each line starting with "[rank r]"; unfinished
// calls are marked. The debug module's flight-recorder dump replaces this once it lands.
void print_last_collectives(std::FILE* out, const std::vector<int>& ranks, std::size_t count);

}  // namespace spmd
