// tools/spmd/trace_command.cpp: `spmd trace`, the trace files --spmd-trace writes and the
// flight-recorder dumps (debug/trace_file.h reads both; a FILE may also be a folder, or a path
// whose per-rank files trace.rank0.json, trace.rank1.json, ... exist).
//
//   spmd trace summary FILE... [--json]   per collective and mesh dim: calls, bytes, the cost
//                                         model's estimate, the measured time
//   spmd trace diff A B [--json]          where two traces part ways, rank by rank; exit 1 if so
//   spmd trace convert FILE... OUT        the records of every FILE as one trace file
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <spmd/debug/trace_diff.h>
#include <spmd/debug/trace_file.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct TraceOptions {
  std::vector<std::string> files;
  bool json = false;
};

// Every FILE read as one trace, records by rank then in issue order (the order TraceFile keeps).
TraceFile read_all(const std::vector<std::string>& files) {
  TraceFile all;
  for (const std::string& f : files) {
    TraceFile part = read_trace_file(f);
    all.paths.insert(all.paths.end(), part.paths.begin(), part.paths.end());
    all.infos.insert(all.infos.end(), part.infos.begin(), part.infos.end());
    all.records.insert(all.records.end(), part.records.begin(), part.records.end());
  }
  std::stable_sort(all.records.begin(), all.records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return all;
}

// The rows of summary_table (collectives/trace_export.cpp) as values for --json: per (op, dim) in
// first-seen order, one call per (group, sequence number) with its estimate once and its slowest
// rank's time, and every rank's input bytes.
std::vector<TraceSummaryRow> summary_rows(const std::vector<TraceRecord>& records) {
  std::vector<TraceSummaryRow> rows;
  std::map<std::pair<std::string, std::string>, std::size_t> row_of;
  std::map<std::tuple<std::string, std::string, std::vector<int>, uint64_t>, double> slowest;
  for (const TraceRecord& r : records) {
    auto [it, fresh] = row_of.try_emplace({r.op, r.dim_name}, rows.size());
    if (fresh) rows.push_back(TraceSummaryRow{r.op, r.dim_name});
    TraceSummaryRow& row = rows[it->second];
    if (__builtin_add_overflow(row.bytes, r.bytes, &row.bytes)) {
      throw_error<ConfigError>(
          "trace summary: the bytes of {} over mesh dim '{}' add up to more than an int64 holds "
          "(a record of rank {} has {} bytes)",
          r.op, r.dim_name, r.rank, r.bytes);
    }
    const double took = r.end_us > 0.0 ? r.end_us - r.start_us : 0.0;
    auto [call, first] = slowest.try_emplace({r.op, r.dim_name, r.group_ranks, r.sequence}, took);
    if (first) {
      ++row.count;
      row.estimate_us += r.estimate_us;
    } else {
      call->second = std::max(call->second, took);
    }
  }
  for (const auto& [key, took] : slowest) {
    rows[row_of.at({std::get<0>(key), std::get<1>(key)})].measured_us += took;
  }
  return rows;
}

nlohmann::json row_json(const TraceSummaryRow& r) {
  return {{"op", r.op},
          {"dim", r.dim_name},
          {"calls", r.count},
          {"bytes", r.bytes},
          {"estimate_us", r.estimate_us},
          {"measured_us", r.measured_us}};
}

int run_summary(const TraceOptions& o) {
  const TraceFile trace = read_all(o.files);
  if (!o.json) {
    fmt::print("{} records of {} ranks from {}\n{}", trace.records.size(), trace.ranks().size(),
               fmt::join(trace.paths, ", "), summary_table(trace.records));
    if (const std::string picture = schedule_picture(trace.spans); !picture.empty()) {
      fmt::print("\npipeline schedule as it ran:\n{}", picture);
    }
    return 0;
  }
  const std::vector<TraceSummaryRow> rows = summary_rows(trace.records);
  TraceSummaryRow total{"total", ""};
  nlohmann::json doc;
  doc["files"] = trace.paths;
  doc["records"] = trace.records.size();
  doc["ranks"] = trace.ranks();
  doc["rows"] = nlohmann::json::array();
  for (const TraceSummaryRow& r : rows) {
    doc["rows"].push_back(row_json(r));
    total.count += r.count;
    if (__builtin_add_overflow(total.bytes, r.bytes, &total.bytes)) {
      throw_error<ConfigError>("trace summary: the total bytes add up to more than an int64 holds");
    }
    total.estimate_us += r.estimate_us;
    total.measured_us += r.measured_us;
  }
  doc["total"] = row_json(total);
  print_json(doc);
  return 0;
}

std::string_view kind_name(TraceRankDiff::Kind kind) {
  switch (kind) {
    case TraceRankDiff::Kind::Same:
      return "same";
    case TraceRankDiff::Kind::Differs:
      return "differs";
    case TraceRankDiff::Kind::EndsEarlyA:
      return "ends_early_a";
    case TraceRankDiff::Kind::EndsEarlyB:
      return "ends_early_b";
    case TraceRankDiff::Kind::OnlyInA:
      return "only_in_a";
    case TraceRankDiff::Kind::OnlyInB:
      return "only_in_b";
    case TraceRankDiff::Kind::NoOverlap:
      return "no_overlap";
  }
  return "unknown";
}

int run_diff(const TraceOptions& o) {
  const TraceDiff d = diff_traces(o.files[0], o.files[1]);
  if (!o.json) {
    fmt::print("{}", d.to_string());
    return d.identical() ? 0 : 1;
  }
  nlohmann::json doc;
  doc["a"] = d.name_a;
  doc["b"] = d.name_b;
  doc["records_a"] = d.records_a;
  doc["records_b"] = d.records_b;
  doc["identical"] = d.identical();
  doc["ranks"] = nlohmann::json::array();
  for (const TraceRankDiff& r : d.ranks) {
    nlohmann::json rank = {{"rank", r.rank},
                           {"kind", kind_name(r.kind)},
                           {"compared", r.compared},
                           {"fields", r.fields}};
    if (r.kind != TraceRankDiff::Kind::Same) {
      rank["index_a"] = r.index_a;
      rank["index_b"] = r.index_b;
    }
    if (r.a) rank["record_a"] = format_record(*r.a);
    if (r.b) rank["record_b"] = format_record(*r.b);
    doc["ranks"].push_back(std::move(rank));
  }
  print_json(doc);
  return d.identical() ? 0 : 1;
}

int run_convert(const TraceOptions& o) {
  const std::vector<std::string> inputs(o.files.begin(), o.files.end() - 1);
  const std::string& output = o.files.back();
  const TraceFile trace = read_all(inputs);
  TraceFileInfo info;
  info.ranks = trace.ranks();
  for (const TraceFileInfo& i : trace.infos) {
    info.world_size = std::max(info.world_size, i.world_size);
    if (info.backend.empty()) info.backend = i.backend;
  }
  write_trace_file(output, trace.records, info);
  if (o.json) {
    print_json({{"inputs", trace.paths},
                {"output", output},
                {"records", trace.records.size()},
                {"ranks", info.ranks}});
  } else {
    fmt::print("wrote {}: {} records of {} ranks from {}\n", output, trace.records.size(),
               info.ranks.size(), fmt::join(trace.paths, ", "));
  }
  return 0;
}

}  // namespace

Command add_trace_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "trace", "Read the trace files --spmd-trace writes and flight-recorder dumps");
  app->require_subcommand(1);
  app->footer(
      "A FILE may be a trace file, a folder of them, or trace.json standing for its per-rank\n"
      "files trace.rank0.json, trace.rank1.json, ... (as mpirun runs write them).");

  auto summary = std::make_shared<TraceOptions>();
  CLI::App* summary_app = app->add_subcommand(
      "summary", "Per collective and mesh dim: calls, bytes, estimated and measured time");
  summary_app->add_option("files", summary->files, "Trace files")->required();
  summary_app->add_flag("--json", summary->json, "Machine-readable output");

  auto diff = std::make_shared<TraceOptions>();
  CLI::App* diff_app =
      app->add_subcommand("diff", "Where two traces part ways, rank by rank (exit 1 if they do)");
  diff_app->add_option("files", diff->files, "Trace A and trace B")->required()->expected(2);
  diff_app->add_flag("--json", diff->json, "Machine-readable output");

  auto convert = std::make_shared<TraceOptions>();
  CLI::App* convert_app = app->add_subcommand(
      "convert", "Write the records of trace or flight-recorder files as one trace file");
  convert_app->add_option("files", convert->files, "Input files, then the output file")
      ->required()
      ->expected(2, 1 << 20);
  convert_app->add_flag("--json", convert->json, "Machine-readable output");

  return {app, [summary_app, diff_app, summary, diff, convert] {
            if (summary_app->parsed()) return run_summary(*summary);
            if (diff_app->parsed()) return run_diff(*diff);
            return run_convert(*convert);
          }};
}

}  // namespace spmd::cli
