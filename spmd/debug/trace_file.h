// spmd/debug/trace_file.h: trace files on disk: Chrome trace JSON written by --spmd-trace
// (Trace::to_chrome_json) and flight-recorder dumps (Note [Flight recorder] in
// collectives/trace.h), read back into the TraceRecords they were written from. The `spmd trace`
// subcommands (summary, convert, diff) are built on these; the writing half
// (chrome_trace_json, write_trace_file, summary_table) is collectives/trace_export.h.
//
//   TraceFile t = read_trace_file("trace.json");        // or trace.rank*.json, or a folder
//   fmt::print("{}", summary_table(t.records));
//   write_trace_file("merged.json", t.records, t.info);
//
// The file format: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}. One
// thread_name metadata event ("ph": "M") per rank, then one event per (rank, call): "name" the
// collective, "cat" the mesh dim, "pid" 0, "tid" the rank, "ts" the start in microseconds since
// the process's trace epoch, "ph": "X" with "dur" for a finished call or "ph": "i" for one that
// never finished, and "args": {"seq", "dim", "detail", "group", "shape", "dtype", "bytes", "file",
// "line", "function", "estimate_us", "state"} (state "completed" or "pending"). "otherData" holds
// TraceFileInfo's fields: "producer": "spmdsim", "kind", and where known "reason", "ranks",
// "world_size", "backend", "capacity", "first_event".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>

namespace spmd {

// One or more files read as one trace.
struct TraceFile {
  std::vector<std::string> paths;    // the files read, in order
  std::vector<TraceFileInfo> infos;  // one per file
  // Every record, by rank, then in issue order within each rank (as Trace::records()).
  std::vector<TraceRecord> records;
  // The pipeline's compute spans (events of category "pipeline", Note [Pipeline context]).
  std::vector<ComputeSpan> spans;

  // The ranks with records, ascending.
  std::vector<int> ranks() const;
  // Whether the file holding `rank`'s records dropped older events (first_event > 0): its
  // records are then the tail of that rank's history.
  bool truncated(int rank) const;
  // The records of one rank, in issue order.
  std::vector<TraceRecord> records_of(int rank) const;
};

// Reads `path`: a trace or flight-recorder file; a folder (every *.json file in it); or a path
// that does not exist but whose per-rank files do (trace.json -> trace.rank0.json,
// trace.rank1.json, ... as Note [Trace files] names them), which must then hold every rank of the
// world once (Note [Per-rank trace files] in trace_file.cpp). ConfigError naming the path when
// nothing is found, a per-rank file is missing or repeats a rank, or a file is not such JSON, and
// naming the event and the field when an event is malformed (not an object, no name, a field of
// the wrong type, a negative rank, time or size).
TraceFile read_trace_file(const std::string& path);
// The same from the text of one file (`source` names it in errors).
TraceFile parse_trace_json(std::string_view text, const std::string& source = "<text>");

}  // namespace spmd
