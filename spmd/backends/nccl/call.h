// spmd/backends/nccl/call.h: one collective call of the nccl backend: a part per held rank, the
// NCCL group its calls go in, and the fingerprint exchange that comes before them.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <spmd/backends/nccl/backend.h>
#include <spmd/backends/nccl/state.h>
#include <spmd/collectives/backend.h>
#include <spmd/collectives/validate.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/cuda/device.h>

namespace spmd::nccl {

// The bytes of `t` from element `elements` on.
inline char* byte_ptr(const Tensor& t, int64_t elements = 0) {
  return static_cast<char*>(t.data_ptr()) + elements * static_cast<int64_t>(t.itemsize());
}

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

// One collective call of this process: a part per held rank, begun by begin_call.
struct Call {
  NcclRuntime* rt = nullptr;
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::string dim_name;
  std::vector<Part> parts;
  int n = 0;                       // group size
  const CallSite* site = nullptr;  // the caller's, alive for the call

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
  void exchange_fingerprints(const CollectiveOptions& options, const CallSite& site);

  // After the op: results to the host where the shard came from there; the watchdog tracks
  // every part's stream until the op completes.
  WorkPtr finish(const LocalTensor& x);
};

// The call's parts, each with its input on its rank's GPU, after the fingerprint exchange.
Call begin_call(NcclRuntime& rt, Communicator& comm, const LocalTensor& x,
                const CollectiveOptions& options, const CallSite& site);

}  // namespace spmd::nccl
