// spmd/backends/sim/backend.h: the sim backend: every collective as local math over the shards.
//
// One process holds every rank. A collective on a group family runs every group whose ranks the
// input holds (groups not fully held are skipped and absent from the result), each computed from
// the members' shards in ascending group rank (Note [Reduction order]). Results that are the same
// on every member (all_reduce, all_gather, broadcast) are one buffer shared by the members (Note
// [Copy-on-write replicas]); results that are an existing shard (broadcast, scatter pieces,
// permute, identities over one rank) share the input's buffer instead of copying it.
// The collectives are memory-bound: reductions stream all inputs through one cache-resident
// accumulator block, copies are split over the thread pool (core/parallel.h).
//
// Point-to-point transfers go through a mailbox (Note [Point-to-point] in collectives/types.h).
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <spmd/collectives/backend.h>
#include <spmd/collectives/p2p.h>

namespace spmd {

class SimBackend final : public Backend {
 public:
  std::string name() const override { return "sim"; }
  bool is_lockstep() const override { return true; }

  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;
  // CommError listing the sends nobody received.
  void finish_program() override;

 private:
  struct Message {
    P2PEnvelope envelope;
    Tensor data;
  };
  // By (communicator id, sender, receiver), oldest first.
  using Pair = std::tuple<uint64_t, int, int>;

  WorkPtr issue_send(Communicator& comm, const LocalTensor& x, const SendOptions& options,
                     const CallSite& site);
  WorkPtr issue_recv(Communicator& comm, const LocalTensor& like, const RecvOptions& options,
                     const CallSite& site);

  std::mutex mutex_;
  std::map<Pair, std::deque<Message>> mailbox_;
};

}  // namespace spmd
