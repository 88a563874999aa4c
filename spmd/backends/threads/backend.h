// spmd/backends/threads/backend.h: the threads backend: one thread per rank, every collective a
// rendezvous that compares the calls before it computes them.
//
// launch() with --spmd-backend=threads runs the program once per rank, each on its own thread
// with a World holding that rank (runtime/launch.h run_rank_threads), so rank-dependent control
// flow really diverges, as it does on a cluster. The rank threads of one run share a ThreadsHub;
// each has its own ThreadsBackend. Each thread builds its own meshes (its own universe and
// communicator cache); communicators meet in the hub by the identity of their group family
// (rank map contents, canonical dim layout) and options, so two threads' meshes built alike
// share one set of groups. A collective is matched across ranks by (family, group, call number):
// the k-th call a rank makes on a group, over every mesh with that family, meets every other
// member's k-th call there (ThreadsChannel). The trace's sequence numbers are per mesh universe
// instead, as under sim and mpi.
//
// Note [Threads rendezvous]
// Each rank deposits its call (op, mesh dim, input shape and dtype, options, source location and
// the input itself) at the rendezvous of (family, group, sequence). The last member to arrive
// compares every member's call: the op, the dtype, the shape (a ragged collective's: beyond dim 0,
// Note [Ragged collectives]), every options field that is not per-rank (reduce op, root, dims,
// destinations: the fields of Note [One collective, one options struct], compared by
// shared_field_differences, so a new collective is compared without code here) and, for a ragged
// collective, that the members' per-rank values fit together (ragged_mismatch: all_to_all_single's
// out_splits agree with its peers' in_splits). Any difference fails the rendezvous with a
// CollectiveMismatchError for every member, listing each rank's call and file:line. (Shapes and
// dtypes too: under sim and mpi those are CommError, because there they are bad data in one
// call; here they are usually ranks that took different paths, and the report is the same.)
// Otherwise that thread computes the group's result once with compute_group
// (collectives/group_math.h), exactly as sim does, so results equal sim's bit for bit, and hands
// each member its part. Calls from different source lines that agree otherwise are legitimate
// (a rank-specific branch may call the same collective) and are not an error, but the first such
// pairing on a group is remembered and quoted in any later report on that group: it is usually
// where a rank skipped or added a call.
//
// Note [Threads deadlock detection]
// The hub knows every rank's state: running, waiting in a collective (Work::wait), or finished
// (its program returned or threw). Two situations can never resolve, and both are decided from
// that state at the moment it changes, never by a timeout:
//  - a rendezvous whose missing members have all finished: it fails when the last of them
//    finishes, or when the last live member arrives. Its report lists each member's call and
//    file:line, and for each missing member how it finished and what its last collective was.
//  - every rank that has not finished waits in a rendezvous that is still incomplete: no rank can
//    make another call, so every incomplete rendezvous fails. The report gives every rank's
//    state: the collective each one waits in, at which file:line, the members it still lacks,
//    and for finished ranks how they finished and their last collective.
// Both fail with DeadlockError in every member that arrived. A member that has not arrived but is
// still running is waited for: it may yet arrive, and if it blocks elsewhere instead, the second
// case applies.
//
// Note [Threads timeout]
// A member that is still running but never arrives (an endless loop, a wait on something the
// other ranks will never do) is the one case the states cannot decide. A rank that has waited in
// a rendezvous longer than --spmd-timeout (SPMD_TIMEOUT, default 300 s) ends the wait: every
// rendezvous still pending fails with TimeoutError in every member that arrived, with the report
//     all_reduce over 'dp' [4] f32 op=sum at train.cpp:42 (call #3 of group ranks [0, 1, 2, 3]):
//     rank 0 has waited 300 s (--spmd-timeout=300) and the call still lacks rank 3 (running: it
//     has not reached this call)
//     rank states:
//       rank 0: waits in ...
//       rank 3: running; its last collective: ...
// and the hub is marked timed out (timed_out()), so launch() does not wait long for the ranks
// still running: it reports them and ends the process (run_rank_threads, runtime/launch.h).
// Collectives computing their result never time out; only rendezvous that lack a member do.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <spmd/collectives/backend.h>
#include <spmd/core/error.h>
#include <spmd/world/backend_driver.h>

namespace spmd {

// The state the rank threads of one run share: the rendezvous of every group and the state of
// every rank. Thread-safe. Created by the launcher for `world_size` ranks, all running.
class ThreadsHub {
 public:
  // `timeout_s`: Note [Threads timeout].
  explicit ThreadsHub(int world_size, double timeout_s = kDefaultTimeoutSeconds);
  ~ThreadsHub();
  ThreadsHub(const ThreadsHub&) = delete;
  ThreadsHub& operator=(const ThreadsHub&) = delete;

  int world_size() const;
  // Rank `rank`'s program has returned or thrown; `how` says which for reports ("returned",
  // "threw CommError"). Fails every rendezvous that still lacks the rank. Call once per rank.
  void rank_finished(int rank, const std::string& how);
  // Drops every rendezvous still held (and the inputs deposited there). For the launcher, after
  // every rank thread has been joined.
  void close();
  // "rank states:" and a line per rank: running (and its last collective), waiting in which
  // collective at which file:line and which ranks it lacks, or finished and how.
  std::string describe();
  // A wait reached the timeout (Note [Threads timeout]).
  bool timed_out();

  struct Impl;  // backends/threads/backend.cpp
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The hub's state of one group family (backends/threads/backend.cpp): its groups' rendezvous.
struct ThreadsFamily;

// One rank's channel into a group family's rendezvous: its group, its place there, and its calls
// on the group so far. One per (family, options) for the rank, shared by the communicators of
// every mesh universe with that family, so calls on the same groups from two universes are
// matched in the order the rank makes them (the order every rank makes them).
struct ThreadsChannel {
  std::shared_ptr<ThreadsFamily> shared;
  int64_t group = -1;  // -1 when the family's rank map lacks the rank
  int index = -1;
  uint64_t calls = 0;
};

// One rank's communicator of a group family in one mesh universe. The rendezvous goes through the
// shared channel; the trace's sequence numbers (Communicator::next_sequence) are this
// communicator's own, so each universe's groups number their collectives from 0, as under sim
// and mpi (and PyTorch's process groups).
class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(GroupFamily family, CommOptions options,
                      std::shared_ptr<ThreadsChannel> channel);

  // The group holding this rank (-1 when the family's rank map lacks it) and its index there.
  int64_t group() const { return channel_->group; }
  int index() const { return channel_->index; }
  const std::shared_ptr<ThreadsFamily>& shared() const { return channel_->shared; }
  // The rendezvous number of this rank's next call on its group (0, 1, 2, ..., over every
  // universe).
  uint64_t next_call() { return channel_->calls++; }

 private:
  std::shared_ptr<ThreadsChannel> channel_;
};

class ThreadsBackend final : public Backend {
 public:
  ThreadsBackend(std::shared_ptr<ThreadsHub> hub, int rank);

  std::string name() const override { return "threads"; }
  int rank() const { return rank_; }
  const std::shared_ptr<ThreadsHub>& hub() const { return hub_; }

  // A communicator for one mesh universe (the universe caches it), over this rank's one channel
  // per family identity and options.
  std::shared_ptr<Communicator> make_communicator(const GroupFamily& family,
                                                  const CommOptions& options) override;

  // Deposits this rank's call at its group's rendezvous (Note [Threads rendezvous]); the Work
  // completes when the group's last member has arrived and the result is computed.
  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;

 private:
  struct Key {
    GroupFamily family;
    CommOptions options;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };

  std::shared_ptr<ThreadsHub> hub_;
  int rank_;
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<ThreadsChannel>, KeyHash> channels_;
};

}  // namespace spmd
