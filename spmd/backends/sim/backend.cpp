// spmd/backends/sim/backend.cpp: the sim backend's collectives.
#include <spmd/backends/sim/backend.h>

#include <algorithm>
#include <map>

#include <spmd/collectives/group_math.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>

#include <fmt/format.h>

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
  if (const auto* send = std::get_if<SendOptions>(&options)) {
    return issue_send(comm, x, *send, site);
  }
  if (const auto* recv = std::get_if<RecvOptions>(&options)) {
    return issue_recv(comm, x, *recv, site);
  }
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

// ---- point-to-point (Note [Point-to-point]) ---------------------------------------------------

namespace {

// The group rank `peer` of the group holding `rank`.
int peer_rank(const GroupFamily& family, int rank, int peer) {
  const auto where = family.locate(rank);
  return family.groups()[static_cast<size_t>(where->group)][static_cast<size_t>(peer)];
}

}  // namespace

WorkPtr SimBackend::issue_send(Communicator& comm, const LocalTensor& x, const SendOptions& options,
                               const CallSite& site) {
  std::vector<Tensor> tokens(x.num_shards());
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < x.num_shards(); ++i) {
    const int rank = x.ranks()[i];
    const int dst = peer_rank(comm.family(), rank, options.peer);
    const Tensor& data = x.shard_at(i);
    const P2PEnvelope envelope = make_envelope(
        EnvelopeInput{rank, dst, options.tag, &data.shape(), data.dtype(), site.requires_grad,
                      in_backward(), site.dim_name, site.location});
    mailbox_[Pair{comm.id(), rank, dst}].push_back(Message{envelope, data});
    tokens[i] = empty({0}, data.dtype(), data.device());
  }
  return std::make_shared<CompletedWork>(LocalTensor(x.ranks(), std::move(tokens)));
}

WorkPtr SimBackend::issue_recv(Communicator& comm, const LocalTensor& like,
                               const RecvOptions& options, const CallSite& site) {
  std::vector<Tensor> out(like.num_shards());
  bool requires_grad = false;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < like.num_shards(); ++i) {
    const int rank = like.ranks()[i];
    const int src = peer_rank(comm.family(), rank, options.peer);
    const Tensor& buffer = like.shard_at(i);
    const P2PEnvelope expected =
        make_envelope(EnvelopeInput{src, rank, options.tag, &buffer.shape(), buffer.dtype(), false,
                                    in_backward(), site.dim_name, site.location});
    auto it = mailbox_.find(Pair{comm.id(), src, rank});
    if (it == mailbox_.end() || it->second.empty()) {
      std::string waiting;
      for (const auto& [pair, queue] : mailbox_) {
        if (std::get<0>(pair) != comm.id() || std::get<2>(pair) != rank || queue.empty()) continue;
        waiting += fmt::format("\n  queued for rank {}: {}", rank,
                               envelope_text(queue.front().envelope, /*is_send=*/true));
      }
      throw_error<CommError>(
          "{}: rank {} has sent nothing to rank {} over '{}' that is not received yet. Under sim "
          "one program runs every rank in program order (lockstep), so a send must come before "
          "its recv in the program; on a cluster this recv would wait for a send that never "
          "comes{}",
          envelope_text(expected, /*is_send=*/false), src, rank, site.dim_name, waiting);
    }
    std::deque<Message>& queue = it->second;
    std::vector<P2PEnvelope> later;
    for (size_t k = 1; k < queue.size(); ++k) later.push_back(queue[k].envelope);
    // A failed pairing still consumes the message, as NCCL's would.
    const P2PEnvelope sent = queue.front().envelope;
    if (const std::string differences = envelope_differences(sent, expected);
        !differences.empty()) {
      queue.pop_front();
      throw CollectiveMismatchError(p2p_mismatch_report(sent, expected, differences, later));
    }
    // A matched pair is a copy (group_math.cpp).
    const std::vector<int> pair{src, rank};
    Tensor token;
    GroupView view{CollectiveCall{CollectiveKind::Recv, site.dim_name, &pair},
                   {&queue.front().data, &buffer},
                   {&token, &out[i]}};
    compute_group(view, options);
    requires_grad = requires_grad || queue.front().envelope.requires_grad != 0;
    queue.pop_front();
  }
  LocalTensor result(like.ranks(), std::move(out));
  if (requires_grad && is_floating(result.dtype())) result.requires_grad_(true);
  return std::make_shared<CompletedWork>(std::move(result));
}

void SimBackend::finish_program() {
  std::lock_guard lock(mutex_);
  std::string unreceived;
  size_t count = 0;
  for (auto& [pair, queue] : mailbox_) {
    for (const Message& m : queue) {
      if (++count <= 8) unreceived += "\n  " + envelope_text(m.envelope, /*is_send=*/true);
    }
    queue.clear();
  }
  if (count == 0) return;
  if (count > 8) unreceived += fmt::format("\n  ... and {} more", count - 8);
  throw_error<CommError>(
      "the program returned with {} point-to-point send{} nobody received (on a cluster the "
      "sender would wait for its recv forever):{}",
      count, count == 1 ? "" : "s", unreceived);
}

}  // namespace spmd
