// spmd/collectives/flight_recorder.cpp: the flight recorder's dump (Note [Flight recorder] in
// collectives/trace.h).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>

#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/world/launcher.h>
#include <spmd/world/world.h>

namespace spmd {
namespace {

constexpr std::size_t kDefaultFlightRecorderSize = 2000;
// Records of this rank printed to stderr with a dump.
constexpr std::size_t kPrintedRecords = 5;

}  // namespace

std::size_t flight_recorder_size() {
  const std::optional<std::string> text = env_value("SPMD_FLIGHT_RECORDER_SIZE");
  if (!text) return kDefaultFlightRecorderSize;
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) {
    throw_error<ConfigError>(
        "SPMD_FLIGHT_RECORDER_SIZE={}: expected the number of collectives to keep (0 turns the "
        "flight recorder off)",
        *text);
  }
  return value;
}

std::string flight_recorder_dir() {
  return env_value("SPMD_FLIGHT_RECORDER_DIR").value_or(env_value("TMPDIR").value_or("/tmp"));
}

std::string flight_recorder_job() {
  std::optional<LauncherInfo> launcher;
  try {
    launcher = detect_launcher();
  } catch (const Error&) {
    // A launcher's variables that do not describe a rank: the pid names the job.
  }
  if (launcher && !launcher->job_id.empty()) return launcher->job_id;
  return fmt::format("pid{}", ::getpid());
}

std::string flight_recorder_file(const World& world) {
  if (auto file = env_value("SPMD_FLIGHT_RECORDER_FILE")) return trace_file_for(world, *file);
  // dir/spmd_flight_recorder.<job>.rank3.<stamp>.json: the stamp after the rank, so the job's
  // files are the per-rank files of dir/spmd_flight_recorder.<job>.json.
  const std::string per_rank = trace_file_for(
      world,
      fmt::format("{}/spmd_flight_recorder.{}.json", flight_recorder_dir(), flight_recorder_job()));
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  return fmt::format("{}.{}.json", per_rank.substr(0, per_rank.size() - 5), stamp);
}

std::string dump_flight_recorder(const World& world, std::string_view reason) {
  const std::string prefix = world.held_ranks().size() == 1
                                 ? fmt::format("[rank {}] ", world.held_ranks()[0])
                                 : std::string();
  try {
    const std::size_t size = flight_recorder_size();
    if (size == 0) return "";
    Trace& t = trace();
    const uint64_t first = t.first_event_id();
    std::vector<TraceEvent> events = t.events();
    const std::size_t keep = std::min(size, events.size());
    // The kept events' records for the held ranks, by rank then issue order (Trace::records).
    Trace window;
    window.set_capacity(0);
    for (std::size_t i = events.size() - keep; i < events.size(); ++i) {
      TraceEvent& e = events[i];
      std::erase_if(e.participants,
                    [&](const TraceParticipant& p) { return !world.holds(p.rank); });
      e.participant_count = static_cast<int64_t>(e.participants.size());
      if (!e.participants.empty()) window.begin(std::move(e));
    }
    const std::vector<TraceRecord> records = window.records();

    TraceFileInfo info;
    info.kind = "flight_recorder";
    info.reason = std::string(reason);
    info.ranks = world.held_ranks();
    info.world_size = world.size();
    info.backend = world.backend_name();
    info.capacity = size;
    info.first_event = first + (events.size() - keep);
    const std::string path = flight_recorder_file(world);
    std::error_code ignored;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
    write_trace_file(path, records, info);

    std::string text = fmt::format(
        "{}flight recorder ({}): {} collective record(s) of the last {} written to {}{}\n", prefix,
        reason, records.size(), keep, path, info.first_event > 0 ? " (older ones dropped)" : "");
    if (!env_value("SPMD_FLIGHT_RECORDER_FILE") &&
        world.held_ranks().size() != static_cast<size_t>(world.size())) {
      text += fmt::format(
          "{}flight recorder: every rank's dump of this job: spmd trace summary "
          "{}/spmd_flight_recorder.{}.json\n",
          prefix, flight_recorder_dir(), flight_recorder_job());
    }
    for (int rank : world.held_ranks()) {
      std::vector<const TraceRecord*> mine;
      for (const TraceRecord& r : records) {
        if (r.rank == rank) mine.push_back(&r);
      }
      const std::size_t shown = std::min(kPrintedRecords, mine.size());
      if (shown == 0) continue;
      text +=
          fmt::format("{}rank {}'s last {} collective(s), oldest first:\n", prefix, rank, shown);
      for (std::size_t i = mine.size() - shown; i < mine.size(); ++i) {
        text += fmt::format("{}  {}\n", prefix, format_record(*mine[i]));
      }
    }
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    return path;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}flight recorder: the dump failed: {}\n", prefix, e.what());
    std::fflush(stderr);
    return "";
  }
}

}  // namespace spmd
