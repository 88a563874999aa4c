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
  // Reused across calls: the per-group vectors would otherwise be the main cost of small calls.
  thread_local GroupView view{CollectiveCall{CollectiveKind::AllReduce, "", nullptr}, {}, {}};
  thread_local std::vector<size_t> slots;
  view.call = CollectiveCall{kind_of(options), site.dim_name, nullptr};
  // The slots of a group's ranks in `x`; false when `x` does not hold all of them.
  auto find_slots = [&](const std::vector<int>& ranks) {
    slots.clear();
    for (int r : ranks) {
      auto slot = x.position_of(r);
      if (!slot) return false;
      slots.push_back(*slot);
    }
    return true;
  };
  // Runs the group of `ranks` (at `slots`) into view.outputs.
  auto run_group = [&](const std::vector<int>& ranks) {
    view.inputs.clear();
    for (size_t slot : slots) view.inputs.push_back(&x.shard_at(slot));
    view.call.group = &ranks;
    check_group(view.call, view.inputs);
    compute_group(view, options);
  };

  // A ragged collective's values are per rank (Note [Ragged collectives]): its results are not a
  // function of classes.
  if (x.has_classes() && !is_ragged(kind_of(options))) {
    // Note [Shard classes]: one computation per distinct tuple of the members' classes; the
    // result is in classes too (deduplicated by identity), so no per-rank shard is copied.
    const std::vector<uint32_t>& classes = *x.classes();
    std::map<std::vector<uint32_t>, std::vector<uint32_t>> by_signature;
    std::vector<Tensor> distinct;
    auto out_classes = std::make_shared<std::vector<uint32_t>>(x.num_shards(), UINT32_MAX);
    std::vector<uint32_t> signature;
    bool all_held = true;
    for (const std::vector<int>& ranks : groups) {
      if (!find_slots(ranks)) {
        all_held = false;
        continue;
      }
      signature.clear();
      for (size_t slot : slots) signature.push_back(classes[slot]);
      auto [it, inserted] = by_signature.try_emplace(signature);
      if (inserted) {
        std::vector<Tensor> results(ranks.size());
        view.outputs.clear();
        for (Tensor& t : results) view.outputs.push_back(&t);
        run_group(ranks);
        for (const Tensor& t : results) {
          size_t c = 0;
          while (c < distinct.size() && !distinct[c].is_same(t)) ++c;
          if (c == distinct.size()) distinct.push_back(t);
          it->second.push_back(static_cast<uint32_t>(c));
        }
      }
      for (size_t k = 0; k < slots.size(); ++k) (*out_classes)[slots[k]] = it->second[k];
    }
    if (all_held && !distinct.empty()) {
      return std::make_shared<CompletedWork>(
          LocalTensor(x, std::move(distinct), std::move(out_classes)));
    }
    // Some ranks are in no fully held group: their results are left out, per rank.
    std::vector<Tensor> out(x.num_shards());
    for (size_t i = 0; i < out.size(); ++i) {
      if ((*out_classes)[i] != UINT32_MAX) out[i] = distinct[(*out_classes)[i]];
    }
    return std::make_shared<CompletedWork>(assemble(x, out));
  }

  std::vector<Tensor> out(x.num_shards());
  for (const std::vector<int>& ranks : groups) {
    if (!find_slots(ranks)) continue;
    view.outputs.clear();
    for (size_t slot : slots) view.outputs.push_back(&out[slot]);
    run_group(ranks);
  }
  return std::make_shared<CompletedWork>(assemble(x, out));
}

}  // namespace spmd
