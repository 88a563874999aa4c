// spmd/backends/mpi/watchdog.cpp: the activity, the timeout report that ends the job (Note [MPI
// watchdog]) and the roll call (Note [Roll call]).
#include <spmd/backends/mpi/watchdog.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/ranges.h>

#include <spmd/backends/mpi/exit_notice.h>
#include <spmd/backends/mpi/state.h>
#include <spmd/collectives/trace.h>
#include <spmd/world/backend_driver.h>

namespace spmd::mpi {
namespace {

// ---- the roll call's messages (Note [Roll call]) --------------------------------------------

constexpr int kRollQueryTag = 7302;
constexpr int kRollAnswerTag = 7303;
constexpr uint32_t kRollMagic = 0x524f'4c4c;  // "ROLL"
// How long a roll call waits for answers: a process that polls answers within milliseconds.
constexpr std::chrono::milliseconds kRollCallGrace{1000};

struct RollQuery {
  uint32_t magic;
  uint32_t unused;
  uint64_t id;
};

struct RollAnswerHeader {
  uint32_t magic;
  int32_t kind;  // Activity::Kind
  int32_t comm;
  uint32_t text_bytes;
  uint64_t id;
  uint64_t sequence;
  double waited_s;
};

struct RollAnswer {
  Activity::Snapshot state;
  uint64_t id = 0;
};

std::optional<RollAnswer> decode_answer(const std::vector<char>& bytes) {
  RollAnswerHeader header{};
  if (bytes.size() < sizeof header) return std::nullopt;
  std::memcpy(&header, bytes.data(), sizeof header);
  if (header.magic != kRollMagic || bytes.size() != sizeof header + header.text_bytes) {
    return std::nullopt;
  }
  RollAnswer out;
  out.id = header.id;
  out.state.kind = static_cast<Activity::Kind>(header.kind);
  out.state.comm = header.comm;
  out.state.sequence = header.sequence;
  out.state.waited_s = header.waited_s;
  out.state.text.assign(bytes.data() + sizeof header, header.text_bytes);
  return out;
}

}  // namespace

Activity& activity() {
  static Activity a;
  return a;
}

[[noreturn]] void report_timeout(const std::string& message) {
  // This process has reported: the SIGTERM mpirun sends while the job ends must not report it
  // again (Note [Signal reports]).
  for (int sig : {SIGINT, SIGTERM}) std::signal(sig, SIG_IGN);
  const int rank = state().rank;
  fmt::print(stderr, "[rank {}] TimeoutError: {}\n", rank, message);
  std::fflush(stderr);
  dump_flight_recorder(describing_world(), "TimeoutError: " + message);
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; in case it does
}

void answer_roll_calls() {
  while (auto query = receive_small(kRollQueryTag)) {
    RollQuery q{};
    if (query->second.size() != sizeof q) continue;
    std::memcpy(&q, query->second.data(), sizeof q);
    if (q.magic != kRollMagic) continue;
    const Activity::Snapshot now = activity().snapshot();
    const std::string text = now.text.substr(0, kNoticeText);
    const RollAnswerHeader header{kRollMagic,  static_cast<int32_t>(now.kind),
                                  now.comm,    static_cast<uint32_t>(text.size()),
                                  q.id,        now.sequence,
                                  now.waited_s};
    std::vector<char> bytes(sizeof header + text.size());
    std::memcpy(bytes.data(), &header, sizeof header);
    std::memcpy(bytes.data() + sizeof header, text.data(), text.size());
    send_small(std::move(bytes), query->first, kRollAnswerTag);
  }
}

void RollCall::poll(Clock::time_point start, Clock::time_point now) {
  MpiState& s = state();
  const double timeout_s = s.watchdog ? s.watchdog->timeout_s : kDefaultTimeoutSeconds;
  if (!started_) {
    if (std::chrono::duration<double>(now - start).count() <= timeout_s) return;
    started_ = true;
    asked_at_ = now;
    asked_waited_s_ = std::chrono::duration<double>(now - start).count();
    id_ = ++s.roll_calls;
    const RollQuery query{kRollMagic, 0, id_};
    for (int rank : members_) {
      std::vector<char> bytes(sizeof query);
      std::memcpy(bytes.data(), &query, sizeof query);
      send_small(std::move(bytes), rank, kRollQueryTag);
    }
  }
  while (auto message = receive_small(kRollAnswerTag)) {
    std::optional<RollAnswer> answer = decode_answer(message->second);
    if (!answer || answer->id != id_) continue;  // a late answer to an earlier roll call
    answers_[message->first] = std::move(answer->state);
  }
  if (answers_.size() < members_.size() && now - asked_at_ < kRollCallGrace) return;
  report_timeout(report(std::chrono::duration<double>(now - start).count(), timeout_s));
}

std::string RollCall::report(double waited_s, double timeout_s) const {
  const MpiState& s = state();
  std::vector<int> missing;
  std::vector<std::string> elsewhere;
  std::vector<std::string> here = {
      fmt::format("rank {} (this one) for {:.1f} s", s.rank, asked_waited_s_)};
  for (int rank : members_) {
    const auto it = answers_.find(rank);
    if (it == answers_.end()) {
      missing.push_back(rank);
    } else if (here_(it->second)) {
      here.push_back(fmt::format("rank {} for {:.1f} s", rank, it->second.waited_s));
    } else {
      elsewhere.push_back(
          fmt::format("rank {} has not {}: it is {}", rank, absent_, it->second.text));
    }
  }
  std::string out = fmt::format("{} has waited {:.1f} s (--spmd-timeout={}){}: ", what_(), waited_s,
                                timeout_s, step_);
  if (!missing.empty()) {
    const bool one = missing.size() == 1;
    out += fmt::format(
        "rank{} {} {} not {}: {} did not answer a roll call within {:.1f} s ({} stopped, e.g. by "
        "SIGSTOP, busy outside any collective, or blocked in another collective's data "
        "exchange; {} own report, if any, says where)",
        one ? "" : "s", ranks_compact(missing), one ? "has" : "have", absent_, one ? "it" : "they",
        std::chrono::duration<double>(kRollCallGrace).count(), one ? "it is" : "each is",
        one ? "its" : "each one's");
  } else if (elsewhere.empty()) {
    out += "every rank it waits for answered from this wait, yet MPI has not completed it";
  }
  for (const std::string& e : elsewhere) {
    out += fmt::format("{}{}", missing.empty() && &e == &elsewhere.front() ? "" : "; ", e);
  }
  out += fmt::format("; waiting in it when the roll call began: {}", fmt::join(here, ", "));
  return out;
}

}  // namespace spmd::mpi
