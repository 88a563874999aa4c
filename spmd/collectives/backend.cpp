// spmd/collectives/backend.cpp: Communicator bookkeeping and the Backend defaults.
#include <spmd/collectives/backend.h>

#include <spmd/core/error.h>

namespace spmd {
namespace {
std::atomic<uint64_t> g_next_comm_id{1};
}  // namespace

const CommOptions& internal_comm_options() {
  static const CommOptions options{"", {{"spmd", "internal"}}};
  return options;
}

Communicator::Communicator(GroupFamily family, CommOptions options)
    : family_(std::move(family)), options_(std::move(options)), id_(g_next_comm_id++) {}

bool Communicator::is_internal() const {
  return options_ == internal_comm_options();
}

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

WorkPtr Backend::issue(Communicator&, const LocalTensor&, const CollectiveOptions& options,
                       const CallSite&) {
  unsupported(kind_of(options));
}

}  // namespace spmd
