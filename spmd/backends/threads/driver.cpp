// spmd/backends/threads/driver.cpp: the threads backend's driver (Note [Backend drivers] in
// world/backend_driver.h): one world per rank, each run by launch() on its own thread, their
// ThreadsBackends sharing one ThreadsHub.
#include <memory>

#include <spmd/backends/threads/backend.h>
#include <spmd/core/error.h>
#include <spmd/world/backend_driver.h>

namespace spmd {
namespace {

constexpr int kDefaultWorldSize = 8;
// Each rank is an OS thread with its own stack; spmdrun caps its process count the same way.
constexpr int kMaxWorldSize = 4096;

// The hub is the session: a finished rank fails the rendezvous waiting for it (Note [Threads
// deadlock detection]); finish() drops the rendezvous still held once every thread has ended.
class ThreadsSession final : public BackendSession {
 public:
  explicit ThreadsSession(std::shared_ptr<ThreadsHub> hub) : hub_(std::move(hub)) {}
  void rank_finished(int rank, const std::string& how) override { hub_->rank_finished(rank, how); }
  void finish() override { hub_->close(); }
  std::string describe_state() override { return hub_->describe(); }
  // Note [Threads timeout]: the waits have failed; a rank still running is not waited for.
  bool abandon_running_ranks() override { return hub_->timed_out(); }

 private:
  std::shared_ptr<ThreadsHub> hub_;
};

std::vector<World> start_threads(const WorldRequest& request) {
  const int size = request.world_size.value_or(kDefaultWorldSize);
  if (size < 1) {
    throw_error<ConfigError>("{}: the threads backend needs a world size of at least 1, got {}",
                             request.world_size_source, size);
  }
  if (size > kMaxWorldSize) {
    throw_error<ConfigError>(
        "{}: the threads backend runs at most {} rank threads (one OS thread each), got {}",
        request.world_size_source, kMaxWorldSize, size);
  }
  auto hub = std::make_shared<ThreadsHub>(size, request.timeout_s);
  auto session = std::make_shared<ThreadsSession>(hub);
  std::vector<World> worlds;
  worlds.reserve(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    auto state = std::make_shared<WorldState>();
    state->size = size;
    state->held_ranks = {rank};
    state->coordinator = rank == 0;
    state->backend_name = "threads";
    state->backend = std::make_shared<ThreadsBackend>(hub, rank);
    state->session = session;
    state->debug = request.debug;
    worlds.emplace_back(std::move(state));
  }
  return worlds;
}

BackendDriver threads_driver() {
  BackendDriver d;
  d.name = "threads";
  d.debug_all = DebugOptions{.check = true, .replicate = true, .nan = true, .types = true};
  d.thread_per_world = true;
  d.start = start_threads;
  return d;
}

}  // namespace
}  // namespace spmd

SPMD_REGISTER_BACKEND_DRIVER(threads, spmd::threads_driver)
