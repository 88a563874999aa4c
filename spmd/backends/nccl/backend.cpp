// spmd/backends/nccl/backend.cpp: the nccl backend's communicators and the Backend: the world
// communicators, creating a communicator (ncclCommSplit), issuing a call, and shutting down.
#include <spmd/backends/nccl/backend.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spmd/backends/nccl/call.h>
#include <spmd/backends/nccl/collectives.h>
#include <spmd/backends/nccl/state.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/tensor/cuda/device.h>

namespace spmd {

using namespace nccl;  // the backend's internals

// ---- communicators ------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(GroupFamily family, CommOptions options,
                                   std::shared_ptr<NcclRuntime> runtime,
                                   std::vector<Member> members)
    : Communicator(std::move(family), std::move(options)),
      runtime_(std::move(runtime)),
      members_(std::move(members)) {}

NcclCommunicator::~NcclCommunicator() {
  for (size_t slot = 0; slot < members_.size(); ++slot) {
    if (members_[slot].comm != nullptr) {
      runtime_->destroy_comm(members_[slot].comm, runtime_->held[slot].rank);
    }
  }
}

// ---- the backend --------------------------------------------------------------------------------

NcclBackend::NcclBackend(const NcclConfig& config) {
  SPMD_CHECK(!config.ranks.empty() && config.ranks.size() == config.devices.size());
  runtime_ = std::make_shared<NcclRuntime>(config);
  NcclRuntime& rt = *runtime_;
  world_.assign(rt.held.size(), nullptr);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  auto what = [&] {
    return fmt::format("ncclCommInitRankConfig of the world communicator ({} ranks)",
                       config.world_size);
  };
  {
    ApiLock lock(rt.api);
    rt.check(ncclGroupStart(), "ncclGroupStart", rt.held[0].rank, nullptr, what);
    for (size_t slot = 0; slot < rt.held.size(); ++slot) {
      const HeldRank& h = rt.held[slot];
      gpu::set_device(h.device);
      const ncclResult_t result =
          ncclCommInitRankConfig(&world_[slot], config.world_size, config.id, h.rank, &cfg);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)ncclGroupEnd();
        rt.check(result, "ncclCommInitRankConfig", h.rank, nullptr, what);
      }
    }
    rt.check(ncclGroupEnd(), "ncclGroupEnd", rt.held[0].rank, nullptr, what);
  }
  std::vector<CommRef> refs;
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    refs.push_back(CommRef{world_[slot], rt.held[slot].rank});
  }
  try {
    rt.wait_ready(refs, [&] {
      return fmt::format("{}: were all {} ranks started, with one unique id?", what(),
                         config.world_size);
    });
  } catch (...) {
    ApiLock lock(rt.api);
    for (ncclComm_t comm : world_) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
    }
    world_.clear();
    throw;
  }
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    rt.add_comm(world_[slot], fmt::format("the world communicator of rank {}", rt.held[slot].rank));
  }
  set_live_runtime(runtime_);
}

NcclBackend::~NcclBackend() {
  shutdown();
}

Device NcclBackend::device_of(int rank) const {
  for (const HeldRank& h : runtime_->held) {
    if (h.rank == rank) return cuda(h.device);
  }
  throw_error<CommError>("nccl backend: rank {} is not held by this process ({})", rank,
                         runtime_->label());
}

const std::vector<int>& NcclBackend::ranks() const {
  return runtime_->ranks;
}

void NcclBackend::shutdown() {
  if (!runtime_) return;
  NcclRuntime& rt = *runtime_;
  {
    std::lock_guard lock(rt.lifecycle);
    if (rt.shut_down) return;
    // Newest first: children before the world communicators they were split from.
    const std::vector<ncclComm_t> live = rt.live;
    for (auto it = live.rbegin(); it != live.rend(); ++it) {
      int rank = rt.held.front().rank;
      for (size_t slot = 0; slot < world_.size(); ++slot) {
        if (world_[slot] == *it) rank = rt.held[slot].rank;
      }
      rt.destroy_comm(*it, rank);
    }
    rt.shut_down = true;
  }
  rt.watchdog.reset();
  forget_live_runtime(runtime_);
}

std::shared_ptr<Communicator> NcclBackend::make_communicator(const GroupFamily& family,
                                                             const CommOptions& options) {
  NcclRuntime& rt = *runtime_;
  std::lock_guard lock(rt.lifecycle);
  rt.check_usable("ncclCommSplit");
  const size_t held = rt.held.size();
  std::vector<NcclCommunicator::Member> members(held);
  std::vector<ncclComm_t> children(held, nullptr);
  std::vector<int> colors(held);
  std::vector<int> keys(held);
  for (size_t slot = 0; slot < held; ++slot) {
    if (auto where = family.locate(rt.held[slot].rank)) {
      colors[slot] = static_cast<int>(where->group);
      keys[slot] = static_cast<int>(where->index);
      members[slot].group = where->group;
      members[slot].index = static_cast<int>(where->index);
      members[slot].members = family.group(where->group);
    } else {
      colors[slot] = NCCL_SPLIT_NOCOLOR;
      keys[slot] = 0;
    }
  }
  auto what = [&] {
    return fmt::format("ncclCommSplit for the communicator of mesh dim '{}' ({} groups of {})",
                       family.dim_name(), family.num_groups(), family.group_size());
  };
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  {
    ApiLock lock(rt.api);
    rt.check(ncclGroupStart(), "ncclGroupStart", rt.held[0].rank, nullptr, what);
    for (size_t slot = 0; slot < held; ++slot) {
      gpu::set_device(rt.held[slot].device);
      const ncclResult_t result =
          ncclCommSplit(world_[slot], colors[slot], keys[slot], &children[slot], &cfg);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)ncclGroupEnd();
        rt.check(result, "ncclCommSplit", rt.held[slot].rank, world_[slot], what);
      }
    }
    rt.check(ncclGroupEnd(), "ncclGroupEnd", rt.held[0].rank, nullptr, what);
  }
  // A nonblocking split reports on the parent; the child handle appears when it is done.
  std::vector<CommRef> parents;
  for (size_t slot = 0; slot < held; ++slot) {
    parents.push_back(CommRef{world_[slot], rt.held[slot].rank});
  }
  rt.wait_ready(parents, what);
  std::vector<CommRef> made;
  for (size_t slot = 0; slot < held; ++slot) {
    const bool expected = colors[slot] != NCCL_SPLIT_NOCOLOR;
    if (expected != (children[slot] != nullptr)) {
      rt.fail(fmt::format("{}: rank {} got {} communicator", what(), rt.held[slot].rank,
                          expected ? "no" : "an unexpected"));
    }
    if (children[slot] != nullptr) made.push_back(CommRef{children[slot], rt.held[slot].rank});
  }
  rt.wait_ready(made, what);
  for (size_t slot = 0; slot < held; ++slot) {
    ncclComm_t child = children[slot];
    if (child == nullptr) continue;
    int count = -1;
    int user_rank = -1;
    {
      ApiLock lock(rt.api);
      rt.check(ncclCommCount(child, &count), "ncclCommCount", rt.held[slot].rank, child, what);
      rt.check(ncclCommUserRank(child, &user_rank), "ncclCommUserRank", rt.held[slot].rank, child,
               what);
    }
    SPMD_CHECK_EQ(count, family.group_size());
    SPMD_CHECK_EQ(user_rank, keys[slot]);
    members[slot].comm = child;
    rt.add_comm(child, fmt::format("the communicator of mesh dim '{}' on rank {} (group {})",
                                   family.dim_name(), rt.held[slot].rank,
                                   ranks_str(members[slot].members)));
  }
  return std::make_shared<NcclCommunicator>(family, options, runtime_, std::move(members));
}

WorkPtr NcclBackend::issue(Communicator& comm, const LocalTensor& x,
                           const CollectiveOptions& options, const CallSite& site) {
  Call c = begin_call(*runtime_, comm, x, options, site);
  return run_collective(c, x, options);
}

}  // namespace spmd
