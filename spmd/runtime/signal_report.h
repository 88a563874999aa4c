// spmd/runtime/signal_report.h: what a run prints when it is interrupted (SIGINT) or terminated
// (SIGTERM) before it ends.
//
// Note [Signal reports]
// A run stopped by Ctrl-C, by `kill`, by mpirun aborting the job or by spmdrun stopping the
// others would otherwise die without a word about where it was. launch() installs a
// SignalReport while the program runs (run_rank_threads does under threads). Its handler only
// writes the signal's number to a pipe (async-signal-safe); a watcher thread reads it, calls the
// report function (which prints where the run is), then ends the process by the same signal with
// its default action, so the exit status is the conventional one (a shell shows 130 for SIGINT,
// 143 for SIGTERM). What launch() prints:
//   sim        the last collectives (every rank runs them in lockstep), a pending one marked
//   threads    every rank's state: running (with its last collective), waiting in which
//              collective at which file:line and which ranks that call lacks, or finished
//   mpi, nccl  this process's state (waiting in a collective at file:line for how long, or
//              running outside one), then the flight recorder's dump: the file, and the last
//              collectives with the pending one marked (Note [Flight recorder])
// A second signal while the report is printed ends the process at once. A signal whose
// disposition was "ignore" when the report was installed (a background job of a script) stays
// ignored. The previous handlers are back when the SignalReport is destroyed.
#pragma once

#include <functional>
#include <string>

namespace spmd {

class SignalReport {
 public:
  // `report(signal)` runs on the watcher thread, at most once, and must not throw past itself
  // (what it throws is dropped). Only one SignalReport is active in a process: while one is,
  // another does nothing.
  explicit SignalReport(std::function<void(int signal)> report);
  ~SignalReport();
  SignalReport(const SignalReport&) = delete;
  SignalReport& operator=(const SignalReport&) = delete;

 private:
  bool active_ = false;
};

// "SIGINT", "SIGTERM", else "signal N".
std::string signal_name(int signal);

}  // namespace spmd
