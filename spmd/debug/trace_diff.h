// spmd/debug/trace_diff.h: where two traces of one program part ways, rank by rank: the simulator's
// expected sequence of collectives against a cluster's trace or flight-recorder dump, or two runs.
//
//   TraceDiff d = diff_traces("sim.json", "/tmp/spmd_flight_recorder.ompi42.json");  // rank files
//   fmt::print("{}", d.to_string());
//   return d.identical() ? 0 : 1;
//
// For each rank present in either trace, its records are compared in issue order on op, mesh
// dim, group ranks, shape, dtype, detail (the options) and sequence number; times, bytes, the
// estimate and the source location are not compared (the location is printed). The records of a
// ragged collective (all_to_all_single, Note [Ragged collectives]) leave detail out: it lists the
// split sizes of every rank the recording process held, so a sim trace and a one-rank dump spell
// it differently. When one side's history is truncated (a
// flight recorder keeps only the last N calls; TraceFile::truncated), its first record is aligned
// with the record of the same mesh dim, group and sequence number on the other side, and the
// comparison starts there.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <spmd/collectives/trace.h>
#include <spmd/debug/trace_file.h>

namespace spmd {

struct TraceRankDiff {
  enum class Kind {
    Same,        // every record agrees (after alignment)
    Differs,     // record `index` differs; `fields` says in what
    EndsEarlyA,  // a has no record `index` (b goes on with `b`)
    EndsEarlyB,  // b has no record `index` (a goes on with `a`)
    OnlyInA,     // b has no record of this rank
    OnlyInB,     // a has no record of this rank
    NoOverlap,   // a truncated side's first record does not occur on the other side
  };
  int rank = 0;
  Kind kind = Kind::Same;
  std::size_t compared = 0;  // records that agreed before the difference
  std::size_t index_a = 0;   // position of the first differing record in a's records of the rank
  std::size_t index_b = 0;   // ... and in b's
  std::optional<TraceRecord> a;  // a's record there (or the last one, when a ended early)
  std::optional<TraceRecord> b;
  std::vector<std::string> fields;  // "op", "dim", "group", "shape", "dtype", "detail", "seq"
};

struct TraceDiff {
  std::string name_a;  // the paths (or names) given
  std::string name_b;
  std::size_t records_a = 0;
  std::size_t records_b = 0;
  std::vector<TraceRankDiff> ranks;  // ascending rank

  bool identical() const;
  // A report: one line per rank that agrees, a few lines per rank that does not, e.g.
  //   rank 1: first difference at record 4 (after 4 equal):
  //     a: seq 2 all_reduce 'tp' group [0, 1] [4] f32 op=sum at train.cpp:12 (completed, 3.1 us)
  //     b: seq 2 all_gather 'tp' group [0, 1] [4] f32 gather_dim=0 at train.cpp:14 (pending)
  //     differs in: op, detail
  std::string to_string() const;
};

// Reads both (read_trace_file: a file, a folder, or per-rank files) and compares them.
// ConfigError when either cannot be read.
TraceDiff diff_traces(const std::string& path_a, const std::string& path_b);
TraceDiff diff_traces(const TraceFile& a, const TraceFile& b, std::string name_a = "a",
                      std::string name_b = "b");

}  // namespace spmd
