// debug/trace_export.cpp: Trace exporters: Chrome trace JSON and the per-op summary table.
//
// Chrome trace JSON ("Trace Event Format"): one process, one track (tid) per rank, one complete
// event ("ph": "X") per (rank, collective call) with the record's fields under "args". It opens
// in Perfetto (ui.perfetto.dev) and chrome://tracing. Calls that never finished (end 0) are drawn
// as instants at their start.
#include <fstream>

#include <nlohmann/json.hpp>

#include "collectives/trace.h"
#include "core/error.h"

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
          {"estimate_us", r.estimate_us}};
}

}  // namespace

std::string Trace::to_chrome_json_string() const {
  nlohmann::json events = nlohmann::json::array();
  std::vector<TraceRecord> records = this->records();
  std::vector<int> ranks;
  for (const TraceRecord& r : records) {
    if (ranks.empty() || ranks.back() != r.rank) ranks.push_back(r.rank);
  }
  for (int rank : ranks) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
  }
  for (const TraceRecord& r : records) {
    nlohmann::json e = {{"name", r.op},  {"cat", r.dim_name}, {"pid", 0},
                        {"tid", r.rank}, {"ts", r.start_us},  {"args", record_args(r)}};
    if (r.end_us > 0.0) {
      e["ph"] = "X";
      e["dur"] = std::max(r.end_us - r.start_us, 0.001);
    } else {
      e["ph"] = "i";
      e["s"] = "t";
    }
    events.push_back(std::move(e));
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ns"},
                        {"otherData", {{"producer", "spmdsim"}}}};
  return doc.dump();
}

void Trace::to_chrome_json(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw_error<ConfigError>("Trace::to_chrome_json: cannot open '{}' for writing", path);
  out << to_chrome_json_string() << '\n';
  if (!out) throw_error<ConfigError>("Trace::to_chrome_json: writing '{}' failed", path);
}

std::string Trace::summary_table() const {
  std::vector<TraceSummaryRow> rows = summary();
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

}  // namespace spmd
