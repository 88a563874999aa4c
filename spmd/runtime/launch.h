// spmd/runtime/launch.h: launch(), the main() of an spmdsim program, and the world factory behind
// it.
//
//   void train(World& world) { ... }
//   int main(int argc, char** argv) { return launch(argc, argv, train); }
//
//   ./train                                   sim: every rank in this process (8 by default)
//   ./train --spmd-world-size=4               sim with 4 ranks
//   ./train --spmd-backend=threads            one thread per rank, calls compared across ranks
//   mpirun -n 8 ./train --spmd-backend=mpi    one rank per process
//
// launch() removes its --spmd-* flags from argv (runtime/options.h lists them), builds the world,
// runs `program` (once under sim, mpi and nccl; once per rank thread under threads), writes the
// Chrome trace if --spmd-trace was given, shuts the backend down (MPI_Finalize) and returns the
// exit code: the program's (0 for a void program), 1 when it threw or a wait timed out, 2 when
// the launch itself was wrong (bad flag, a backend this build lacks, a missing launcher, a world
// size that disagrees with the launcher). SIGINT and SIGTERM print where the run is before the
// process ends by the signal (Note [Signal reports] in runtime/signal_report.h). Nothing escapes:
// an exception is printed to stderr with the rank(s) it happened on,
//     [rank 3] CommError: all_reduce over mesh dim 'tp' (group ranks [0, 1, 2, 3]): ...
// and under a real backend one failing process ends the whole job (MPI_Abort) rather than leave
// the others waiting in a collective. Under threads each rank thread's failure is printed once,
// ranks that failed with the same error on one line ("[ranks 0-7] CollectiveMismatchError: ..."),
// in the order they failed; the exit code is 1 when any rank threw, else the first non-zero code
// a rank returned (in rank order), else 0.
//
// Note [Trace files]
// --spmd-trace=path makes the process's trace unlimited and writes it as Chrome trace JSON when
// the program ends (also when it fails). Under sim that is one file with one track per rank. Under
// a real backend each process writes its own ranks' file, the rank inserted before the
// extension: trace.json -> trace.rank3.json (no extension: trace -> trace.rank3). Under threads
// the rank threads share the process's trace, written once to `path` after every thread ended.
// Under mpi and nccl a failing program also dumps the flight recorder (Note [Flight recorder] in
// collectives/trace.h): spmd_flight_recorder.<job>.rank3.<time>.json in $TMPDIR or /tmp, named
// on stderr.
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <spmd/collectives/trace_export.h>
#include <spmd/runtime/options.h>
#include <spmd/world/world.h>

namespace spmd {

namespace detail {
int launch_program(int& argc, char** argv, const std::function<int(World&)>& program);
}  // namespace detail

// Runs a program that returns nothing (exit code 0 on success).
int launch(int& argc, char** argv, const std::function<void(World&)>& program);
// Runs a program whose return value is the exit code.
int launch(int& argc, char** argv, const std::function<int(World&)>& program);

// Any other callable, e.g. a function `int train(World&)` (which would otherwise fit both
// std::function overloads).
template <class Program>
requires std::invocable<Program&, World&>
int launch(int& argc, char** argv, Program&& program) {
  return detail::launch_program(argc, argv, [&](World& world) {
    if constexpr (std::is_void_v<std::invoke_result_t<Program&, World&>>) {
      program(world);
      return 0;
    } else {
      return static_cast<int>(program(world));
    }
  });
}

// The world `options` describe, for this process, without running a program (tests, tools), made
// by the backend's driver (Note [Backend drivers] in world/backend_driver.h): sim holds every rank;
// mpi holds the rank mpirun/srun gave this process and initializes MPI; nccl holds this process's
// rank(s) and creates their world communicators (Note [NCCL bootstrap]). Applies the debug
// options (set_debug), the topology file and the trace settings. Pair it with finish_world().
// ConfigError/Unsupported as for launch(); ConfigError naming the library to link when the
// program does not link the backend. Under a backend with one world per rank thread (threads) a
// world exists only on a rank thread of run_rank_threads(): there this returns that thread's
// world, elsewhere it throws ConfigError.
World make_world(const LaunchOptions& options);

// How one rank thread's program ended.
struct RankOutcome {
  int rank = 0;
  int code = 0;                // what the program returned
  std::exception_ptr error;    // what it threw, if it did
  uint64_t failure_order = 0;  // among the ranks that threw: 0 for the first, 1 for the next, ...
  // The rank's thread was still running when the run timed out (Note [Threads timeout] in
  // backends/threads/backend.h) and was given up on: it is detached and may still run the
  // program; code and error say nothing.
  bool abandoned = false;
};

// The threads backend's run: `program` once per world that options.backend's driver starts, each on
// its own thread. Under threads that is options.world_size worlds (default 8), each holding its
// rank (rank 0 is the coordinator) with a ThreadsBackend sharing one hub
// (backends/threads/backend.h), with the debug options and topology applied. Returns when every
// thread has ended, one outcome per world, by rank. Writes no trace file and prints nothing but
// the report of a signal (Note [Signal reports] in runtime/signal_report.h: every rank's state),
// launch() does the rest. A rank's failure reaches its peers (BackendSession::rank_finished) as a
// DeadlockError in whatever collective still waits for it, so no thread is left waiting. When a
// wait times out (--spmd-timeout; Note [Threads timeout]) the threads still running get a
// second to end and are then abandoned (RankOutcome::abandoned): detached, still running the
// program, so the caller must end the process without returning to what the program uses
// (launch() prints the reports and calls std::_Exit).
std::vector<RankOutcome> run_rank_threads(const LaunchOptions& options,
                                          const std::function<int(World&)>& program);

// The end of a world from make_world(): writes its trace file (Note [Trace files];
// trace_file_for in collectives/trace_export.h names it) and shuts the backend's library down
// (BackendSession::finish: MPI_Finalize; no other world of that backend may be used afterwards).
// Calling it again does nothing more.
void finish_world(const World& world);

// "CommError: message": the spmd::Error subclass's name (other exceptions: their demangled C++
// type, "std::runtime_error: message") and the message.
std::string error_text(const std::exception_ptr& error);
// Prints "[rank 3] CommError: message" (the ranks `world` holds, else the launcher's rank) to
// stderr.
void report_error(const std::exception_ptr& error, const World& world);
// The same for an explicit rank list: "[rank 3] ", "[ranks 0-7] ", "[ranks 0-2,5] ".
void report_error(const std::exception_ptr& error, const std::vector<int>& ranks);

// Ends every process of the job with `code` when a real backend's library is running (each linked
// driver's abort_job): MPI_Abort under mpi; under nccl this process's communicators are aborted
// (its peers' collectives fail) and it exits with `code` (spmdrun then stops the others). Returns
// otherwise.
void abort_job(int code);

}  // namespace spmd
