// spmd/collectives/trace_export.h: the trace's records as files and text: Chrome trace JSON
// (Trace::to_chrome_json, --spmd-trace, the flight recorder's dump) and the per-op summary table.
// debug/trace_file.h reads such files back; its header comment gives the format.
//
//   trace().to_chrome_json("trace.json");          // opens in Perfetto
//   fmt::print("{}", trace().summary_table());
//   write_trace_file("mine.json", trace().records(), TraceFileInfo{});
#pragma once

#include <cstdint>
#include <span>
#include <string>
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

// The Chrome trace JSON of `records` (Trace::to_chrome_json writes this for its records), with the
// pipeline's compute spans (Note [Pipeline context]) as events of category "pipeline" on one
// process per stage ("stage 1", a track per rank).
std::string chrome_trace_json(std::span<const TraceRecord> records, const TraceFileInfo& info,
                              std::span<const ComputeSpan> spans = {});
// Writes it; ConfigError when the file cannot be written.
void write_trace_file(const std::string& path, std::span<const TraceRecord> records,
                      const TraceFileInfo& info, std::span<const ComputeSpan> spans = {});

// The schedule as it ran: one row per rank, one column per tick, each cell the action's phase and
// microbatch ("F3", "B0", "W12") or "." when the rank was idle, then each rank's idle share and
// the bubble (idle cells over all cells). Empty when there are no spans.
//
//   rank 0  F0 F1 B0 F2 B1 B2  .  .   idle 25%
std::string schedule_picture(std::span<const ComputeSpan> spans);

// Per op and mesh dim, in first-seen order: calls (one per group and sequence number), bytes
// (every rank's input), the cost model's estimate (once per call) and the measured time (the
// slowest rank of each finished call), and a total. The columns of Trace::summary_table.
std::string summary_table(std::span<const TraceRecord> records);

// One line: "seq 3 all_reduce 'tp' group [0, 1] [4, 8] f32 op=sum at train.cpp:42 (completed,
// 12.5 us)".
std::string format_record(const TraceRecord& record);

// The file of this process's ranks for a trace written to `path` (Note [Trace files] in
// runtime/launch.h): `path` itself when `world` holds every rank, else the held rank(s) inserted
// before the extension: trace.json -> trace.rank3.json, trace -> trace.rank3.
std::string trace_file_for(const World& world, const std::string& path);
// Writes this process's trace as Chrome trace JSON to trace_file_for(world, path), its otherData
// naming the world's size and backend and, in a per-rank file, every rank the world holds (a
// reader then tells a missing rank's file from a rank without collectives). Returns the file.
// ConfigError when it cannot be written. What launch() does for --spmd-trace.
std::string write_world_trace(const World& world, const std::string& path);

}  // namespace spmd
