// spmd/backends/mpi/watchdog.h: the mpi backend's guard against hangs: what this process waits for
// (its activity), the watchdog thread that reports a wait past the timeout, and the roll call that
// tells a polled wait who has not arrived.
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
// they wait for where they are: Note [Roll call] below; the data exchange that follows is
// reported by the watchdog thread: "every member made the call, but the data has not arrived"),
// dumps the flight recorder (its file, and the last collectives with the pending one marked:
// Note [Flight recorder] in collectives/trace.h) and ends the job with MPI_Abort(1). mpirun
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
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <spmd/backends/mpi/call.h>
#include <spmd/collectives/backend.h>
#include <spmd/collectives/fingerprint.h>

namespace spmd::mpi {

using Clock = std::chrono::steady_clock;

// ---- the activity, read by the watchdog and by signal reports (Note [MPI watchdog]) ----------

class Activity {
 public:
  enum class Kind { Running, Collective, Split, Finishing };

  // What a roll call's answer says about this process (Note [Roll call]).
  struct Snapshot {
    Kind kind = Kind::Running;
    int comm = -1;          // Collective: the communicator's number
    uint64_t sequence = 0;  // Collective: the call's number on it; Split: the new one's number
    double waited_s = 0.0;  // how long the wait has lasted
    std::string text;       // text()
  };

  // The main thread waits in `call` (from `site`), in `step`.
  void begin(const Call& call, const CallSite& site, const char* step) {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Collective;
    call_ = &call;
    site_ = &site;
    step_ = step;
    since_ = Clock::now();
  }
  // The main thread creates communicator `number`, of mesh dim `dim`.
  void begin_split(const std::string& dim, size_t number) {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Split;
    split_ = dim;
    split_number_ = number;
    since_ = Clock::now();
  }
  void step(const char* step) {
    std::lock_guard lock(mutex_);
    step_ = step;
  }
  void end() {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Running;
    call_ = nullptr;
    site_ = nullptr;
    last_end_ = Clock::now();
  }
  void finishing() {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Finishing;
    since_ = Clock::now();
  }

  // The watchdog thread's tick (Note [Stopped processes]): a tick that comes more than
  // kStoppedGap after the last one means the whole process did not run in between.
  void heartbeat() {
    std::lock_guard lock(mutex_);
    const Clock::time_point now = Clock::now();
    if (last_beat_ != Clock::time_point{} && now - last_beat_ > kStoppedGap) {
      stopped_s_ = std::chrono::duration<double>(now - last_beat_).count();
      stopped_until_ = now;
    }
    last_beat_ = now;
  }

  // Note [MPI watchdog]: the report of a wait older than `timeout_s`, or nullopt. The polled
  // waits (the signature exchange, a communicator's creation) report themselves after a roll call
  // (Note [Roll call]); the watchdog reports them only if that has not happened kRollCallBackstop
  // later.
  std::optional<std::string> overdue(double timeout_s) const {
    std::lock_guard lock(mutex_);
    if (kind_ != Kind::Collective && kind_ != Kind::Split) return std::nullopt;
    const double age = seconds_since(since_);
    const bool polled =
        kind_ == Kind::Split || step_ == kSignatureExchange || step_ == kPointToPoint;
    if (age <= timeout_s + (polled ? kRollCallBackstop : 0.0)) return std::nullopt;
    if (kind_ == Kind::Split) {
      return fmt::format(
          "creating the communicator of mesh dim '{}' has waited {:.1f} s (--spmd-timeout={}): "
          "MPI_Comm_split takes every process, and one has not reached it (it runs elsewhere, "
          "waits in a collective, or is much slower); each rank's report says where it is",
          split_, age, timeout_s);
    }
    const bool exchange = step_ == kSignatureExchange;
    return fmt::format(
        "{} at {} has waited {:.1f} s (--spmd-timeout={}) in {}: {}", call_->describe(),
        site_text(site_->location), age, timeout_s, step_,
        exchange ? "a member of the group has not made this call (it runs elsewhere, waits in "
                   "another collective, or is much slower); each rank's report says where it is"
                 : "every member made the call, but the data has not arrived");
  }

  // "waiting 3.2 s in ... at train.cpp:42 (the signature exchange)", "running outside any
  // collective (the last one ended 1.5 s ago)", ..., followed by Note [Stopped processes]'s
  // remark when the process did not run for a while.
  std::string text() const {
    std::lock_guard lock(mutex_);
    return text_locked() + stopped_text_locked();
  }

  Snapshot snapshot() const {
    std::lock_guard lock(mutex_);
    Snapshot out;
    out.kind = kind_;
    if (kind_ == Kind::Collective) {
      out.comm = call_->comm->number();
      out.sequence = call_->sequence;
    } else if (kind_ == Kind::Split) {
      out.sequence = split_number_;
    }
    out.waited_s = kind_ == Kind::Running ? 0.0 : seconds_since(since_);
    out.text = text_locked() + stopped_text_locked();
    return out;
  }

  static constexpr const char* kSignatureExchange = "the signature exchange";
  // A send or recv waiting for its peer (Note [Point-to-point]), polled as the exchange is.
  static constexpr const char* kPointToPoint = "the point-to-point transfer";
  // Note [Roll call]: how long after the timeout the watchdog still leaves a polled wait to
  // report itself.
  static constexpr double kRollCallBackstop = 3.0;
  static constexpr std::chrono::seconds kStoppedGap{1};

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  std::string text_locked() const {
    switch (kind_) {
      case Kind::Collective:
        return fmt::format("waiting {:.1f} s in {} at {} ({})", seconds_since(since_),
                           call_->describe(), site_text(site_->location), step_);
      case Kind::Split:
        return fmt::format(
            "waiting {:.1f} s to create the communicator of mesh dim '{}' "
            "(MPI_Comm_split, which takes every process)",
            seconds_since(since_), split_);
      case Kind::Finishing:
        return fmt::format(
            "finishing for {:.1f} s: the program returned, and the process waits for the other "
            "ranks' programs to end before MPI_Finalize",
            seconds_since(since_));
      case Kind::Running:
        break;
    }
    if (last_end_ == Clock::time_point{}) return "running, before any collective";
    return fmt::format("running outside any collective (the last one ended {:.1f} s ago)",
                       seconds_since(last_end_));
  }

  // Note [Stopped processes]: the watchdog's ticks stopped now (the report runs as soon as the
  // process goes on, maybe before the next tick), or stopped for a while before.
  std::string stopped_text_locked() const {
    if (last_beat_ == Clock::time_point{}) return "";
    const double silent = seconds_since(last_beat_);
    if (silent > std::chrono::duration<double>(kStoppedGap).count()) {
      return fmt::format(
          "; this process did not run for the last {:.1f} s (stopped, e.g. by SIGSTOP, or "
          "starved of CPU), so the times above count that pause",
          silent);
    }
    if (stopped_until_ == Clock::time_point{}) return "";
    return fmt::format(
        "; this process did not run for {:.1f} s until {:.1f} s ago (stopped, e.g. by SIGSTOP, "
        "or starved of CPU)",
        stopped_s_, seconds_since(stopped_until_));
  }

  mutable std::mutex mutex_;
  Kind kind_ = Kind::Running;
  const Call* call_ = nullptr;      // Collective: alive until end() (the main thread's)
  const CallSite* site_ = nullptr;  // Collective
  const char* step_ = "";
  std::string split_;        // Split: the mesh dim
  size_t split_number_ = 0;  // Split: the communicator's number
  Clock::time_point since_{};
  Clock::time_point last_end_{};
  Clock::time_point last_beat_{};
  double stopped_s_ = 0.0;
  Clock::time_point stopped_until_{};
};

// The one Activity of this process.
Activity& activity();

// Ends the activity when the wait ends, however it ends.
struct ActivityScope {
  ActivityScope(const Call& call, const CallSite& site) {
    activity().begin(call, site, Activity::kSignatureExchange);
  }
  ActivityScope(const std::string& split_dim, size_t number) {
    activity().begin_split(split_dim, number);
  }
  ~ActivityScope() { activity().end(); }
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;
};

// ---- the watchdog thread (Note [MPI watchdog]) ----------------------------------------------

inline constexpr std::chrono::milliseconds kWatchdogInterval{100};

// Prints the timeout, dumps the flight recorder and ends the job. Never returns.
[[noreturn]] void report_timeout(const std::string& message);

struct Watchdog {
  explicit Watchdog(double timeout) : timeout_s(timeout), thread([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
  void run() {
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, kWatchdogInterval, [this] { return stop; })) {
      activity().heartbeat();
      if (std::optional<std::string> message = activity().overdue(timeout_s)) {
        lock.unlock();
        report_timeout(*message);
      }
    }
  }

  double timeout_s;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;  // last: starts once the members above exist
};

// ---- the roll call (Note [Roll call]) -------------------------------------------------------

// Note [Roll call]
// A wait that only polls (the signature exchange, the barrier before a communicator split) can
// say who has not arrived when it times out: this process asks every rank it waits for where it
// is (a small message on the notices communicator, Note [Exit notices]), and every process that is
// itself in a polled wait answers within milliseconds with its activity: the same call (it has
// arrived, and has waited so long), another one (which, where), or finishing. A rank that does not
// answer within kRollCallGrace has not arrived: it is stopped (SIGSTOP), busy outside any
// collective, or blocked in an MPI call that is not polled (the data exchange of another
// collective). The TimeoutError then names the ranks that did not arrive, where the others are
// and how long each has waited, instead of "a member has not made this call"; it is printed
// about kRollCallGrace after the timeout (the watchdog reports a polled wait itself only
// Activity::kRollCallBackstop after it, should the roll call never end).
class RollCall {
 public:
  // What the wait is: `members` the world ranks it needs (this process's excluded), `here` says
  // whether an answer shows the rank in this same wait; the report reads "{what} has waited 2.0 s
  // (--spmd-timeout=2){step}: rank 3 has not {absent}: ...".
  RollCall(std::vector<int> members, std::function<bool(const Activity::Snapshot&)> here,
           std::function<std::string()> what, std::string step, std::string absent)
      : members_(std::move(members)),
        here_(std::move(here)),
        what_(std::move(what)),
        step_(std::move(step)),
        absent_(std::move(absent)) {}

  // Polls the roll call for a wait that began at `start`: starts it once the wait is older than
  // the timeout, collects the answers, and reports (never returning) when all are in or the
  // grace has passed.
  void poll(Clock::time_point start, Clock::time_point now);

 private:
  std::string report(double waited_s, double timeout_s) const;

  std::vector<int> members_;
  std::function<bool(const Activity::Snapshot&)> here_;
  std::function<std::string()> what_;
  std::string step_;
  std::string absent_;
  bool started_ = false;
  uint64_t id_ = 0;
  Clock::time_point asked_at_{};
  double asked_waited_s_ = 0.0;
  std::map<int, Activity::Snapshot> answers_;
};

// Answers every roll call that has arrived with this process's activity.
void answer_roll_calls();

}  // namespace spmd::mpi
