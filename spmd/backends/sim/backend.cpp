// spmd/backends/sim/backend.cpp: the sim backend's collectives.
#include <spmd/backends/sim/backend.h>

#include <algorithm>

#include <spmd/collectives/group_math.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/error.h>

namespace spmd {
namespace {

// The result of a call: the outputs of every rank that took part, in input rank order.
LocalTensor assemble(const LocalTensor& x, std::vector<Tensor>& out) {
  if (std::all_of(out.begin(), out.end(), [](const Tensor& t) { return t.defined(); })) {
    return LocalTensor(x, std::move(out));
  }
  std::vector<int> ranks;
  std::vector<Tensor> shards;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].defined()) continue;
    ranks.push_back(x.ranks()[i]);
    shards.push_back(std::move(out[i]));
  }
  return LocalTensor(std::move(ranks), std::move(shards));
}

// Runs fn(group) for every group of the family whose ranks `x` holds, after checking that the
// group's inputs agree. fn writes *group.outputs[k] for every member k.
template <class Fn>
WorkPtr run_groups(CollectiveKind kind, Communicator& comm, const LocalTensor& x,
                   const CallSite& site, Fn&& fn) {
  const auto& groups = comm.family().groups();
  std::vector<Tensor> out(x.num_shards());
  // Reused across calls: the per-group vectors would otherwise be the main cost of small calls.
  thread_local GroupView view{CollectiveCall{kind, "", nullptr}, {}, {}};
  view.call = CollectiveCall{kind, site.dim_name, nullptr};
  for (const std::vector<int>& ranks : groups) {
    view.inputs.clear();
    view.outputs.clear();
    bool held = true;
    for (int r : ranks) {
      if (!x.holds(r)) {
        held = false;
        break;
      }
      const size_t slot = x.index_of(r);
      view.inputs.push_back(&x.shards()[slot]);
      view.outputs.push_back(&out[slot]);
    }
    if (!held) continue;
    view.call.group = &ranks;
    check_group(view.call, view.inputs);
    fn(view);
  }
  return std::make_shared<CompletedWork>(assemble(x, out));
}

}  // namespace

WorkPtr SimBackend::all_reduce(Communicator& comm, const LocalTensor& x,
                               const AllReduceOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::AllReduce, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::all_gather(Communicator& comm, const LocalTensor& x,
                               const AllGatherOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::AllGather, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::reduce_scatter(Communicator& comm, const LocalTensor& x,
                                   const ReduceScatterOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::ReduceScatter, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::all_to_all(Communicator& comm, const LocalTensor& x,
                               const AllToAllOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::AllToAll, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::all_to_all_single(Communicator& comm, const LocalTensor& x,
                                      const AllToAllSingleOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::AllToAllSingle, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::broadcast(Communicator& comm, const LocalTensor& x,
                              const BroadcastOptions& options, const CallSite& site) {
  return run_groups(CollectiveKind::Broadcast, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::scatter(Communicator& comm, const LocalTensor& x, const ScatterOptions& options,
                            const CallSite& site) {
  return run_groups(CollectiveKind::Scatter, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::gather(Communicator& comm, const LocalTensor& x, const GatherOptions& options,
                           const CallSite& site) {
  return run_groups(CollectiveKind::Gather, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::reduce(Communicator& comm, const LocalTensor& x, const ReduceOptions& options,
                           const CallSite& site) {
  return run_groups(CollectiveKind::Reduce, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::permute(Communicator& comm, const LocalTensor& x, const PermuteOptions& options,
                            const CallSite& site) {
  return run_groups(CollectiveKind::Permute, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

WorkPtr SimBackend::barrier(Communicator& comm, const LocalTensor& x, const BarrierOptions& options,
                            const CallSite& site) {
  return run_groups(CollectiveKind::Barrier, comm, x, site,
                    [&](GroupView& g) { compute_group(g, options); });
}

}  // namespace spmd
