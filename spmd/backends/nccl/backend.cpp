// spmd/backends/nccl/backend.cpp: the nccl backend's runtime (held ranks, nonblocking waits, the
// watchdog, communicator lifetimes) and its collectives.
#include <spmd/backends/nccl/backend.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>

#include <fmt/ranges.h>

#include <spmd/backends/nccl/watchdog.h>
#include <spmd/collectives/blocks.h>
#include <spmd/collectives/fingerprint.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/cuda/device.h>
#include <spmd/tensor/cuda/kernels.h>

namespace spmd {

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Avg) == 1 &&
                  static_cast<int>(ReduceOp::BXor) == 7,
              "tensor/cuda/reduce.cu switches on ReduceOp values");

namespace {

using Clock = std::chrono::steady_clock;
using ApiLock = std::lock_guard<std::timed_mutex>;  // Note [NCCL API lock]

// Collectives a failing rank prints (per held rank).
constexpr std::size_t kLastCollectives = 8;
// The longest ncclCommAbort may take before the process exits anyway.
constexpr std::chrono::seconds kAbortWait{10};

std::string ranks_label(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  return fmt::format("ranks {}", fmt::join(ranks, ","));
}

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
  void* get(std::size_t bytes, int device) {
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

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace

// ---- the runtime --------------------------------------------------------------------------------

struct HeldRank {
  int rank = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;  // the calling thread's waits
  PinnedBuffer pinned;          // host side of the exchanges
};

// One communicator handle and the rank it serves, for waits and messages.
struct CommRef {
  ncclComm_t comm;
  int rank;
};

class NcclRuntime {
 public:
  explicit NcclRuntime(const NcclConfig& config)
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

  std::string label() const { return ranks_label(ranks); }

  // Throws CommError with `message` after noting that the backend failed (the watchdog then
  // stays quiet about communicator errors, which the caller reports).
  // E: CommError, or TimeoutError for a wait that reached the deadline.
  template <class E = CommError>
  [[noreturn]] void fail(const std::string& message) {
    failed = true;
    watchdog->set_quiet(true);
    throw_error<E>("{}", message);
  }

  void check_usable(std::string_view what) {
    if (aborted) throw_error<CommError>("{}: the nccl backend was aborted after a failure", what);
    if (failed) {
      throw_error<CommError>(
          "{}: the nccl backend failed earlier on {}; its communicators are "
          "unusable",
          what, label());
    }
    if (shut_down) throw_error<CommError>("{}: the nccl backend was shut down", what);
  }

  // Accepts ncclSuccess and ncclInProgress (nonblocking communicators); fails otherwise.
  void check(ncclResult_t result, const char* call, int rank, ncclComm_t comm,
             const std::function<std::string()>& context) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail(fmt::format("{} failed on rank {}: {}; NCCL's last error: {} ({})", call, rank,
                     ncclGetErrorString(result), ncclGetLastError(comm), context()));
  }

  // Waits until no communicator of `comms` is ncclInProgress any more (nonblocking init, split,
  // finalize and enqueueing); fails at the first error or after timeout_s.
  void wait_ready(const std::vector<CommRef>& comms, const std::function<std::string()>& what) {
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

  // Records each held rank's event on its stream and waits until all have completed, polling
  // `comms` for errors; fails at the first error or after timeout_s.
  void wait_streams(const std::vector<size_t>& slots, const std::vector<CommRef>& comms,
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

  void add_comm(ncclComm_t comm, std::string name) {
    std::lock_guard lock(lifecycle);
    live.push_back(comm);
    watchdog->add_comm(comm, std::move(name));
  }

  // Finalizes and destroys `comm` (aborts it after a failure or when finalizing fails). Never
  // throws: called from destructors.
  void destroy_comm(ncclComm_t comm, int rank) {
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

  // ncclCommAbort on every live communicator, on a helper thread the caller waits for at most
  // kAbortWait (an abort stuck on a dead peer must not keep the process alive).
  void abort_all() {
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

  // The watchdog found a hang or an asynchronous error (Note [NCCL watchdog]).
  void on_watchdog_failure(const std::string& message) {
    if (reporting.exchange(true)) return;  // the calling thread is already ending the process
    fmt::print(stderr, "[{}] CommError: nccl watchdog: {}\n", label(), message);
    print_last_collectives(stderr, ranks, kLastCollectives);
    abort_all();
    std::fflush(nullptr);
    std::_Exit(1);
  }
};

namespace {

std::mutex g_live_mutex;
std::weak_ptr<NcclRuntime> g_live_runtime;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::Bool:
      return ncclUint8;
  }
  throw_error<InternalError>("nccl backend: unknown dtype");
}

static_assert(sizeof(bool) == 1, "Bool tensors travel as ncclUint8");

// How a reduction runs (Note [NCCL semantics]).
struct ReducePlan {
  enum Kind { Native, ParityOfSum, Gathered } kind = Native;
  ncclRedOp_t op = ncclSum;
};

ReducePlan plan_reduction(ReduceOp op, DType dtype) {
  if (dtype == DType::Bool) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        return {ReducePlan::Native, ncclMax};
      case ReduceOp::Product:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        return {ReducePlan::Native, ncclMin};
      case ReduceOp::BXor:
        return {ReducePlan::ParityOfSum, ncclSum};
      case ReduceOp::Avg:
        break;
    }
    // check_local rejects avg on bool before the backend runs.
    throw_error<InternalError>("nccl backend: op {} on bool", op);
  }
  switch (op) {
    case ReduceOp::Sum:
      return {ReducePlan::Native, ncclSum};
    case ReduceOp::Avg:
      return {ReducePlan::Native, ncclAvg};
    case ReduceOp::Product:
      return {ReducePlan::Native, ncclProd};
    case ReduceOp::Min:
      return {ReducePlan::Native, ncclMin};
    case ReduceOp::Max:
      return {ReducePlan::Native, ncclMax};
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if (is_integral(dtype)) return {ReducePlan::Gathered, ncclSum};
      break;
  }
  // check_local rejects bitwise ops on floating dtypes before the backend runs.
  throw_error<InternalError>("nccl backend: op {} on {}", op, dtype);
}

cuda_kernels::Elt elt(DType dtype) {
  return static_cast<cuda_kernels::Elt>(dtype);
}

char* byte_ptr(const Tensor& t, int64_t elements = 0) {
  return static_cast<char*>(t.data_ptr()) + elements * static_cast<int64_t>(t.itemsize());
}

// ---- one call -------------------------------------------------------------------------------

// One held rank's part of a call.
struct Part {
  size_t slot = 0;
  int rank = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  NcclCommunicator::Member* member = nullptr;
  Tensor input;            // contiguous, on the rank's device
  bool from_host = false;  // the shard was on the CPU: the result goes back there
  Tensor result;
};

struct Call {
  NcclRuntime* rt = nullptr;
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::string dim_name;
  std::vector<Part> parts;
  int n = 0;  // group size

  ncclComm_t comm(const Part& p) const { return p.member->comm; }
  int index(const Part& p) const { return p.member->index; }

  std::string describe(const Part& p) const {
    std::string text = describe_call(CollectiveCall{kind, dim_name, &p.member->members});
    if (parts.size() > 1) text += fmt::format(" on rank {}", p.rank);
    return text;
  }
  std::function<std::string()> context(const Part& p) const {
    return [this, &p] { return describe(p); };
  }
  std::vector<CommRef> comms() const {
    std::vector<CommRef> out;
    for (const Part& p : parts) out.push_back(CommRef{p.member->comm, p.rank});
    return out;
  }
  std::vector<size_t> slots() const {
    std::vector<size_t> out;
    for (const Part& p : parts) out.push_back(p.slot);
    return out;
  }
  std::function<std::string()> what() const {
    return [this] { return describe(parts.front()); };
  }

  void check(ncclResult_t result, const char* call, const Part& p) const {
    rt->check(result, call, p.rank, p.member->comm, context(p));
  }

  // Issues every part's NCCL calls (enqueue(part)) in one group and waits until NCCL has put
  // them on the streams.
  template <class Enqueue>
  void group(Enqueue&& enqueue) {
    {
      ApiLock lock(rt->api);
      rt->check(ncclGroupStart(), "ncclGroupStart", parts.front().rank, nullptr, what());
      try {
        for (Part& p : parts) {
          gpu::set_device(p.device);
          enqueue(p);
        }
      } catch (...) {
        (void)ncclGroupEnd();
        throw;
      }
      rt->check(ncclGroupEnd(), "ncclGroupEnd", parts.front().rank, nullptr, what());
    }
    rt->wait_ready(comms(), what());
  }

  // Device-to-device copy on the part's stream.
  void copy_bytes(const Part& p, void* dst, const void* src, int64_t bytes) const {
    if (bytes <= 0) return;
    gpu::set_device(p.device);
    gpu::check(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, p.stream),
        "cudaMemcpyAsync", p.device);
  }

  // Every part sends `bytes` (written by fill(part, buffer)) to its whole group; returns, per
  // part, the n contributions in group order (host memory valid until the next exchange).
  template <class Fill>
  std::vector<const char*> exchange(size_t bytes, Fill&& fill) {
    std::vector<Tensor> device(parts.size());
    std::vector<char*> host(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      Part& p = parts[i];
      host[i] = static_cast<char*>(rt->held[p.slot].pinned.get((n + 1) * bytes, p.device));
      fill(p, host[i]);
      device[i] = empty({static_cast<int64_t>((n + 1) * bytes)}, DType::Bool, cuda(p.device));
      gpu::set_device(p.device);
      gpu::check(
          cudaMemcpyAsync(device[i].data_ptr(), host[i], bytes, cudaMemcpyHostToDevice, p.stream),
          "cudaMemcpyAsync", p.device);
    }
    size_t i = 0;
    group([&](Part& p) {
      char* base = byte_ptr(device[i++]);
      check(ncclAllGather(base, base + bytes, bytes, ncclUint8, comm(p), p.stream), "ncclAllGather",
            p);
    });
    for (size_t k = 0; k < parts.size(); ++k) {
      Part& p = parts[k];
      gpu::set_device(p.device);
      gpu::check(cudaMemcpyAsync(host[k] + bytes, byte_ptr(device[k]) + bytes, n * bytes,
                                 cudaMemcpyDeviceToHost, p.stream),
                 "cudaMemcpyAsync", p.device);
    }
    rt->wait_streams(slots(), comms(), what());
    std::vector<const char*> out;
    for (char* h : host) out.push_back(h + bytes);
    return out;
  }

  // Every part's CollectiveFingerprint to its whole group, and the same check on every member
  // (Note [Collective fingerprint]), so all of them throw the same error instead of hanging.
  void exchange_fingerprints(const CollectiveOptions& options, const CallSite& site) {
    const bool fingerprint = rt->fingerprint;
    const std::vector<const char*> received =
        exchange(sizeof(CollectiveFingerprint), [&](Part& p, char* out) {
          FingerprintInput input{&options, &p.input, dim_name, &p.member->members};
          if (fingerprint) {
            input.with_site = true;
            input.sequence = p.member->calls++;
            input.location = site.location;
          }
          const CollectiveFingerprint mine = make_fingerprint(input);
          std::memcpy(out, &mine, sizeof mine);
        });
    for (size_t k = 0; k < parts.size(); ++k) {
      const std::vector<int>& members = parts[k].member->members;
      std::vector<CollectiveFingerprint> all(static_cast<size_t>(n));
      std::memcpy(all.data(), received[k], all.size() * sizeof(CollectiveFingerprint));
      check_fingerprints(CollectiveCall{kind, dim_name, &members}, all, members, fingerprint);
    }
  }

  // After the op: results to the host where the shard came from there; the watchdog tracks
  // every part's stream until the op completes.
  WorkPtr finish(const LocalTensor& x) {
    std::vector<Tensor> shards;
    shards.reserve(parts.size());
    for (Part& p : parts) {
      rt->watchdog->track(p.device, p.stream, describe(p));
      shards.push_back(p.from_host ? p.result.to(cpu()) : std::move(p.result));
    }
    return std::make_shared<CompletedWork>(LocalTensor(x, std::move(shards)));
  }
};

Call begin_call(NcclRuntime& rt, Communicator& comm, const LocalTensor& x,
                const CollectiveOptions& options, const CallSite& site) {
  const CollectiveKind kind = kind_of(options);
  auto* nccl_comm = dynamic_cast<NcclCommunicator*>(&comm);
  SPMD_CHECK(nccl_comm != nullptr);
  rt.check_usable(collective_name(kind));
  Call call;
  call.rt = &rt;
  call.kind = kind;
  call.dim_name = site.dim_name;
  if (x.ranks() != rt.ranks) {
    throw_error<CommError>(
        "{}: the nccl backend runs every rank this process holds ({}) in each collective, but the "
        "input holds ranks {}",
        kind, rt.ranks, x.ranks());
  }
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    const HeldRank& h = rt.held[slot];
    NcclCommunicator::Member& member = nccl_comm->members()[slot];
    if (member.comm == nullptr) {
      throw_error<CommError>("{}: rank {} is not in the mesh of dim '{}'", kind, h.rank,
                             site.dim_name);
    }
    Part p;
    p.slot = slot;
    p.rank = h.rank;
    p.device = h.device;
    p.stream = h.stream;
    p.member = &member;
    const Tensor& shard = x.shards()[slot];
    if (shard.device().is_cpu()) {
      p.input = shard.to(cuda(h.device));
      p.from_host = true;
    } else if (shard.device() != cuda(h.device)) {
      throw_error<CommError>("{}: rank {}'s shard is on {}, but rank {} runs on {}", kind, h.rank,
                             shard.device(), h.rank, cuda(h.device));
    } else {
      p.input = shard.contiguous();
    }
    call.parts.push_back(std::move(p));
  }
  call.n = static_cast<int>(call.parts.front().member->members.size());
  call.exchange_fingerprints(options, site);
  return call;
}

// The result tensor of part p: empty with `shape` on p's device.
Tensor device_empty(const Part& p, const Shape& shape, DType dtype) {
  return empty(shape, dtype, cuda(p.device));
}

void check_kernel(cudaError_t error, const char* kernel, const Part& p) {
  gpu::check(error, kernel, p.device);
}

}  // namespace

// ---- communicators ------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(GroupFamily family, CommOptions options,
                                   std::shared_ptr<NcclRuntime> runtime,
                                   std::vector<Member> members)
    : Communicator(std::move(family), std::move(options)),
      runtime_(std::move(runtime)),
      members_(std::move(members)) {}

NcclCommunicator::~NcclCommunicator() {
  for (size_t slot = 0; slot < members_.size(); ++slot) {
    if (members_[slot].comm != nullptr) {
      runtime_->destroy_comm(members_[slot].comm, runtime_->held[slot].rank);
    }
  }
}

// ---- the backend --------------------------------------------------------------------------------

NcclBackend::NcclBackend(const NcclConfig& config) {
  SPMD_CHECK(!config.ranks.empty() && config.ranks.size() == config.devices.size());
  runtime_ = std::make_shared<NcclRuntime>(config);
  NcclRuntime& rt = *runtime_;
  world_.assign(rt.held.size(), nullptr);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  auto what = [&] {
    return fmt::format("ncclCommInitRankConfig of the world communicator ({} ranks)",
                       config.world_size);
  };
  {
    ApiLock lock(rt.api);
    rt.check(ncclGroupStart(), "ncclGroupStart", rt.held[0].rank, nullptr, what);
    for (size_t slot = 0; slot < rt.held.size(); ++slot) {
      const HeldRank& h = rt.held[slot];
      gpu::set_device(h.device);
      const ncclResult_t result =
          ncclCommInitRankConfig(&world_[slot], config.world_size, config.id, h.rank, &cfg);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)ncclGroupEnd();
        rt.check(result, "ncclCommInitRankConfig", h.rank, nullptr, what);
      }
    }
    rt.check(ncclGroupEnd(), "ncclGroupEnd", rt.held[0].rank, nullptr, what);
  }
  std::vector<CommRef> refs;
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    refs.push_back(CommRef{world_[slot], rt.held[slot].rank});
  }
  try {
    rt.wait_ready(refs, [&] {
      return fmt::format("{}: were all {} ranks started, with one unique id?", what(),
                         config.world_size);
    });
  } catch (...) {
    ApiLock lock(rt.api);
    for (ncclComm_t comm : world_) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
    }
    world_.clear();
    throw;
  }
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    rt.add_comm(world_[slot], fmt::format("the world communicator of rank {}", rt.held[slot].rank));
  }
  std::lock_guard lock(g_live_mutex);
  g_live_runtime = runtime_;
}

NcclBackend::~NcclBackend() {
  shutdown();
}

Device NcclBackend::device_of(int rank) const {
  for (const HeldRank& h : runtime_->held) {
    if (h.rank == rank) return cuda(h.device);
  }
  throw_error<CommError>("nccl backend: rank {} is not held by this process ({})", rank,
                         runtime_->label());
}

const std::vector<int>& NcclBackend::ranks() const {
  return runtime_->ranks;
}

void NcclBackend::shutdown() {
  if (!runtime_) return;
  NcclRuntime& rt = *runtime_;
  {
    std::lock_guard lock(rt.lifecycle);
    if (rt.shut_down) return;
    // Newest first: children before the world communicators they were split from.
    const std::vector<ncclComm_t> live = rt.live;
    for (auto it = live.rbegin(); it != live.rend(); ++it) {
      int rank = rt.held.front().rank;
      for (size_t slot = 0; slot < world_.size(); ++slot) {
        if (world_[slot] == *it) rank = rt.held[slot].rank;
      }
      rt.destroy_comm(*it, rank);
    }
    rt.shut_down = true;
  }
  rt.watchdog.reset();
  std::lock_guard lock(g_live_mutex);
  if (g_live_runtime.lock() == runtime_) g_live_runtime.reset();
}

std::shared_ptr<Communicator> NcclBackend::make_communicator(const GroupFamily& family,
                                                             const CommOptions& options) {
  NcclRuntime& rt = *runtime_;
  std::lock_guard lock(rt.lifecycle);
  rt.check_usable("ncclCommSplit");
  const size_t held = rt.held.size();
  std::vector<NcclCommunicator::Member> members(held);
  std::vector<ncclComm_t> children(held, nullptr);
  std::vector<int> colors(held);
  std::vector<int> keys(held);
  for (size_t slot = 0; slot < held; ++slot) {
    if (auto where = family.locate(rt.held[slot].rank)) {
      colors[slot] = static_cast<int>(where->group);
      keys[slot] = static_cast<int>(where->index);
      members[slot].group = where->group;
      members[slot].index = static_cast<int>(where->index);
      members[slot].members = family.group(where->group);
    } else {
      colors[slot] = NCCL_SPLIT_NOCOLOR;
      keys[slot] = 0;
    }
  }
  auto what = [&] {
    return fmt::format("ncclCommSplit for the communicator of mesh dim '{}' ({} groups of {})",
                       family.dim_name(), family.num_groups(), family.group_size());
  };
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  {
    ApiLock lock(rt.api);
    rt.check(ncclGroupStart(), "ncclGroupStart", rt.held[0].rank, nullptr, what);
    for (size_t slot = 0; slot < held; ++slot) {
      gpu::set_device(rt.held[slot].device);
      const ncclResult_t result =
          ncclCommSplit(world_[slot], colors[slot], keys[slot], &children[slot], &cfg);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)ncclGroupEnd();
        rt.check(result, "ncclCommSplit", rt.held[slot].rank, world_[slot], what);
      }
    }
    rt.check(ncclGroupEnd(), "ncclGroupEnd", rt.held[0].rank, nullptr, what);
  }
  // A nonblocking split reports on the parent; the child handle appears when it is done.
  std::vector<CommRef> parents;
  for (size_t slot = 0; slot < held; ++slot) {
    parents.push_back(CommRef{world_[slot], rt.held[slot].rank});
  }
  rt.wait_ready(parents, what);
  std::vector<CommRef> made;
  for (size_t slot = 0; slot < held; ++slot) {
    const bool expected = colors[slot] != NCCL_SPLIT_NOCOLOR;
    if (expected != (children[slot] != nullptr)) {
      rt.fail(fmt::format("{}: rank {} got {} communicator", what(), rt.held[slot].rank,
                          expected ? "no" : "an unexpected"));
    }
    if (children[slot] != nullptr) made.push_back(CommRef{children[slot], rt.held[slot].rank});
  }
  rt.wait_ready(made, what);
  for (size_t slot = 0; slot < held; ++slot) {
    ncclComm_t child = children[slot];
    if (child == nullptr) continue;
    int count = -1;
    int user_rank = -1;
    {
      ApiLock lock(rt.api);
      rt.check(ncclCommCount(child, &count), "ncclCommCount", rt.held[slot].rank, child, what);
      rt.check(ncclCommUserRank(child, &user_rank), "ncclCommUserRank", rt.held[slot].rank, child,
               what);
    }
    SPMD_CHECK_EQ(count, family.group_size());
    SPMD_CHECK_EQ(user_rank, keys[slot]);
    members[slot].comm = child;
    rt.add_comm(child, fmt::format("the communicator of mesh dim '{}' on rank {} (group {})",
                                   family.dim_name(), rt.held[slot].rank, members[slot].members));
  }
  return std::make_shared<NcclCommunicator>(family, options, runtime_, std::move(members));
}

// ---- collectives: one run() per collective, reached by NcclBackend::issue's visit ------------

namespace {

WorkPtr run(Call& c, const LocalTensor& x, const AllReduceOptions& options) {
  const DType dtype = x.dtype();
  const ReducePlan plan = plan_reduction(options.op, dtype);
  for (Part& p : c.parts) p.result = device_empty(p, p.input.shape(), dtype);
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    if (plan.kind == ReducePlan::Gathered) {
      std::vector<Tensor> stacked;
      for (Part& p : c.parts) stacked.push_back(device_empty(p, {c.n, int64_t(count)}, dtype));
      size_t i = 0;
      c.group([&](Part& p) {
        c.check(ncclAllGather(p.input.data_ptr(), stacked[i++].data_ptr(), count, nccl_type(dtype),
                              c.comm(p), p.stream),
                "ncclAllGather", p);
      });
      for (size_t k = 0; k < c.parts.size(); ++k) {
        Part& p = c.parts[k];
        check_kernel(
            cuda_kernels::reduce_stacked(static_cast<int>(options.op), elt(dtype),
                                         stacked[k].data_ptr(), c.n, static_cast<int64_t>(count),
                                         p.result.data_ptr(), int64_t(count), p.stream),
            "reduce_stacked kernel", p);
      }
    } else {
      c.group([&](Part& p) {
        c.check(ncclAllReduce(p.input.data_ptr(), p.result.data_ptr(), count, nccl_type(dtype),
                              plan.op, c.comm(p), p.stream),
                "ncclAllReduce", p);
      });
      if (plan.kind == ReducePlan::ParityOfSum) {
        for (Part& p : c.parts) {
          check_kernel(cuda_kernels::keep_low_bit(static_cast<uint8_t*>(p.result.data_ptr()),
                                                  int64_t(count), p.stream),
                       "keep_low_bit kernel", p);
        }
      }
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const AllGatherOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.gather_dim, x.dim());
  std::vector<Tensor> buffers;
  for (Part& p : c.parts)
    buffers.push_back(device_empty(p, stacked_shape(c.n, p.input.shape()), dtype));
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    size_t i = 0;
    c.group([&](Part& p) {
      c.check(ncclAllGather(p.input.data_ptr(), buffers[i++].data_ptr(), count, nccl_type(dtype),
                            c.comm(p), p.stream),
              "ncclAllGather", p);
    });
  }
  for (size_t k = 0; k < c.parts.size(); ++k) c.parts[k].result = concat_blocks(buffers[k], d);
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const ReduceScatterOptions& options) {
  const DType dtype = x.dtype();
  const ReducePlan plan = plan_reduction(options.op, dtype);
  const int64_t d = wrap_dim(options.scatter_dim, x.dim());
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    Shape out_shape = p.input.shape();
    out_shape[static_cast<size_t>(d)] /= c.n;
    p.result = device_empty(p, out_shape, dtype);
    sends.push_back(pieces_stacked(p.input, d, c.n));
  }
  const size_t count = static_cast<size_t>(c.parts.front().result.numel());
  if (count > 0) {
    if (plan.kind == ReducePlan::Gathered) {
      // Every member's whole input, then this rank's piece of each reduced in group order.
      std::vector<Tensor> stacked;
      for (Part& p : c.parts) {
        stacked.push_back(device_empty(p, {c.n, c.n * int64_t(count)}, dtype));
      }
      size_t i = 0;
      c.group([&](Part& p) {
        c.check(ncclAllGather(sends[i].data_ptr(), stacked[i].data_ptr(), c.n * count,
                              nccl_type(dtype), c.comm(p), p.stream),
                "ncclAllGather", p);
        ++i;
      });
      for (size_t k = 0; k < c.parts.size(); ++k) {
        Part& p = c.parts[k];
        check_kernel(cuda_kernels::reduce_stacked(static_cast<int>(options.op), elt(dtype),
                                                  byte_ptr(stacked[k], c.index(p) * int64_t(count)),
                                                  c.n, c.n * int64_t(count), p.result.data_ptr(),
                                                  int64_t(count), p.stream),
                     "reduce_stacked kernel", p);
      }
    } else {
      size_t i = 0;
      c.group([&](Part& p) {
        c.check(ncclReduceScatter(sends[i++].data_ptr(), p.result.data_ptr(), count,
                                  nccl_type(dtype), plan.op, c.comm(p), p.stream),
                "ncclReduceScatter", p);
      });
      if (plan.kind == ReducePlan::ParityOfSum) {
        for (Part& p : c.parts) {
          check_kernel(cuda_kernels::keep_low_bit(static_cast<uint8_t*>(p.result.data_ptr()),
                                                  int64_t(count), p.stream),
                       "keep_low_bit kernel", p);
        }
      }
    }
  }
  return c.finish(x);
}

// sends[i]'s block j (of `count` elements) to group rank j, into block j' = source of recvs[i]:
// ncclAlltoAll, or grouped send/recv with the own block copied locally.
void all_to_all_blocks(Call& c, const std::vector<Tensor>& sends, const std::vector<Tensor>& recvs,
                       size_t count, DType dtype) {
  if (count == 0) return;
  const ncclDataType_t type = nccl_type(dtype);
  if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    size_t i = 0;
    c.group([&](Part& p) {
      c.check(
          ncclAlltoAll(sends[i].data_ptr(), recvs[i].data_ptr(), count, type, c.comm(p), p.stream),
          "ncclAlltoAll", p);
      ++i;
    });
    return;
#endif
  }
  const int64_t block = static_cast<int64_t>(count);
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const Part& p = c.parts[i];
    const int64_t me = c.index(p);
    c.copy_bytes(p, byte_ptr(recvs[i], me * block), byte_ptr(sends[i], me * block),
                 block * static_cast<int64_t>(recvs[i].itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    const int me = c.index(p);
    for (int r = 0; r < c.n; ++r) {
      if (r == me) continue;
      c.check(ncclSend(byte_ptr(sends[i], r * block), count, type, r, c.comm(p), p.stream),
              "ncclSend", p);
      c.check(ncclRecv(byte_ptr(recvs[i], r * block), count, type, r, c.comm(p), p.stream),
              "ncclRecv", p);
    }
    ++i;
  });
}

// Gathers every member's `inputs[i]` (count elements) into buffers[i] ([n, count]) on the group
// rank `root`; buffers of other ranks are not touched (may be undefined).
void gather_blocks(Call& c, const std::vector<Tensor>& inputs, const std::vector<Tensor>& buffers,
                   int root, size_t count, DType dtype) {
  if (count == 0) return;
  const ncclDataType_t type = nccl_type(dtype);
  if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    size_t i = 0;
    c.group([&](Part& p) {
      // Non-roots pass their input as the (unused) receive buffer: a valid device pointer.
      void* recv = c.index(p) == root ? buffers[i].data_ptr() : inputs[i].data_ptr();
      c.check(ncclGather(inputs[i].data_ptr(), recv, count, type, root, c.comm(p), p.stream),
              "ncclGather", p);
      ++i;
    });
    return;
#endif
  }
  const int64_t block = static_cast<int64_t>(count);
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const Part& p = c.parts[i];
    if (c.index(p) != root) continue;
    c.copy_bytes(p, byte_ptr(buffers[i], root * block), inputs[i].data_ptr(),
                 block * static_cast<int64_t>(inputs[i].itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    if (c.index(p) == root) {
      for (int r = 0; r < c.n; ++r) {
        if (r == root) continue;
        c.check(ncclRecv(byte_ptr(buffers[i], r * block), count, type, r, c.comm(p), p.stream),
                "ncclRecv", p);
      }
    } else {
      c.check(ncclSend(inputs[i].data_ptr(), count, type, root, c.comm(p), p.stream), "ncclSend",
              p);
    }
    ++i;
  });
}

WorkPtr run(Call& c, const LocalTensor& x, const AllToAllOptions& options) {
  const DType dtype = x.dtype();
  const int64_t split = wrap_dim(options.split_dim, x.dim());
  const int64_t concat = wrap_dim(options.concat_dim, x.dim());
  std::vector<Tensor> sends;
  std::vector<Tensor> recvs;
  for (Part& p : c.parts) {
    Shape piece_shape = p.input.shape();
    piece_shape[static_cast<size_t>(split)] /= c.n;
    // Piece j of the send buffer goes to group rank j; block i of the receive buffer came from i.
    sends.push_back(pieces_stacked(p.input, split, c.n));
    recvs.push_back(device_empty(p, stacked_shape(c.n, piece_shape), dtype));
  }
  const size_t count = static_cast<size_t>(recvs.front().numel() / c.n);
  all_to_all_blocks(c, sends, recvs, count, dtype);
  for (size_t k = 0; k < c.parts.size(); ++k) c.parts[k].result = concat_blocks(recvs[k], concat);
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const AllToAllSingleOptions& options) {
  const DType dtype = x.dtype();
  const int64_t n = c.n;
  std::vector<std::vector<int64_t>> in_splits;
  std::vector<std::vector<int64_t>> out_splits;
  for (Part& p : c.parts) {
    const int64_t rows = p.input.size(0);
    in_splits.push_back(resolve_splits(options.in_splits, p.rank, rows, n));
    // Empty out_splits: an equal share of this rank's row count from every peer.
    out_splits.push_back(resolve_splits(options.out_splits, p.rank, rows, n));
  }
  // Every member's (in_splits, out_splits): each finds the same first disagreement, as
  // check_group_splits would under sim.
  const size_t row_bytes = static_cast<size_t>(2 * n) * sizeof(int64_t);
  size_t filled = 0;
  const std::vector<const char*> received = c.exchange(row_bytes, [&](Part&, char* out) {
    std::memcpy(out, in_splits[filled].data(), static_cast<size_t>(n) * sizeof(int64_t));
    std::memcpy(out + n * sizeof(int64_t), out_splits[filled].data(),
                static_cast<size_t>(n) * sizeof(int64_t));
    ++filled;
  });
  for (size_t k = 0; k < c.parts.size(); ++k) {
    const Part& p = c.parts[k];
    std::vector<int64_t> table(static_cast<size_t>(2 * n * n));  // [member][in..., out...]
    std::memcpy(table.data(), received[k], table.size() * sizeof(int64_t));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t sent = table[static_cast<size_t>(i * 2 * n + j)];
        const int64_t expected = table[static_cast<size_t>(j * 2 * n + n + i)];
        if (sent != expected) {
          const std::vector<int>& members = p.member->members;
          throw_error<CommError>(
              "{}: split sizes do not match: rank {} sends {} rows to rank {}, which expects {}",
              c.describe(p), members[static_cast<size_t>(i)], sent, members[static_cast<size_t>(j)],
              expected);
        }
      }
    }
  }
  const ncclDataType_t type = nccl_type(dtype);
  std::vector<int64_t> row_numels;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    Part& p = c.parts[k];
    Shape out_shape = p.input.shape();
    out_shape[0] = 0;
    for (int64_t s : out_splits[k]) out_shape[0] += s;
    p.result = device_empty(p, out_shape, dtype);
    row_numels.push_back(shape_numel(Shape(out_shape.begin() + 1, out_shape.end())));
  }
  // Offsets (in elements) of each peer's block in this part's input and result.
  auto offsets = [&](const std::vector<int64_t>& splits, int64_t row_numel) {
    std::vector<int64_t> at(static_cast<size_t>(n) + 1, 0);
    for (int64_t r = 0; r < n; ++r) {
      at[static_cast<size_t>(r) + 1] =
          at[static_cast<size_t>(r)] + splits[static_cast<size_t>(r)] * row_numel;
    }
    return at;
  };
  std::vector<std::vector<int64_t>> send_at;
  std::vector<std::vector<int64_t>> recv_at;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    send_at.push_back(offsets(in_splits[k], row_numels[k]));
    recv_at.push_back(offsets(out_splits[k], row_numels[k]));
    const Part& p = c.parts[k];
    const auto me = static_cast<size_t>(c.index(p));
    c.copy_bytes(p, byte_ptr(p.result, recv_at[k][me]), byte_ptr(p.input, send_at[k][me]),
                 (send_at[k][me + 1] - send_at[k][me]) * static_cast<int64_t>(p.input.itemsize()));
  }
  size_t i = 0;
  c.group([&](Part& p) {
    const int me = c.index(p);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto ur = static_cast<size_t>(r);
      const int64_t send_count = send_at[i][ur + 1] - send_at[i][ur];
      const int64_t recv_count = recv_at[i][ur + 1] - recv_at[i][ur];
      if (send_count > 0) {
        c.check(ncclSend(byte_ptr(p.input, send_at[i][ur]), static_cast<size_t>(send_count), type,
                         r, c.comm(p), p.stream),
                "ncclSend", p);
      }
      if (recv_count > 0) {
        c.check(ncclRecv(byte_ptr(p.result, recv_at[i][ur]), static_cast<size_t>(recv_count), type,
                         r, c.comm(p), p.stream),
                "ncclRecv", p);
      }
    }
    ++i;
  });
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const BroadcastOptions& options) {
  const DType dtype = x.dtype();
  for (Part& p : c.parts) {
    // The source sends from its input in place (NCCL only reads it there).
    p.result = c.index(p) == options.src ? p.input : device_empty(p, p.input.shape(), dtype);
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    c.group([&](Part& p) {
      c.check(ncclBroadcast(p.result.data_ptr(), p.result.data_ptr(), count, nccl_type(dtype),
                            options.src, c.comm(p), p.stream),
              "ncclBroadcast", p);
    });
  }
  WorkPtr work = c.finish(x);
  // The source keeps its own shard, as under sim.
  std::vector<Tensor> shards = work->result().shards();
  for (size_t k = 0; k < c.parts.size(); ++k) {
    if (c.index(c.parts[k]) == options.src) shards[k] = x.shards()[k];
  }
  return std::make_shared<CompletedWork>(LocalTensor(x, std::move(shards)));
}

WorkPtr run(Call& c, const LocalTensor& x, const ScatterOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.scatter_dim, x.dim());
  const int root = options.src;
  std::vector<Tensor> sends;
  for (Part& p : c.parts) {
    Shape piece_shape = p.input.shape();
    piece_shape[static_cast<size_t>(d)] /= c.n;
    p.result = device_empty(p, piece_shape, dtype);
    sends.push_back(c.index(p) == root ? pieces_stacked(p.input, d, c.n) : p.input);
  }
  const size_t count = static_cast<size_t>(c.parts.front().result.numel());
  const ncclDataType_t type = nccl_type(dtype);
  if (count > 0) {
    bool done = false;
    if (c.rt->native_alltoall_gather_scatter) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
      size_t i = 0;
      c.group([&](Part& p) {
        // Non-roots pass their input as the (unused) send buffer: a valid device pointer.
        c.check(ncclScatter(sends[i++].data_ptr(), p.result.data_ptr(), count, type, root,
                            c.comm(p), p.stream),
                "ncclScatter", p);
      });
      done = true;
#endif
    }
    if (!done) {
      const int64_t block = static_cast<int64_t>(count);
      for (size_t k = 0; k < c.parts.size(); ++k) {
        const Part& p = c.parts[k];
        if (c.index(p) != root) continue;
        c.copy_bytes(p, p.result.data_ptr(), byte_ptr(sends[k], root * block),
                     block * static_cast<int64_t>(p.result.itemsize()));
      }
      size_t i = 0;
      c.group([&](Part& p) {
        if (c.index(p) == root) {
          for (int r = 0; r < c.n; ++r) {
            if (r == root) continue;
            c.check(ncclSend(byte_ptr(sends[i], r * block), count, type, r, c.comm(p), p.stream),
                    "ncclSend", p);
          }
        } else {
          c.check(ncclRecv(p.result.data_ptr(), count, type, root, c.comm(p), p.stream), "ncclRecv",
                  p);
        }
        ++i;
      });
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const GatherOptions& options) {
  const DType dtype = x.dtype();
  const int64_t d = wrap_dim(options.gather_dim, x.dim());
  const int root = options.dst;
  std::vector<Tensor> inputs;
  std::vector<Tensor> buffers;
  for (Part& p : c.parts) {
    inputs.push_back(p.input);
    buffers.push_back(c.index(p) == root
                          ? device_empty(p, stacked_shape(c.n, p.input.shape()), dtype)
                          : Tensor{});
  }
  gather_blocks(c, inputs, buffers, root, static_cast<size_t>(inputs.front().numel()), dtype);
  for (size_t k = 0; k < c.parts.size(); ++k) {
    Part& p = c.parts[k];
    if (c.index(p) == root) {
      p.result = concat_blocks(buffers[k], d);
    } else {
      Shape none = p.input.shape();
      none[static_cast<size_t>(d)] = 0;
      p.result = device_empty(p, none, dtype);
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const ReduceOptions& options) {
  const DType dtype = x.dtype();
  if (x.dim() == 0) {
    throw_error<CommError>(
        "{}: a 0-d input has no empty form for the non-destination ranks; reshape it to [1]",
        c.describe(c.parts.front()));
  }
  const ReducePlan plan = plan_reduction(options.op, dtype);
  const int root = options.dst;
  for (Part& p : c.parts) {
    if (c.index(p) == root) {
      p.result = device_empty(p, p.input.shape(), dtype);
    } else {
      Shape none = p.input.shape();
      none[0] = 0;
      p.result = device_empty(p, none, dtype);
    }
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    if (plan.kind == ReducePlan::Gathered) {
      std::vector<Tensor> inputs;
      std::vector<Tensor> buffers;
      for (Part& p : c.parts) {
        inputs.push_back(p.input);
        buffers.push_back(c.index(p) == root ? device_empty(p, {c.n, int64_t(count)}, dtype)
                                             : Tensor{});
      }
      gather_blocks(c, inputs, buffers, root, count, dtype);
      for (size_t k = 0; k < c.parts.size(); ++k) {
        Part& p = c.parts[k];
        if (c.index(p) != root) continue;
        check_kernel(cuda_kernels::reduce_stacked(static_cast<int>(options.op), elt(dtype),
                                                  buffers[k].data_ptr(), c.n, int64_t(count),
                                                  p.result.data_ptr(), int64_t(count), p.stream),
                     "reduce_stacked kernel", p);
      }
    } else {
      c.group([&](Part& p) {
        void* recv = c.index(p) == root ? p.result.data_ptr() : nullptr;
        c.check(ncclReduce(p.input.data_ptr(), recv, count, nccl_type(dtype), plan.op, root,
                           c.comm(p), p.stream),
                "ncclReduce", p);
      });
      if (plan.kind == ReducePlan::ParityOfSum) {
        for (Part& p : c.parts) {
          if (c.index(p) != root) continue;
          check_kernel(cuda_kernels::keep_low_bit(static_cast<uint8_t*>(p.result.data_ptr()),
                                                  int64_t(count), p.stream),
                       "keep_low_bit kernel", p);
        }
      }
    }
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const PermuteOptions& options) {
  const DType dtype = x.dtype();
  std::vector<int> dests;
  std::vector<int> sources;
  for (Part& p : c.parts) {
    const int me = c.index(p);
    const int dest = options.dst_of[static_cast<size_t>(me)];
    int source = -1;
    for (int i = 0; i < c.n; ++i) {
      if (options.dst_of[static_cast<size_t>(i)] == me) source = i;
    }
    dests.push_back(dest);
    sources.push_back(source);
    // A rank that receives nothing gets zeros of its own shape (jax.lax.ppermute).
    p.result = source < 0 ? zeros(p.input.shape(), dtype, cuda(p.device))
                          : device_empty(p, p.input.shape(), dtype);
    if (dest == me) {
      c.copy_bytes(p, p.result.data_ptr(), p.input.data_ptr(),
                   static_cast<int64_t>(p.input.nbytes()));
    }
  }
  const size_t count = static_cast<size_t>(c.parts.front().input.numel());
  if (count > 0) {
    const ncclDataType_t type = nccl_type(dtype);
    size_t i = 0;
    c.group([&](Part& p) {
      const int me = c.index(p);
      if (dests[i] >= 0 && dests[i] != me) {
        c.check(ncclSend(p.input.data_ptr(), count, type, dests[i], c.comm(p), p.stream),
                "ncclSend", p);
      }
      if (sources[i] >= 0 && sources[i] != me) {
        c.check(ncclRecv(p.result.data_ptr(), count, type, sources[i], c.comm(p), p.stream),
                "ncclRecv", p);
      }
      ++i;
    });
  }
  return c.finish(x);
}

WorkPtr run(Call& c, const LocalTensor& x, const BarrierOptions&) {
  std::vector<Tensor> flags;
  for (Part& p : c.parts) flags.push_back(zeros({1}, DType::I32, cuda(p.device)));
  size_t i = 0;
  c.group([&](Part& p) {
    void* flag = flags[i++].data_ptr();
    c.check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, c.comm(p), p.stream), "ncclAllReduce",
            p);
  });
  c.rt->wait_streams(c.slots(), c.comms(), c.what());
  return std::make_shared<CompletedWork>(x);
}

}  // namespace

WorkPtr NcclBackend::issue(Communicator& comm, const LocalTensor& x,
                           const CollectiveOptions& options, const CallSite& site) {
  Call c = begin_call(*runtime_, comm, x, options, site);
  return std::visit([&](const auto& o) { return run(c, x, o); }, options);
}

// ---- process-wide abort ---------------------------------------------------------------------

bool nccl_abort_communicators() {
  std::shared_ptr<NcclRuntime> rt;
  {
    std::lock_guard lock(g_live_mutex);
    rt = g_live_runtime.lock();
  }
  if (!rt) return false;
  if (rt->reporting.exchange(true)) {
    // The watchdog is already reporting and will end the process; give it time to.
    std::this_thread::sleep_for(kAbortWait + std::chrono::seconds(5));
    return true;
  }
  rt->failed = true;
  if (rt->watchdog) rt->watchdog->set_quiet(true);
  print_last_collectives(stderr, rt->ranks, kLastCollectives);
  rt->abort_all();
  return true;
}

}  // namespace spmd
