// spmd/collectives/group_math.h: one group's collective computed from all its members' inputs.
//
// The semantics of every collective (collectives/types.h) as local math over one group: the
// members' inputs in group order in, each member's result out. Shared by the in-process
// backends: sim runs it for every group it holds, threads at each rendezvous. Results that are
// the same for every member are one Tensor (Note [Copy-on-write replicas]); results that are an
// existing input (broadcast, permute, identities over one rank) share that input's buffer.
// Reductions follow Note [Reduction order]; large copies use the thread pool.
#pragma once

#include <cstdint>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/collectives/validate.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

// One group of one call: its members' inputs by group rank, and where each member's result goes.
struct GroupView {
  CollectiveCall call;
  std::vector<const Tensor*> inputs;
  std::vector<Tensor*> outputs;
  int64_t size() const { return static_cast<int64_t>(inputs.size()); }
};

// Writes *g.outputs[k] for every member k, by the semantics of the collective `options` names.
// @pre check_group(g.call, g.inputs) and check_local on every member passed (all_to_all_single's
// split sizes are checked here, across members).
void compute_group(GroupView& g, const CollectiveOptions& options);

}  // namespace spmd
