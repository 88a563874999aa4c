// spmd/backends/nccl/backend.h: the nccl backend: each process drives one GPU per rank it holds,
// and every collective is an NCCL call on device buffers.
//
// Started by spmdrun (or mpirun, or by hand with NCCL_COMM_ID; Note [NCCL bootstrap] in
// backends/nccl/bootstrap.h). A process holds one rank, or several (--spmd-gpus-per-process),
// each with its own GPU, world communicator and stream; NCCL calls of several held ranks go in
// one ncclGroupStart/End. Each group family (the groups along one mesh dim) gets one communicator
// per held rank, split from the world communicator on first use with color = the rank's group and
// key = its index in the group (NCCL_SPLIT_NOCOLOR outside the family), so the communicator's
// rank is the group rank. The mesh universe caches it per (dim layout, options); ncclCommSplit is
// collective over the world, so every process makes the first call on each mesh dim in the same
// order (an SPMD program does).
//
// Before each NCCL call the group exchanges every member's CollectiveFingerprint with one small
// ncclAllGather and checks them with check_fingerprints, exactly as the mpi backend does
// (Note [Collective fingerprint] in collectives/fingerprint.h: one schema, the group hash
// included), so mismatched calls are errors, not hangs; --spmd-debug=fingerprint adds
// per-communicator sequence numbers and call sites. Where the results differ from sim's:
// Note [NCCL semantics] in collectives.h.
//
// The folder, file against file with backends/mpi: backend.h/.cpp (this one: the communicators and
// the Backend, which creates them and issues calls), state.h/.cpp (the held ranks, the API lock,
// the nonblocking waits and the communicators' lifetimes), call.h/.cpp (one call: its parts and
// the fingerprint exchange), collectives.h/.cpp (one run() per collective), watchdog.h/.cpp
// (Note [NCCL watchdog]), exit_notice.h/.cpp (what peers see when this process ends: the aborted
// communicators) and driver.cpp; besides, bootstrap.h/.cpp and unique_id.h, what an nccl world
// needs before its first communicator (Note [NCCL bootstrap]), which mpirun does for mpi.
//
// Note [NCCL device placement]
// Under nccl a rank's tensors live on its GPU: World::device_of(rank) is the rank's device, and
// LocalTensor::from_fn / replicate and DTensor's distribute_tensor and randn put shards there.
// Collectives take device shards and return device results with no host staging. A shard still
// on the host (made by hand, e.g. with from_fn over a rank list) is copied to the rank's GPU for
// the call and its result copied back, so code written for the CPU backends keeps working.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include <spmd/backends/nccl/exit_notice.h>  // nccl_abort_communicators()
#include <spmd/collectives/backend.h>

namespace spmd {

class NcclRuntime;  // the process's held ranks, streams, live communicators and watchdog

struct NcclConfig {
  int world_size = 1;
  std::vector<int> ranks;                      // held ranks, ascending
  std::vector<int> devices;                    // the CUDA device of each held rank
  ncclUniqueId id{};                           // of the world communicator
  double timeout_s = 300.0;                    // Note [NCCL watchdog]
  bool fingerprint = false;                    // --spmd-debug=fingerprint
  bool native_alltoall_gather_scatter = true;  // use_native_alltoall_gather_scatter()
};

// The communicators of one group family: one per held rank (null where the rank is not in the
// family).
class NcclCommunicator final : public Communicator {
 public:
  struct Member {
    ncclComm_t comm = nullptr;
    int64_t group = -1;        // the group the held rank is in
    int index = -1;            // its index in that group
    std::vector<int> members;  // the group's global ranks, in group order
    uint64_t calls = 0;        // calls issued so far (the fingerprint's sequence number)
  };

  NcclCommunicator(GroupFamily family, CommOptions options, std::shared_ptr<NcclRuntime> runtime,
                   std::vector<Member> members);
  // Finalizes and destroys the communicators (aborts them if the backend failed).
  ~NcclCommunicator() override;

  // One Member per held rank, in the backend's held-rank order.
  std::vector<Member>& members() { return members_; }

 private:
  std::shared_ptr<NcclRuntime> runtime_;
  std::vector<Member> members_;
};

class NcclBackend final : public Backend {
 public:
  // Creates the world communicator of every held rank (collective over all processes; waits at
  // most config.timeout_s) and starts the watchdog. Registers the CUDA tensor device.
  explicit NcclBackend(const NcclConfig& config);
  // Finalizes and destroys the world communicators (aborts them if the backend failed).
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  Device device_of(int rank) const override;
  const std::vector<int>& ranks() const;

  std::shared_ptr<Communicator> make_communicator(const GroupFamily& family,
                                                  const CommOptions& options) override;

  // Exchanges the call's fingerprint with the group (Note [Collective fingerprint]), then enqueues
  // the collective's NCCL calls (one run() per collective in collectives.cpp).
  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;

  // Finalizes and destroys every communicator of this process that is still alive (those of
  // meshes still referenced included) and stops the watchdog; collectives fail afterwards. Called
  // by finish_world(), while the CUDA runtime is certainly still up.
  void shutdown();

 private:
  std::shared_ptr<NcclRuntime> runtime_;
  std::vector<ncclComm_t> world_;  // per held rank
};

}  // namespace spmd
