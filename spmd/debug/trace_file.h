// spmd/debug/trace_file.h: trace files on disk: Chrome trace JSON written by --spmd-trace
// (Trace::to_chrome_json) and flight-recorder dumps (Note [Flight recorder] in
// collectives/trace.h), read back into the TraceRecords they were written from. The `spmd trace`
// subcommands (summary, convert, diff) are built on these.
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

namespace spmd {

// What a file says about itself ("otherData").
struct TraceFileInfo {
  std::string kind = "trace";  // "trace" or "flight_recorder"
  std::string reason;          // why a flight recorder was dumped
  std::vector<int> ranks;      // the ranks whose records the file holds
  int world_size = 0;          // 0: not recorded
  std::string backend;         // "sim", "mpi", ...; empty: not recorded
  uint64_t capacity = 0;       // the ring's capacity in events (0: unlimited or not recorded)
  uint64_t first_event = 0;    // events dropped before the first one in the file
};

// One or more files read as one trace.
struct TraceFile {
  std::vector<std::string> paths;    // the files read, in order
  std::vector<TraceFileInfo> infos;  // one per file
  // Every record, by rank, then in issue order within each rank (as Trace::records()).
  std::vector<TraceRecord> records;

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
// trace.rank1.json, ... as Note [Trace files] names them). ConfigError naming the path when
// nothing is found or a file is not such JSON.
TraceFile read_trace_file(const std::string& path);
// The same from the text of one file (`source` names it in errors).
TraceFile parse_trace_json(std::string_view text, const std::string& source = "<text>");

// The Chrome trace JSON of `records` (Trace::to_chrome_json writes this for its records).
std::string chrome_trace_json(std::span<const TraceRecord> records, const TraceFileInfo& info);
// Writes it; ConfigError when the file cannot be written.
void write_trace_file(const std::string& path, std::span<const TraceRecord> records,
                      const TraceFileInfo& info);

// Per op and mesh dim, in first-seen order: calls (one per group and sequence number), bytes
// (every rank's input), the cost model's estimate (once per call) and the measured time (the
// slowest rank of each finished call), and a total. The columns of Trace::summary_table.
std::string summary_table(std::span<const TraceRecord> records);

// One line: "seq 3 all_reduce 'tp' group [0, 1] [4, 8] f32 op=sum at train.cpp:42 (completed,
// 12.5 us)".
std::string format_record(const TraceRecord& record);

}  // namespace spmd
