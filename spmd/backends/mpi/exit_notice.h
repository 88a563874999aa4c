// spmd/backends/mpi/exit_notice.h: what the peers learn when this process's program ends, and the
// waits that listen for it: the exit notices, the small messages of the notices communicator (the
// roll call's too), and wait_polled.
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

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spmd/backends/mpi/call.h>
#include <spmd/backends/mpi/state.h>
#include <spmd/backends/mpi/watchdog.h>
#include <spmd/collectives/backend.h>
#include <spmd/core/error.h>

namespace spmd::mpi {

// The longest text a notice, or a roll call's answer, carries of each of its strings.
inline constexpr size_t kNoticeText = 1024;

// Note [Exit notices]: tells every other process that this one's program has ended.
void send_exit_notice(const std::string& how);

// Receives every notice that has arrived, and answers every roll call (Note [Roll call]).
void read_notices();

// Sends `bytes` to `rank` on the notices communicator without waiting (small enough to go
// eagerly); the buffer stays alive in MpiState::sent.
void send_small(std::vector<char> bytes, int rank, int tag);

// The next message with `tag` that has arrived, and its sender.
std::optional<std::pair<int, std::vector<char>>> receive_small(int tag);

// Why `call` can never complete, when a member's exit notice says it never made it.
std::optional<std::string> exited_member(const Call& call, const CallSite& site);

// Why the split creating communicator `number` can never complete, when a process's exit notice
// says it created fewer communicators.
std::optional<std::string> exited_before_split(size_t number, const std::string& dim);

// Waits for `request` without blocking in MPI (Note [Exit notices]): polls it, and reads exit
// notices while it is pending; when `doomed()` says a rank it needs is gone, the request and
// `buffers` are parked for good and the wait ends with DeadlockError. Past the timeout, `roll`
// finds out who has not arrived and reports (Note [Roll call]).
template <class Doomed>
void wait_polled(MPI_Request& request, const char* call, const std::shared_ptr<void>& buffers,
                 Doomed&& doomed, RollCall& roll) {
  int done = 0;
  check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
  if (done) return;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_look = start;
  for (;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    const Clock::time_point now = Clock::now();
    if (now >= next_look) {
      read_notices();
      if (std::optional<std::string> why = doomed()) {
        MpiState& s = state();
        s.parked.push_back(buffers);
        s.failed = *why;
        throw DeadlockError(*why);
      }
      roll.poll(start, now);
      next_look = now + std::chrono::milliseconds(1);
    }
    // A peer that is not there yet: look less often, leaving the core to the ranks that work.
    if (now - start > std::chrono::milliseconds(10)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace spmd::mpi
