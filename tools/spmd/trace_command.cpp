// tools/spmd/trace_command.cpp: `spmd trace`, the trace files --spmd-trace writes (Chrome trace
// JSON, one track per rank; under a real backend one file per rank).
//
//   spmd trace summary trace.json [trace.rank1.json ...] [--json]
//       per collective and mesh dim: calls, bytes, the cost model's estimate, the measured time
//   spmd trace diff a.json b.json        where two traces part ways, rank by rank
//   spmd trace convert in.json out.json  merge per-rank files into one
//
// The reader and the summary here are this tool's own until debug/ (trace_file.h, trace_diff.h)
// is in main: then summary reads with read_trace_file and prints summary_table, and diff and
// convert call diff_traces and write_trace_file, which do not exist before it.
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct TraceOptions {
  std::vector<std::string> files;
  bool json = false;
};

// One (rank, call) event of a trace file: the fields the summary needs.
struct Record {
  int rank = 0;
  std::string op;
  std::string dim;
  std::vector<int> group;
  uint64_t seq = 0;
  int64_t bytes = 0;
  double estimate_us = 0.0;
  double duration_us = 0.0;  // 0 for a call that never finished
};

std::vector<Record> read_records(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error<ConfigError>("cannot read trace file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") ||
      !doc["traceEvents"].is_array()) {
    throw_error<ConfigError>(
        "'{}' is not a trace file (Chrome trace JSON with a \"traceEvents\" list, as "
        "--spmd-trace writes)",
        path);
  }
  std::vector<Record> out;
  std::size_t index = 0;
  for (const nlohmann::json& e : doc["traceEvents"]) {
    ++index;
    if (!e.is_object() || e.value("ph", "") == "M") continue;
    try {
      const nlohmann::json& args = e.at("args");
      Record r;
      r.rank = e.at("tid").get<int>();
      r.op = e.at("name").get<std::string>();
      r.dim = args.at("dim").get<std::string>();
      r.group = args.at("group").get<std::vector<int>>();
      r.seq = args.at("seq").get<uint64_t>();
      r.bytes = args.at("bytes").get<int64_t>();
      r.estimate_us = args.at("estimate_us").get<double>();
      r.duration_us = e.value("dur", 0.0);
      out.push_back(std::move(r));
    } catch (const nlohmann::json::exception& ex) {
      throw_error<ConfigError>("'{}': trace event {} lacks a field of spmdsim's schema ({})", path,
                               index, ex.what());
    }
  }
  return out;
}

struct SummaryRow {
  std::string op;
  std::string dim;
  int64_t calls = 0;
  int64_t bytes = 0;
  double estimate_us = 0.0;
  double measured_us = 0.0;
};

// Per (op, dim) in first-seen order. A call is one (group, sequence number): its estimate counts
// once and its measured time is its slowest rank's.
std::vector<SummaryRow> summarize(const std::vector<Record>& records) {
  std::vector<SummaryRow> rows;
  std::map<std::pair<std::string, std::string>, std::size_t> row_of;
  std::map<std::tuple<std::string, std::string, std::vector<int>, uint64_t>, double> call_time;
  for (const Record& r : records) {
    auto [it, fresh] = row_of.try_emplace({r.op, r.dim}, rows.size());
    if (fresh) rows.push_back({r.op, r.dim});
    SummaryRow& row = rows[it->second];
    row.bytes += r.bytes;
    auto [call, first] = call_time.try_emplace({r.op, r.dim, r.group, r.seq}, r.duration_us);
    if (first) {
      ++row.calls;
      row.estimate_us += r.estimate_us;
    } else {
      call->second = std::max(call->second, r.duration_us);
    }
  }
  for (const auto& [key, time] : call_time) {
    rows[row_of.at({std::get<0>(key), std::get<1>(key)})].measured_us += time;
  }
  return rows;
}

int run_summary(const TraceOptions& o) {
  std::vector<Record> records;
  for (const std::string& f : o.files) {
    std::vector<Record> more = read_records(f);
    records.insert(records.end(), more.begin(), more.end());
  }
  const std::vector<SummaryRow> rows = summarize(records);
  SummaryRow total{"total", ""};
  std::set<int> ranks;
  for (const Record& r : records) ranks.insert(r.rank);
  for (const SummaryRow& r : rows) {
    total.calls += r.calls;
    total.bytes += r.bytes;
    total.estimate_us += r.estimate_us;
    total.measured_us += r.measured_us;
  }
  if (o.json) {
    auto row_json = [](const SummaryRow& r) {
      return nlohmann::json{{"op", r.op},
                            {"dim", r.dim},
                            {"calls", r.calls},
                            {"bytes", r.bytes},
                            {"estimate_us", r.estimate_us},
                            {"measured_us", r.measured_us}};
    };
    nlohmann::json doc;
    doc["files"] = o.files;
    doc["records"] = records.size();
    doc["ranks"] = ranks;
    doc["rows"] = nlohmann::json::array();
    for (const SummaryRow& r : rows) doc["rows"].push_back(row_json(r));
    doc["total"] = row_json(total);
    print_json(doc);
    return 0;
  }
  fmt::print("{} records of {} ranks from {}\n", records.size(), ranks.size(),
             fmt::join(o.files, ", "));
  fmt::print("{:<18} {:<10} {:>8} {:>14} {:>14} {:>14}\n", "collective", "mesh dim", "calls",
             "bytes", "estimated us", "measured us");
  for (const SummaryRow& r : rows) {
    fmt::print("{:<18} {:<10} {:>8} {:>14} {:>14.1f} {:>14.1f}\n", r.op, r.dim, r.calls, r.bytes,
               r.estimate_us, r.measured_us);
  }
  fmt::print("{:<18} {:<10} {:>8} {:>14} {:>14.1f} {:>14.1f}\n", "total", "", total.calls,
             total.bytes, total.estimate_us, total.measured_us);
  return 0;
}

[[noreturn]] void needs_debug_module(const char* what) {
  throw_error<Unsupported>(
      "{} is not in this build yet: it is built on debug/trace_diff.h and debug/trace_file.h, "
      "which land with the debug module",
      what);
}

}  // namespace

Command add_trace_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand("trace", "Read the trace files --spmd-trace writes");
  app->require_subcommand(1);

  auto summary = std::make_shared<TraceOptions>();
  CLI::App* summary_app = app->add_subcommand(
      "summary", "Per collective and mesh dim: calls, bytes, estimated and measured time");
  summary_app->add_option("files", summary->files, "Trace files (per-rank files together)")
      ->required();
  summary_app->add_flag("--json", summary->json, "Machine-readable output");

  auto diff = std::make_shared<TraceOptions>();
  CLI::App* diff_app =
      app->add_subcommand("diff", "Where two traces part ways, rank by rank (exit 1 if they do)");
  diff_app->add_option("files", diff->files, "Trace A and trace B")->required()->expected(2);
  diff_app->add_flag("--json", diff->json, "Machine-readable output");

  auto convert = std::make_shared<TraceOptions>();
  CLI::App* convert_app =
      app->add_subcommand("convert", "Merge trace or flight-recorder files into one trace file");
  convert_app->add_option("files", convert->files, "Input files, then the output file")
      ->required()
      ->expected(2, 1 << 20);

  // The lambda owns every options struct CLI11 writes into, used or not.
  return {app, [summary_app, diff_app, summary, diff, convert]() -> int {
            if (summary_app->parsed()) return run_summary(*summary);
            if (diff_app->parsed()) needs_debug_module("spmd trace diff");
            needs_debug_module("spmd trace convert");
          }};
}

}  // namespace spmd::cli
