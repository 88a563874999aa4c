// spmd/backends/mpi/state.h: the mpi backend's process-wide state: MPI's lifetime in this process
// (MPI_Init_thread to MPI_Finalize), the datatypes and user ops the collectives use, and what the
// watchdog and the exit notices keep between calls.
//
// The functions in namespace spmd are the process's MPI interface, for the driver and for the nccl
// backend (whose unique id may come by MPI_Bcast); namespace spmd::mpi is internal to backends/mpi.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <spmd/core/error.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/reduce_op.h>
#include <spmd/world/world.h>

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

namespace mpi {

// ---- the process's MPI state ----------------------------------------------------------------

// What another process said when its program returned (Note [Exit notices]).
struct ExitNotice {
  std::string how;   // "returned from the program"
  std::string last;  // its last collective (format_record), or empty
  // Communicators it created, and its calls on the first calls.size() of them (a notice lists at
  // most kNoticeCommunicators; on a later one its count is unknown).
  uint64_t created = 0;
  std::vector<uint64_t> calls;
};

struct Watchdog;  // watchdog.h

struct MpiState {
  bool initialized_here = false;  // we called MPI_Init_thread, so we call MPI_Finalize
  bool finalized = false;
  int rank = -1;
  int size = 0;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Op op_sum = MPI_OP_NULL;
  MPI_Op op_product = MPI_OP_NULL;
  MPI_Op op_min = MPI_OP_NULL;
  MPI_Op op_max = MPI_OP_NULL;

  // Note [Exit notices]: the main thread's alone.
  MPI_Comm notices = MPI_COMM_NULL;  // created with the first MpiBackend
  std::vector<uint64_t> calls;       // per communicator number: this process's calls on it
  std::map<int, ExitNotice> exited;  // notices received, by sender
  std::vector<char> notice;          // this process's, alive while its sends may be in flight
  // A polled wait failed; its request cannot be cancelled and stays pending, with its buffers.
  std::string failed;
  std::vector<std::shared_ptr<void>> parked;

  std::unique_ptr<Watchdog> watchdog;  // Note [MPI watchdog]

  // Note [Roll call]: the main thread's alone.
  uint64_t roll_calls = 0;  // roll calls this process started
  // Queries and answers sent, kept alive: their sends are never waited for.
  std::deque<std::vector<char>> sent;
};

// The one MpiState of this process.
MpiState& state();

// True while MPI calls are allowed.
bool mpi_alive();
std::string mpi_error_string(int code);

// Throws CommError naming the MPI call, MPI's error string, this rank and what was being done.
template <class Context>
void check_mpi(int code, const char* call, Context&& context) {
  if (code == MPI_SUCCESS) return;
  throw_error<CommError>("{} failed on rank {}: {} ({})", call, state().rank,
                         mpi_error_string(code), context());
}
// The same, with "mpi backend" for what was being done.
void check_mpi(int code, const char* call);

// This process's world as reports see it (the flight recorder's dump).
World describing_world();

// Throws CommError naming `what` when a polled wait failed earlier (MpiState::failed): the job
// cannot continue.
void check_usable(const std::string& what);

// ---- datatypes and ops ----------------------------------------------------------------------

// The MPI datatype `dtype` travels as: BF16 and F16 as 2-byte contiguous types, Bool as bytes.
MPI_Datatype mpi_type(DType dtype);
// The MPI op computing `op` (Avg: the sum; the caller divides) on `dtype`.
MPI_Op mpi_op(ReduceOp op, DType dtype);

}  // namespace mpi
}  // namespace spmd
