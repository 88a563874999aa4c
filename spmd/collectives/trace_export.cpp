// spmd/collectives/trace_export.cpp: Trace exporters: Chrome trace JSON and the per-op summary
// table, for the process's trace and for records read back from files (debug/trace_file.h has the
// format).
//
// Chrome trace JSON ("Trace Event Format"): one process, one track (tid) per rank, one complete
// event ("ph": "X") per (rank, collective call) with the record's fields under "args". It opens
// in Perfetto (ui.perfetto.dev) and chrome://tracing. Calls that never finished (end 0) are drawn
// as instants at their start.
#include <spmd/collectives/trace_export.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <spmd/core/call_site.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/world/world.h>

namespace spmd {
namespace {

nlohmann::json record_args(const TraceRecord& r) {
  return {{"seq", r.sequence},
          {"dim", r.dim_name},
          {"detail", r.detail},
          {"group", r.group_ranks},
          {"shape", r.shape},
          {"dtype", r.dtype},
          {"bytes", r.bytes},
          {"file", r.file},
          {"line", r.line},
          {"function", r.function},
          {"estimate_us", r.estimate_us},
          {"state", r.end_us > 0.0 ? "completed" : "pending"}};
}

nlohmann::json with_pipeline(nlohmann::json args, const TraceRecord& r) {
  if (r.stage >= 0) args["stage"] = r.stage;
  if (r.microbatch >= 0) args["microbatch"] = r.microbatch;
  return args;
}

nlohmann::json info_json(const TraceFileInfo& info) {
  nlohmann::json out = {{"producer", "spmdsim"}, {"kind", info.kind}};
  if (!info.reason.empty()) out["reason"] = info.reason;
  if (!info.ranks.empty()) out["ranks"] = info.ranks;
  if (info.world_size > 0) out["world_size"] = info.world_size;
  if (!info.backend.empty()) out["backend"] = info.backend;
  if (info.capacity > 0) out["capacity"] = info.capacity;
  out["first_event"] = info.first_event;
  return out;
}

std::string format_summary(const std::vector<TraceSummaryRow>& rows) {
  std::string out = fmt::format("{:<18} {:<10} {:>8} {:>14} {:>14} {:>14}\n", "collective",
                                "mesh dim", "calls", "bytes", "estimated us", "measured us");
  int64_t calls = 0;
  int64_t bytes = 0;
  double estimate = 0.0;
  double measured = 0.0;
  for (const TraceSummaryRow& r : rows) {
    out += fmt::format("{:<18} {:<10} {:>8} {:>14} {:>14.1f} {:>14.1f}\n", r.op, r.dim_name,
                       r.count, r.bytes, r.estimate_us, r.measured_us);
    calls += r.count;
    bytes += r.bytes;
    estimate += r.estimate_us;
    measured += r.measured_us;
  }
  out += fmt::format("{:<18} {:<10} {:>8} {:>14} {:>14.1f} {:>14.1f}\n", "total", "", calls, bytes,
                     estimate, measured);
  return out;
}

}  // namespace

std::string chrome_trace_json(std::span<const TraceRecord> records, const TraceFileInfo& info,
                              std::span<const ComputeSpan> spans) {
  nlohmann::json events = nlohmann::json::array();
  std::vector<int> ranks;
  for (const TraceRecord& r : records) {
    if (std::find(ranks.begin(), ranks.end(), r.rank) == ranks.end()) ranks.push_back(r.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  for (int rank : ranks) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
  }
  for (const TraceRecord& r : records) {
    nlohmann::json e = {{"name", r.op},     {"cat", r.dim_name},
                        {"pid", 0},         {"tid", r.rank},
                        {"ts", r.start_us}, {"args", with_pipeline(record_args(r), r)}};
    if (r.end_us > 0.0) {
      e["ph"] = "X";
      e["dur"] = std::max(r.end_us - r.start_us, 0.001);
    } else {
      e["ph"] = "i";
      e["s"] = "t";
    }
    events.push_back(std::move(e));
  }
  // Note [Pipeline context]: the actions, one process per stage ("stage 0", ...), a track per rank.
  std::vector<int> stages;
  for (const ComputeSpan& c : spans) {
    if (std::find(stages.begin(), stages.end(), c.stage) == stages.end()) stages.push_back(c.stage);
  }
  std::sort(stages.begin(), stages.end());
  for (int stage : stages) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", 1 + stage},
                      {"args", {{"name", fmt::format("stage {}", stage)}}}});
  }
  for (const ComputeSpan& c : spans) {
    events.push_back({{"name", fmt::format("{}{}", c.phase, c.microbatch)},
                      {"cat", "pipeline"},
                      {"ph", "X"},
                      {"pid", 1 + c.stage},
                      {"tid", c.rank},
                      {"ts", static_cast<double>(c.start_ns) / 1e3},
                      {"dur", std::max(static_cast<double>(c.end_ns - c.start_ns) / 1e3, 0.001)},
                      {"args",
                       {{"stage", c.stage},
                        {"microbatch", c.microbatch},
                        {"phase", std::string(1, c.phase)},
                        {"tick", c.tick}}}});
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ns"},
                        {"otherData", info_json(info)}};
  return doc.dump();
}

std::string schedule_picture(std::span<const ComputeSpan> spans) {
  if (spans.empty()) return "";
  std::map<int, std::map<int64_t, std::string>> cells;  // rank -> tick -> "F3"
  int64_t ticks = 0;
  size_t width = 1;
  for (const ComputeSpan& c : spans) {
    std::string cell = fmt::format("{}{}", c.phase, c.microbatch);
    width = std::max(width, cell.size());
    cells[c.rank][c.tick] = std::move(cell);
    ticks = std::max(ticks, c.tick + 1);
  }
  std::string out;
  int64_t idle_total = 0;
  for (const auto& [rank, row] : cells) {
    std::string line = fmt::format("rank {:>3} ", rank);
    int64_t idle = 0;
    for (int64_t t = 0; t < ticks; ++t) {
      auto it = row.find(t);
      const std::string cell = it == row.end() ? "." : it->second;
      if (it == row.end()) ++idle;
      line += fmt::format(" {:>{}}", cell, width);
    }
    idle_total += idle;
    out += fmt::format("{}   idle {:.0f}%\n", line,
                       100.0 * static_cast<double>(idle) / static_cast<double>(ticks));
  }
  const double cells_total = static_cast<double>(ticks) * static_cast<double>(cells.size());
  out += fmt::format("{} ranks x {} ticks, bubble {:.1f}% (idle cells over all cells)\n",
                     cells.size(), ticks, 100.0 * static_cast<double>(idle_total) / cells_total);
  return out;
}

void write_trace_file(const std::string& path, std::span<const TraceRecord> records,
                      const TraceFileInfo& info, std::span<const ComputeSpan> spans) {
  std::ofstream out(path);
  if (!out) throw_error<ConfigError>("cannot open trace file '{}' for writing", path);
  out << chrome_trace_json(records, info, spans) << '\n';
  if (!out) throw_error<ConfigError>("writing trace file '{}' failed", path);
}

std::string summary_table(std::span<const TraceRecord> records) {
  std::vector<TraceSummaryRow> rows;
  // One call per (op, dim, group, sequence): its estimate once, its slowest rank's time.
  using CallKey = std::tuple<std::string, std::string, std::vector<int>, uint64_t>;
  std::map<CallKey, double> measured;
  for (const TraceRecord& r : records) {
    auto row = std::find_if(rows.begin(), rows.end(), [&](const TraceSummaryRow& x) {
      return x.op == r.op && x.dim_name == r.dim_name;
    });
    if (row == rows.end()) {
      rows.push_back(TraceSummaryRow{r.op, r.dim_name});
      row = rows.end() - 1;
    }
    if (__builtin_add_overflow(row->bytes, r.bytes, &row->bytes)) {
      throw_error<ConfigError>(
          "summary_table: the bytes of {} over mesh dim '{}' add up to more than an int64 holds "
          "(a record of rank {} has {} bytes)",
          r.op, r.dim_name, r.rank, r.bytes);
    }
    const double took = r.end_us > 0.0 ? r.end_us - r.start_us : 0.0;
    auto [it, first] =
        measured.try_emplace(CallKey{r.op, r.dim_name, r.group_ranks, r.sequence}, took);
    if (first) {
      row->count += 1;
      row->estimate_us += r.estimate_us;
      row->measured_us += took;
    } else if (took > it->second) {
      row->measured_us += took - it->second;
      it->second = took;
    }
  }
  return format_summary(rows);
}

std::string format_record(const TraceRecord& r) {
  std::string text = fmt::format("seq {} {} '{}' group {} {} {}", r.sequence, r.op, r.dim_name,
                                 ranks_str(r.group_ranks), shape_str(r.shape), r.dtype);
  if (!r.detail.empty()) text += " " + r.detail;
  if (r.stage >= 0 || r.microbatch >= 0) {
    text += fmt::format(" [stage {} microbatch {}]", r.stage, r.microbatch);
  }
  if (!r.file.empty()) text += " at " + site_text(r.file, r.line);
  if (r.end_us > 0.0) {
    text += fmt::format(" (completed, {:.1f} us)", r.end_us - r.start_us);
  } else {
    text += " (pending)";
  }
  return text;
}

std::string trace_file_for(const World& world, const std::string& path) {
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) return path;
  const std::string tag = world.held_ranks().size() == 1
                              ? fmt::format("rank{}", world.held_ranks()[0])
                              : fmt::format("ranks{}", fmt::join(world.held_ranks(), "_"));
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1)) {
    return fmt::format("{}.{}", path, tag);
  }
  return fmt::format("{}.{}{}", path.substr(0, dot), tag, path.substr(dot));
}

namespace {

// The otherData of the trace's `records`: the ranks with records, the ring's size and what it
// dropped.
TraceFileInfo trace_info(const Trace& trace, uint64_t first_event,
                         const std::vector<TraceRecord>& records) {
  TraceFileInfo info;
  for (const TraceRecord& r : records) {
    if (info.ranks.empty() || info.ranks.back() != r.rank) info.ranks.push_back(r.rank);
  }
  info.capacity = trace.capacity();
  info.first_event = first_event;
  return info;
}

}  // namespace

std::string Trace::to_chrome_json_string() const {
  const uint64_t first_event = first_event_id();
  const std::vector<TraceRecord> records = this->records();
  return chrome_trace_json(records, trace_info(*this, first_event, records), spans());
}

std::string write_world_trace(const World& world, const std::string& path) {
  const std::string file = trace_file_for(world, path);
  const Trace& t = trace();
  const uint64_t first_event = t.first_event_id();
  const std::vector<TraceRecord> records = t.records();
  TraceFileInfo info = trace_info(t, first_event, records);
  // A per-rank file names every rank it stands for, records or not (Note [Per-rank trace files]
  // in debug/trace_file.cpp).
  if (file != path) info.ranks = world.held_ranks();
  info.world_size = world.size();
  info.backend = world.backend_name();
  write_trace_file(file, records, info, t.spans());
  return file;
}

void Trace::to_chrome_json(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw_error<ConfigError>("Trace::to_chrome_json: cannot open '{}' for writing", path);
  out << to_chrome_json_string() << '\n';
  if (!out) throw_error<ConfigError>("Trace::to_chrome_json: writing '{}' failed", path);
}

std::string Trace::summary_table() const {
  const std::string picture = schedule_picture(spans());
  return format_summary(summary()) +
         (picture.empty() ? "" : "\npipeline schedule as it ran:\n" + picture);
}

}  // namespace spmd
