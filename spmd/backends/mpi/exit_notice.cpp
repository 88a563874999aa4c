// spmd/backends/mpi/exit_notice.cpp: the exit notices (Note [Exit notices]) and the small
// messages of the notices communicator.
#include <spmd/backends/mpi/exit_notice.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>

namespace spmd::mpi {
namespace {

constexpr int kExitTag = 7301;
constexpr uint32_t kNoticeMagic = 0x5350'4d44;  // "SPMD"
// Per-communicator counts a notice carries at most: the notice stays far below the eager limit
// of OpenMPI's transports (4 KB on shared memory), so its sends complete without a receiver.
constexpr size_t kNoticeCommunicators = 256;

struct NoticeHeader {
  uint32_t magic;
  uint32_t created;  // communicators created
  uint32_t listed;   // counts that follow (uint64_t each)
  uint32_t how_bytes;
  uint32_t last_bytes;
};

std::vector<char> encode_notice(const std::string& how, const std::string& last) {
  const MpiState& s = state();
  const std::string h = how.substr(0, kNoticeText);
  const std::string l = last.substr(0, kNoticeText);
  NoticeHeader header{kNoticeMagic, static_cast<uint32_t>(s.calls.size()),
                      static_cast<uint32_t>(std::min(s.calls.size(), kNoticeCommunicators)),
                      static_cast<uint32_t>(h.size()), static_cast<uint32_t>(l.size())};
  std::vector<char> out(sizeof header + header.listed * sizeof(uint64_t) + h.size() + l.size());
  char* p = out.data();
  std::memcpy(p, &header, sizeof header);
  p += sizeof header;
  std::memcpy(p, s.calls.data(), header.listed * sizeof(uint64_t));
  p += header.listed * sizeof(uint64_t);
  std::memcpy(p, h.data(), h.size());
  std::memcpy(p + h.size(), l.data(), l.size());
  return out;
}

std::optional<ExitNotice> decode_notice(const std::vector<char>& bytes) {
  NoticeHeader header{};
  if (bytes.size() < sizeof header) return std::nullopt;
  std::memcpy(&header, bytes.data(), sizeof header);
  const size_t counts = header.listed * sizeof(uint64_t);
  if (header.magic != kNoticeMagic ||
      bytes.size() != sizeof header + counts + header.how_bytes + header.last_bytes) {
    return std::nullopt;
  }
  ExitNotice n;
  n.created = header.created;
  n.calls.resize(header.listed);
  const char* p = bytes.data() + sizeof header;
  std::memcpy(n.calls.data(), p, counts);
  p += counts;
  n.how.assign(p, header.how_bytes);
  n.last.assign(p + header.how_bytes, header.last_bytes);
  return n;
}

std::string last_collective_clause(const ExitNotice& n) {
  return n.last.empty() ? "it made no collective call"
                        : fmt::format("its last collective: {}", n.last);
}

}  // namespace

void read_notices() {
  MpiState& s = state();
  if (s.notices == MPI_COMM_NULL) return;
  answer_roll_calls();
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kExitTag, s.notices, &flag, &status), "MPI_Iprobe");
    if (!flag) return;
    int bytes = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
    std::vector<char> buffer(static_cast<size_t>(std::max(bytes, 0)));
    check_mpi(MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kExitTag, s.notices,
                       MPI_STATUS_IGNORE),
              "MPI_Recv");
    if (std::optional<ExitNotice> notice = decode_notice(buffer)) {
      s.exited[status.MPI_SOURCE] = std::move(*notice);
    }
  }
}

void send_small(std::vector<char> bytes, int rank, int tag) {
  MpiState& s = state();
  s.sent.push_back(std::move(bytes));
  const std::vector<char>& buffer = s.sent.back();
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, rank, tag, s.notices,
                &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
}

std::optional<std::pair<int, std::vector<char>>> receive_small(int tag) {
  const MpiState& s = state();
  int flag = 0;
  MPI_Status status;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag, s.notices, &flag, &status), "MPI_Iprobe");
  if (!flag) return std::nullopt;
  int bytes = 0;
  check_mpi(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
  std::vector<char> buffer(static_cast<size_t>(std::max(bytes, 0)));
  check_mpi(MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, tag, s.notices,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
  return std::make_pair(status.MPI_SOURCE, std::move(buffer));
}

std::optional<std::string> exited_member(const Call& call, const CallSite& site) {
  const MpiState& s = state();
  if (s.exited.empty()) return std::nullopt;
  const size_t number = static_cast<size_t>(call.comm->number());
  for (int member : call.comm->members()) {
    const auto it = s.exited.find(member);
    if (it == s.exited.end()) continue;
    const ExitNotice& n = it->second;
    uint64_t made = 0;
    if (number < n.created) {
      if (number >= n.calls.size()) continue;  // not listed: unknown, the watchdog decides
      made = n.calls[number];
    }
    if (made > call.sequence) continue;  // it made this call, and its data is on the way
    return fmt::format(
        "{} at {} can never complete: rank {} {} after {} call(s) on this communicator, without "
        "making this one (call #{}); {}",
        call.describe(), site_text(site.location), member, n.how, made, call.sequence,
        last_collective_clause(n));
  }
  return std::nullopt;
}

std::optional<std::string> exited_before_split(size_t number, const std::string& dim) {
  for (const auto& [rank, n] : state().exited) {
    if (n.created > number) continue;
    return fmt::format(
        "creating the communicator of mesh dim '{}' (MPI_Comm_split, which takes every process) "
        "can never complete: rank {} {} after creating {} communicator(s); {}",
        dim, rank, n.how, n.created, last_collective_clause(n));
  }
  return std::nullopt;
}

void send_exit_notice(const std::string& how) {
  MpiState& s = state();
  if (s.notices == MPI_COMM_NULL || !mpi_alive() || !s.notice.empty() || s.size < 2) return;
  std::string last;
  std::vector<TraceEvent> events = trace().events();
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const bool mine = std::any_of(it->participants.begin(), it->participants.end(),
                                  [&](const TraceParticipant& p) { return p.rank == s.rank; });
    if (!mine) continue;
    Trace window;
    window.set_capacity(0);
    window.begin(std::move(*it));
    for (const TraceRecord& r : window.records()) {
      if (r.rank == s.rank) last = format_record(r);
    }
    break;
  }
  s.notice = encode_notice(how, last);
  for (int rank = 0; rank < s.size; ++rank) {
    if (rank == s.rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // Small enough to be sent eagerly: it completes without a receiver; a failure on the way out
    // only costs the peers the prompt report.
    if (MPI_Isend(s.notice.data(), static_cast<int>(s.notice.size()), MPI_BYTE, rank, kExitTag,
                  s.notices, &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
}

}  // namespace spmd::mpi
