// spmd/backends/sim/backend.cpp: the sim backend's collectives.
#include <spmd/backends/sim/backend.h>

#include <algorithm>
#include <map>

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
// agree, computed by compute_group. Shards in classes (Note [Shard classes]) are computed once
// per distinct tuple of the members' classes: a dry run's uniform shards make one computation.
WorkPtr SimBackend::issue(Communicator& comm, const LocalTensor& x,
                          const CollectiveOptions& options, const CallSite& site) {
  const auto& groups = comm.family().groups();
  std::vector<Tensor> out(x.num_shards());
  // Reused across calls: the per-group vectors would otherwise be the main cost of small calls.
  thread_local GroupView view{CollectiveCall{CollectiveKind::AllReduce, "", nullptr}, {}, {}};
  thread_local std::vector<size_t> slots;
  view.call = CollectiveCall{kind_of(options), site.dim_name, nullptr};
  // all_to_all_single's split sizes are per rank: its results are not a function of classes.
  const std::vector<uint32_t>* classes =
      std::holds_alternative<AllToAllSingleOptions>(options) ? nullptr : x.classes().get();
  std::map<std::vector<uint32_t>, std::vector<Tensor>> by_signature;
  std::vector<uint32_t> signature;
  for (const std::vector<int>& ranks : groups) {
    slots.clear();
    bool held = true;
    for (int r : ranks) {
      if (!x.holds(r)) {
        held = false;
        break;
      }
      slots.push_back(x.index_of(r));
    }
    if (!held) continue;
    std::vector<Tensor>* memo = nullptr;
    if (classes != nullptr) {
      signature.clear();
      for (size_t slot : slots) signature.push_back((*classes)[slot]);
      auto [it, inserted] = by_signature.try_emplace(signature);
      memo = &it->second;
      if (!inserted) {
        for (size_t k = 0; k < slots.size(); ++k) out[slots[k]] = (*memo)[k];
        continue;
      }
    }
    view.inputs.clear();
    view.outputs.clear();
    for (size_t slot : slots) {
      view.inputs.push_back(&x.shard_at(slot));
      view.outputs.push_back(&out[slot]);
    }
    view.call.group = &ranks;
    check_group(view.call, view.inputs);
    compute_group(view, options);
    if (memo != nullptr) {
      for (size_t slot : slots) memo->push_back(out[slot]);
    }
  }
  return std::make_shared<CompletedWork>(assemble(x, out));
}

}  // namespace spmd
