// spmd/collectives/backend.cpp: Communicator bookkeeping and the Backend defaults.
#include <spmd/collectives/backend.h>

#include <spmd/core/error.h>

namespace spmd {
namespace {
std::atomic<uint64_t> g_next_comm_id{1};
}  // namespace

Communicator::Communicator(GroupFamily family, CommOptions options)
    : family_(std::move(family)), options_(std::move(options)), id_(g_next_comm_id++) {}

uint64_t Communicator::next_sequence(int64_t group) {
  std::lock_guard lock(mutex_);
  if (static_cast<size_t>(group) >= sequence_.size()) {
    sequence_.resize(static_cast<size_t>(group) + 1, 0);
  }
  return sequence_[static_cast<size_t>(group)]++;
}

LinkParams Communicator::link(const Topology& topology) {
  std::lock_guard lock(mutex_);
  if (link_topology_ != &topology) {
    link_ = topology.link_for(family_);
    link_topology_ = &topology;
  }
  return link_;
}

std::shared_ptr<Communicator> Backend::make_communicator(const GroupFamily& family,
                                                         const CommOptions& options) {
  return std::make_shared<Communicator>(family, options);
}

void Backend::unsupported(CollectiveKind kind) const {
  throw_error<Unsupported>("backend '{}' does not support {}", name(), kind);
}

WorkPtr Backend::all_reduce(Communicator&, const LocalTensor&, const AllReduceOptions&,
                            const CallSite&) {
  unsupported(CollectiveKind::AllReduce);
}
WorkPtr Backend::all_gather(Communicator&, const LocalTensor&, const AllGatherOptions&,
                            const CallSite&) {
  unsupported(CollectiveKind::AllGather);
}
WorkPtr Backend::reduce_scatter(Communicator&, const LocalTensor&, const ReduceScatterOptions&,
                                const CallSite&) {
  unsupported(CollectiveKind::ReduceScatter);
}
WorkPtr Backend::all_to_all(Communicator&, const LocalTensor&, const AllToAllOptions&,
                            const CallSite&) {
  unsupported(CollectiveKind::AllToAll);
}
WorkPtr Backend::all_to_all_single(Communicator&, const LocalTensor&, const AllToAllSingleOptions&,
                                   const CallSite&) {
  unsupported(CollectiveKind::AllToAllSingle);
}
WorkPtr Backend::broadcast(Communicator&, const LocalTensor&, const BroadcastOptions&,
                           const CallSite&) {
  unsupported(CollectiveKind::Broadcast);
}
WorkPtr Backend::scatter(Communicator&, const LocalTensor&, const ScatterOptions&,
                         const CallSite&) {
  unsupported(CollectiveKind::Scatter);
}
WorkPtr Backend::gather(Communicator&, const LocalTensor&, const GatherOptions&, const CallSite&) {
  unsupported(CollectiveKind::Gather);
}
WorkPtr Backend::reduce(Communicator&, const LocalTensor&, const ReduceOptions&, const CallSite&) {
  unsupported(CollectiveKind::Reduce);
}
WorkPtr Backend::permute(Communicator&, const LocalTensor&, const PermuteOptions&,
                         const CallSite&) {
  unsupported(CollectiveKind::Permute);
}
WorkPtr Backend::barrier(Communicator&, const LocalTensor&, const BarrierOptions&,
                         const CallSite&) {
  unsupported(CollectiveKind::Barrier);
}

}  // namespace spmd
