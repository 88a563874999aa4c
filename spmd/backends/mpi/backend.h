// spmd/backends/mpi/backend.h: the mpi backend: one rank per process, every collective an MPI call.
//
// Started by mpirun (or srun): MPI_COMM_WORLD rank r is mesh rank r and the process holds only
// that rank. Each group family (the groups along one mesh dim) gets one MPI communicator, split
// from a duplicate of MPI_COMM_WORLD on first use with color = the rank's group and key = its
// index in the group, so the communicator's rank is the group rank and roots need no mapping.
// The mesh universe caches it per (dim layout, options): two unflattens into the same layout
// share it. MPI_Comm_split is collective over every process, so every process must make the
// first call on each mesh dim, in the same order (an SPMD program does).
//
// Before each MPI call the group exchanges a fingerprint of the call (collective, dtype, shape,
// group, the options that must agree; with --spmd-debug=fingerprint also the per-communicator
// sequence number and call site) with one MPI_Allgather (Note [Collective fingerprint]). Every
// member then sees every other member's call, so a disagreement is the same error on all of them
// (CommError for shapes and dtypes, as under sim, unless fingerprint mode is on;
// CollectiveMismatchError for anything else) instead of a hang or a truncated message.
//
// Semantics match the sim backend bit for bit on data whose reductions are exact (Note
// [Reduction order]). Avg is the sum, then a division by the group size done as sim does it.
// BF16 and F16 travel as a 2-byte contiguous type and reduce through user ops that run the shared
// reduction kernel (collectives/reduce_kernels.h), which widens to F32, combines and rounds at
// every hop; F32/F64 Min and Max also use user ops so NaN propagates as under sim. Bool travels
// as bytes (Sum/Max/BOr = or, Product/Min/BAnd = and, BXor = xor). Every MPI return code is
// checked: a failure is a CommError naming the call, MPI's error string and the rank.
//
// The folder, file against file with backends/nccl: backend.h/.cpp (this one: the communicators and
// the Backend, which creates them and issues calls), state.h/.cpp (MPI's lifetime in the process,
// the datatypes and user ops), call.h/.cpp (one call: its checks and the signature exchange),
// collectives.h/.cpp (one run() per collective), watchdog.h/.cpp (Note [MPI watchdog], the roll
// call), exit_notice.h/.cpp (Note [Exit notices]) and driver.cpp. It has no bootstrap.h or
// unique_id.h: mpirun starts the processes, and MPI_Init_thread (state.cpp) joins them.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include <spmd/backends/mpi/state.h>  // mpi_initialize() and the process's MPI lifetime
#include <spmd/collectives/backend.h>
#include <spmd/world/backend_driver.h>

namespace spmd {

// The communicator of one group family: MPI_COMM_NULL when this process's rank is not in the
// family's rank map.
class MpiCommunicator final : public Communicator {
 public:
  // `number`: the communicator's place in this process's creation order, the same in every
  // process (MPI_Comm_split is collective): exit notices count calls by it.
  MpiCommunicator(GroupFamily family, CommOptions options, MPI_Comm comm, int world_rank,
                  int number);
  ~MpiCommunicator() override;

  MPI_Comm comm() const { return comm_; }
  int world_rank() const { return world_rank_; }
  int number() const { return number_; }
  // The group this process's rank is in and its index there (-1 when not in the family).
  int64_t group() const { return group_; }
  int index() const { return index_; }
  // The global ranks of this process's group, in group order.
  const std::vector<int>& members() const { return members_; }
  // The sequence number of the next call on this communicator (0, 1, 2, ...): the fingerprint's,
  // and what exit notices count (Note [Exit notices]).
  uint64_t next_call();

 private:
  MPI_Comm comm_;
  int world_rank_;
  int number_;
  int64_t group_ = -1;
  int index_ = -1;
  std::vector<int> members_;
};

class MpiBackend final : public Backend {
 public:
  // Duplicates MPI_COMM_WORLD (mpi_initialize() first) and starts the watchdog (Note [MPI
  // watchdog]) with `timeout_s`. `fingerprint`: the signature exchange also compares sequence
  // numbers and reports call sites (--spmd-debug=fingerprint).
  explicit MpiBackend(bool fingerprint = false, double timeout_s = kDefaultTimeoutSeconds);
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  std::shared_ptr<Communicator> make_communicator(const GroupFamily& family,
                                                  const CommOptions& options) override;

  // Exchanges the call's fingerprint with the group (Note [Collective fingerprint]), then runs
  // the collective's MPI calls (one run() per collective in collectives.cpp).
  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;

 private:
  MPI_Comm world_ = MPI_COMM_NULL;  // our duplicate of MPI_COMM_WORLD
  int rank_ = 0;
  int size_ = 0;
  bool fingerprint_ = false;
};

}  // namespace spmd
