// spmd/backends/nccl/state.cpp: the held ranks, the nonblocking waits, the communicators'
// lifetimes and the abort of them all.
#include <spmd/backends/nccl/state.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spmd/core/format.h>
#include <spmd/tensor/cuda/device.h>

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;
using nccl::ApiLock;
using nccl::kAbortWait;
using nccl::kLastCollectives;

// Spins briefly, then sleeps longer and longer: NCCL's launch thread usually finishes within
// tens of microseconds, a peer's arrival may take seconds.
class Backoff {
 public:
  void pause() {
    ++rounds_;
    if (rounds_ < 256) {
      std::this_thread::yield();
    } else if (rounds_ < 2048) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  int rounds_ = 0;
};

std::mutex g_live_mutex;
std::weak_ptr<NcclRuntime> g_live_runtime;

}  // namespace

namespace nccl {

void* PinnedBuffer::get(std::size_t bytes, int device) {
  if (bytes > size_) {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
    gpu::set_device(device);
    gpu::check(cudaHostAlloc(&data_, bytes, cudaHostAllocPortable), "cudaHostAlloc", device);
    size_ = bytes;
  }
  return data_;
}

void set_live_runtime(const std::shared_ptr<NcclRuntime>& runtime) {
  std::lock_guard lock(g_live_mutex);
  g_live_runtime = runtime;
}

void forget_live_runtime(const std::shared_ptr<NcclRuntime>& runtime) {
  std::lock_guard lock(g_live_mutex);
  if (g_live_runtime.lock() == runtime) g_live_runtime.reset();
}

std::shared_ptr<NcclRuntime> live_runtime() {
  std::lock_guard lock(g_live_mutex);
  return g_live_runtime.lock();
}

}  // namespace nccl

NcclRuntime::NcclRuntime(const NcclConfig& config)
    : held(config.ranks.size()),
      world_size(config.world_size),
      timeout_s(config.timeout_s),
      fingerprint(config.fingerprint),
      native_alltoall_gather_scatter(config.native_alltoall_gather_scatter),
      ranks(config.ranks) {
  install_cuda();
  for (size_t i = 0; i < held.size(); ++i) {
    HeldRank& h = held[i];
    h.rank = config.ranks[i];
    h.device = config.devices[i];
    set_cuda_device_rank(h.device, h.rank);
    h.stream = gpu::stream(h.device);
    gpu::set_device(h.device);
    gpu::check(cudaEventCreateWithFlags(&h.event, cudaEventDisableTiming),
               "cudaEventCreateWithFlags", h.device);
  }
  watchdog = std::make_unique<Watchdog>(
      timeout_s, api, [this](const std::string& message) { on_watchdog_failure(message); });
}

std::string NcclRuntime::label() const {
  return ranks_text(ranks);
}

void NcclRuntime::check_usable(std::string_view what) {
  if (aborted) throw_error<CommError>("{}: the nccl backend was aborted after a failure", what);
  if (failed) {
    throw_error<CommError>(
        "{}: the nccl backend failed earlier on {}; its communicators are "
        "unusable",
        what, label());
  }
  if (shut_down) throw_error<CommError>("{}: the nccl backend was shut down", what);
}

void NcclRuntime::check(ncclResult_t result, const char* call, int rank, ncclComm_t comm,
                        const std::function<std::string()>& context) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  fail(fmt::format("{} failed on rank {}: {}; NCCL's last error: {} ({})", call, rank,
                   ncclGetErrorString(result), ncclGetLastError(comm), context()));
}

void NcclRuntime::wait_ready(const std::vector<CommRef>& comms,
                             const std::function<std::string()>& what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff;
  for (;;) {
    bool pending = false;
    for (const CommRef& c : comms) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t result;
      {
        ApiLock lock(api);
        result = ncclCommGetAsyncError(c.comm, &state);
      }
      if (result != ncclSuccess) {
        fail(fmt::format("ncclCommGetAsyncError failed on rank {}: {} ({})", c.rank,
                         ncclGetErrorString(result), what()));
      }
      if (state == ncclInProgress) {
        pending = true;
      } else if (state != ncclSuccess) {
        fail(fmt::format("{} failed on rank {}: {}; NCCL's last error: {}", what(), c.rank,
                         ncclGetErrorString(state), ncclGetLastError(c.comm)));
      }
    }
    if (!pending) return;
    if (Clock::now() > deadline) {
      fail<TimeoutError>(
          fmt::format("{}: not complete after {} s on {} (--spmd-timeout={}): a peer may "
                      "have died, hung, or be waiting in a different collective",
                      what(), timeout_s, label(), timeout_s));
    }
    backoff.pause();
  }
}

void NcclRuntime::wait_streams(const std::vector<size_t>& slots, const std::vector<CommRef>& comms,
                               const std::function<std::string()>& what) {
  for (size_t slot : slots) {
    HeldRank& h = held[slot];
    gpu::set_device(h.device);
    gpu::check(cudaEventRecord(h.event, h.stream), "cudaEventRecord", h.device);
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff;
  for (size_t round = 0;; ++round) {
    bool pending = false;
    for (size_t slot : slots) {
      const cudaError_t state = cudaEventQuery(held[slot].event);
      if (state == cudaErrorNotReady) {
        pending = true;
      } else if (state != cudaSuccess) {
        fail(fmt::format("{} failed on rank {}: cudaEventQuery: {} ({})", what(), held[slot].rank,
                         cudaGetErrorString(state), cudaGetErrorName(state)));
      }
    }
    if (!pending) return;
    if (round % 64 == 63) {
      for (const CommRef& c : comms) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t result;
        {
          ApiLock lock(api);
          result = ncclCommGetAsyncError(c.comm, &state);
        }
        if (result == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
          fail(fmt::format("{} failed on rank {}: {}; NCCL's last error: {}", what(), c.rank,
                           ncclGetErrorString(state), ncclGetLastError(c.comm)));
        }
      }
    }
    if (Clock::now() > deadline) {
      fail<TimeoutError>(
          fmt::format("{}: not complete after {} s on {} (--spmd-timeout={}): a peer may "
                      "have died, hung, or be waiting in a different collective",
                      what(), timeout_s, label(), timeout_s));
    }
    backoff.pause();
  }
}

void NcclRuntime::add_comm(ncclComm_t comm, std::string name) {
  std::lock_guard lock(lifecycle);
  live.push_back(comm);
  watchdog->add_comm(comm, std::move(name));
}

void NcclRuntime::destroy_comm(ncclComm_t comm, int rank) {
  std::lock_guard lock(lifecycle);
  auto it = std::find(live.begin(), live.end(), comm);
  if (it == live.end() || aborted) return;  // already gone (shutdown, abort)
  live.erase(it);
  watchdog->remove_comm(comm);
  if (failed) {
    ApiLock lock(api);
    (void)ncclCommAbort(comm);
    return;
  }
  try {
    {
      ApiLock lock(api);
      check(ncclCommFinalize(comm), "ncclCommFinalize", rank, comm, [] { return "destroy"; });
    }
    wait_ready({CommRef{comm, rank}}, [] { return std::string("ncclCommFinalize"); });
    ApiLock lock(api);
    check(ncclCommDestroy(comm), "ncclCommDestroy", rank, comm, [] { return "destroy"; });
  } catch (const Error& e) {
    fmt::print(stderr, "[rank {}] warning: {}; aborting the communicator instead\n", rank,
               e.what());
    ApiLock lock(api);
    (void)ncclCommAbort(comm);
  }
}

void NcclRuntime::abort_all() {
  if (aborted.exchange(true)) return;
  // The watchdog's list, not `live`: the calling thread may hold `lifecycle` while stuck.
  const std::vector<ncclComm_t> comms = watchdog ? watchdog->comms() : std::vector<ncclComm_t>{};
  struct Done {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::unique_lock<std::timed_mutex> api_lock(api, std::defer_lock);
  (void)api_lock.try_lock_for(std::chrono::seconds(2));
  std::thread([comms, done] {
    for (ncclComm_t comm : comms) (void)ncclCommAbort(comm);
    std::lock_guard lock(done->mutex);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock lock(done->mutex);
  done->cv.wait_for(lock, kAbortWait, [&] { return done->done; });
}

void NcclRuntime::on_watchdog_failure(const std::string& message) {
  if (reporting.exchange(true)) return;  // the calling thread is already ending the process
  fmt::print(stderr, "[{}] CommError: nccl watchdog: {}\n", label(), message);
  print_last_collectives(stderr, ranks, kLastCollectives);
  abort_all();
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace spmd
