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

}  // namespace

// Every group of the family whose ranks `x` holds, each after checking that the group's inputs
// agree, computed by compute_group.
WorkPtr SimBackend::issue(Communicator& comm, const LocalTensor& x,
                          const CollectiveOptions& options, const CallSite& site) {
  const auto& groups = comm.family().groups();
  std::vector<Tensor> out(x.num_shards());
  // Reused across calls: the per-group vectors would otherwise be the main cost of small calls.
  thread_local GroupView view{CollectiveCall{CollectiveKind::AllReduce, "", nullptr}, {}, {}};
  view.call = CollectiveCall{kind_of(options), site.dim_name, nullptr};
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
    compute_group(view, options);
  }
  return std::make_shared<CompletedWork>(assemble(x, out));
}

}  // namespace spmd
