// spmd/collectives/backend.h: the interface every backend (sim, threads, mpi, nccl) implements.
//
// PyTorch c10d's Backend with one entry point instead of one virtual per collective: issue()
// takes the LocalTensor, the Communicator of one group family (the groups along one mesh dim,
// mesh/group_family.h) and the collective's options (CollectiveOptions, whose alternative names
// the collective), and returns a Work handle. The sim backend computes every group of the family
// whose ranks it holds; a real backend holds one rank (or a few) and runs the group it is in.
// Calls a backend does not implement throw Unsupported("backend 'x' does not support y").
//
// Communicators are created once per (dim layout, CommOptions) by make_communicator and cached
// in the mesh universe (mesh/comm_cache.h); real backends split their world communicator there,
// which is collective over every process, so every process must create the same communicators in
// the same order. The functional collectives (collectives/functional.h) resolve the mesh dim,
// fetch the communicator, record the trace and call the backend; backends do not record traces.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <vector>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/types.h>
#include <spmd/mesh/comm_cache.h>
#include <spmd/mesh/group_family.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

// Where a collective was called from. Captured at the public API (std::source_location default
// argument) and passed down so reports can name the user's line.
struct CallSite {
  std::source_location location;
  std::string dim_name;  // "tp", or "dim 1" for unnamed dims
  // A send whose data carries a gradient back (its input requires grad): the receiver's result
  // will (Note [Point-to-point]).
  bool requires_grad = false;
};

// The backend's state for one group family.
// The options of the communicators of internal_collective (collectives/functional.h): the debug
// checks' own collectives, on channels apart from the user's.
const CommOptions& internal_comm_options();

class Communicator {
 public:
  Communicator(GroupFamily family, CommOptions options);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const GroupFamily& family() const { return family_; }
  const CommOptions& options() const { return options_; }
  // Whether this is a communicator of the debug checks' own collectives (internal_collective):
  // their calls must also meet at the same user line on every rank, since a rank that skipped a
  // DTensor op would otherwise pair its check's gathers with another op's.
  bool is_internal() const;
  // Unique within the process; names the communicator in traces.
  uint64_t id() const { return id_; }
  // The next sequence number (0, 1, 2, ...) of group `group`. Collectives are matched across
  // ranks by (group, sequence number).
  uint64_t next_sequence(int64_t group);
  // The link this family's groups use on `topology` (computed once per topology).
  LinkParams link(const Topology& topology);

 private:
  GroupFamily family_;
  CommOptions options_;
  uint64_t id_;
  std::mutex mutex_;
  std::vector<uint64_t> sequence_;  // per group, grown on demand
  const Topology* link_topology_ = nullptr;
  LinkParams link_;
};

// The handle of one issued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is complete; afterwards result() is what the synchronous call
  // returns. Rethrows the backend's error (CommError, CollectiveMismatchError) if it failed.
  // Calling wait() again returns at once.
  virtual void wait() = 0;
  // True once wait() would not block.
  virtual bool is_completed() const = 0;
  // The result; Error if called before wait() returned.
  virtual const LocalTensor& result() const = 0;
  // Moves the result out (for callers that own the only handle); result() is undefined after.
  virtual LocalTensor take_result() { return result(); }
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that is complete when created (sim, and backends that run synchronously).
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(LocalTensor result) : result_(std::move(result)) {}
  void wait() override {}
  bool is_completed() const override { return true; }
  const LocalTensor& result() const override { return result_; }
  LocalTensor take_result() override { return std::move(result_); }

 private:
  LocalTensor result_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "sim", "threads", "mpi", "nccl".
  virtual std::string name() const = 0;
  // The communicator for one group family. The default returns a plain Communicator (enough for
  // backends that keep no per-group state).
  virtual std::shared_ptr<Communicator> make_communicator(const GroupFamily& family,
                                                          const CommOptions& options);
  // The device this backend keeps `rank`'s tensors on (CPU except under nccl).
  virtual Device device_of(int rank) const { return Device{}; }
  // True when one process holds every rank of each group it computes (sim): groups whose ranks
  // the input does not all hold are skipped. False for backends that run the caller's group
  // with its peers elsewhere (threads, mpi, nccl).
  virtual bool is_lockstep() const { return false; }

  // Issues one collective on the groups of `comm`'s family: the alternative of `options` says
  // which (collectives/types.h). `x` holds the caller's input on every held rank (for barrier, any
  // LocalTensor over the held ranks; its data is not read). Every backend implements every
  // collective here, dispatching on the variant with std::visit (docs/design.md, "Adding a
  // collective"); the default throws Unsupported("backend 'x' does not support y").
  virtual WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                        const CallSite& site);

  // Called when the program has returned: CommError for what it left unfinished that the backend
  // can see (sim: point-to-point sends nobody received, Note [Point-to-point]). Default: nothing.
  virtual void finish_program() {}

 protected:
  [[noreturn]] void unsupported(CollectiveKind kind) const;
};

}  // namespace spmd
