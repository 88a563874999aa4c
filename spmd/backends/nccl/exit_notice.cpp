// spmd/backends/nccl/exit_notice.cpp: the abort of every communicator when this process fails.
#include <spmd/backends/nccl/exit_notice.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include <spmd/backends/nccl/state.h>
#include <spmd/backends/nccl/watchdog.h>

namespace spmd {

bool nccl_abort_communicators() {
  std::shared_ptr<NcclRuntime> rt = nccl::live_runtime();
  if (!rt) return false;
  if (rt->reporting.exchange(true)) {
    // The watchdog is already reporting and will end the process; give it time to.
    std::this_thread::sleep_for(nccl::kAbortWait + std::chrono::seconds(5));
    return true;
  }
  rt->failed = true;
  if (rt->watchdog) rt->watchdog->set_quiet(true);
  print_last_collectives(stderr, rt->ranks, nccl::kLastCollectives);
  rt->abort_all();
  return true;
}

}  // namespace spmd
