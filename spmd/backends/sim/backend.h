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
#pragma once

#include <string>

#include <spmd/collectives/backend.h>

namespace spmd {

class SimBackend final : public Backend {
 public:
  std::string name() const override { return "sim"; }
  bool is_lockstep() const override { return true; }

  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;
};

}  // namespace spmd
