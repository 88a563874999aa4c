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
// Note [MPI watchdog]
// MPI has no timeout of its own: a collective whose peer never comes waits forever. Every wait of
// this process on its peers is published as its activity (which collective, called from which
// file:line, in which step, since when; or the creation of a communicator; or MPI_Finalize), and
// a watchdog thread looks at it every 100 ms. When a collective or a communicator creation has
// waited longer than --spmd-timeout (SPMD_TIMEOUT, default 300 s), the process prints
//     [rank 0] TimeoutError: all_reduce over mesh dim 'dp' (group ranks [0, 1, 2, 3]) at
//     train.cpp:42 has waited 301.0 s (--spmd-timeout=300) in the signature exchange: rank 3 has
//     not made this call: it did not answer a roll call within 1.0 s (...); waiting in it when
//     the roll call began: rank 0 (this one) for 300.0 s, rank 1 for 300.0 s, rank 2 for 300.0 s
// (the polled waits, the signature exchange and a communicator's creation, first ask the ranks
// they wait for where they are: Note [Roll call] in backend.cpp; the data exchange that follows
// is reported by the watchdog thread: "every member made the call, but the data has not
// arrived"), dumps the flight recorder (its file, and the last collectives with the pending one
// marked: Note [Flight recorder] in collectives/trace.h) and ends the job with MPI_Abort(1). mpirun
// then sends SIGTERM to the other processes, and each prints where it is and its own flight
// recorder (Note [Signal reports] in runtime/signal_report.h), so the output shows every rank: the
// ones waiting in the collective and the one that is elsewhere. A process that has printed its
// TimeoutError ignores SIGINT and SIGTERM from then on, so it does not report twice. The thread
// calls MPI_Abort while the main thread may be inside MPI (under MPI_THREAD_FUNNELED): OpenMPI's
// abort goes to the runtime (PMIx), not to the communication layer the main thread uses, and ends
// the process. MPI_Finalize is not watched: a rank that has returned may wait there as long as its
// peers still compute.
//
// Note [Stopped processes]
// A process stopped (SIGSTOP, a debugger, the machine starved) does not run at all, its watchdog
// thread included, and when mpirun ends the job it continues it (SIGCONT) before the SIGTERM: its
// report would then describe what it does in the instant after it went on ("waiting 0.0 s in
// barrier"). The watchdog thread ticks every 100 ms; a tick more than 1 s after the previous one
// means the process did not run in between, and reports say so: "...; this process did not run
// for 12.3 s until 0.0 s ago (stopped, e.g. by SIGSTOP, or starved of CPU)".
//
// Note [Exit notices]
// A rank that returns from the program while its peers wait in a collective would leave them
// waiting until the timeout. Instead, when the program returns (launch(): finish_world), this
// process sends every other process a small notice on a communicator of its own (MPI_Isend,
// eager, never waited for): "returned from the program", its last collective, and how many calls
// it made on each communicator. Waits that can involve a rank that is gone do not block in MPI:
// the signature exchange (MPI_Iallgather) and the barrier before each communicator split
// (MPI_Ibarrier) are polled with MPI_Test, reading notices as they come. A member whose notice
// says it made fewer calls on the communicator than the pending one's sequence number never
// made it: the wait ends with a DeadlockError on this rank
//     [rank 0] DeadlockError: all_reduce over mesh dim 'dp' (group ranks [0, 1, 2, 3]) at
//     train.cpp:42 can never complete: rank 3 returned from the program after 1 call(s) on this
//     communicator, without making this one (call #1); its last collective: ...
// within milliseconds, and launch() ends the job as for any error. (Counts from a member that
// made the call are larger, so a notice never fails a call its sender took part in.) A rank that
// throws ends the job at once anyway (MPI_Abort), and one that dies is seen by mpirun. The
// polled request cannot be cancelled, so after such an error the backend refuses further
// collectives and MPI_Finalize becomes MPI_Abort. Only the signature exchange and the splits
// are polled: once every member has passed the signature exchange, the data calls that follow
// need nothing but the members' progress, and the watchdog covers them.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include <spmd/collectives/backend.h>
#include <spmd/world/backend_driver.h>

namespace spmd {

// MPI_Init_thread once per process (MPI_THREAD_FUNNELED: only the thread that initialized MPI
// calls it); later calls return at once. Also sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
// registers mpi_finalize() with atexit. Unsupported after mpi_finalize().
void mpi_initialize();
// MPI_Finalize, once, when MPI was initialized; communicators still alive are freed without it.
void mpi_finalize();
bool mpi_is_initialized();
// This process's rank and size in MPI_COMM_WORLD (mpi_initialize() first).
int mpi_world_rank();
int mpi_world_size();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialized (and not finalized); returns otherwise.
void mpi_abort(int code);
// The program of this process has ended with `how` ("returned from the program"): sends the exit
// notice (Note [Exit notices]) when an MpiBackend was created, then mpi_finalize(). When a
// polled collective failed earlier (its request still pending), MPI cannot finish cleanly: the
// job ends with MPI_Abort(1) instead.
void mpi_finish_program(const std::string& how);
// What this process is doing, for reports (Note [MPI watchdog]): "waiting 3.2 s in all_reduce
// over mesh dim 'dp' (group ranks [0, 1]) at train.cpp:42 (the signature exchange)", "running
// outside any collective (the last one ended 1.5 s ago)", "in MPI_Finalize: ...".
std::string mpi_activity();

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
  // the collective's MPI calls (one private function per collective in backend.cpp).
  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override;

 private:
  MPI_Comm world_ = MPI_COMM_NULL;  // our duplicate of MPI_COMM_WORLD
  int rank_ = 0;
  int size_ = 0;
  bool fingerprint_ = false;
};

}  // namespace spmd
