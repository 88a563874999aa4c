// spmd/debug/value_dump.h: every DTensor's values per call site, written by a run on any backend
// and compared between two runs (`spmd parity A B`).
//
// Note [Value dumps]
// --spmd-dump-values=DIR (SPMD_DUMP_VALUES; every backend) writes, at the call sites the parity
// run compares (Note [Parity run] in debug/parity.h: table ops, redistribute, from_local,
// full_tensor, the gradient at a to_local, an optimizer step's gradients and new values; not the
// calls nested in another public call), each held rank's piece of the DTensor made there, one JSON
// object per line in DIR/values.rank<R>.jsonl:
//   {"seq": 17, "file": "/src/train.cpp", "line": 42, "op": "matmul", "occurrence": 3,
//    "mesh": 0, "shape": [8, 16], "dtype": "f32", "placements": "S(0),P", "rank": 5,
//    "offset": [4, 0], "size": [4, 16], "stride": 1, "reduce": "sum", "values": [...]}
// `mesh` is the smallest rank of the DTensor's mesh and `occurrence` counts the (file, line, op)
// on that mesh per process from 0 (a line that runs on each pipeline stage's mesh counts each
// stage's calls apart, so a sim run's dump and one process's per stage agree); `seq` counts the
// process's records (program order). Two dumps are matched by site, the mesh's index among the
// meshes the site ran on (by smallest rank) and occurrence. `offset` and `size` place the piece in
// the global tensor; pieces of replicas (a coordinate other than 0 along a Replicate mesh dim) are
// not written. Along Partial mesh dims the pieces combine by `reduce` (sum; an avg piece is written
// divided by its group size, so it sums too; max, min). `values` holds the piece's elements whose
// global row-major index is a multiple of `stride` (1 unless the global tensor has more than
// kParitySampleLimit elements), in the piece's row-major order; "nan", "inf" and "-inf" are
// strings. Under sim one process writes every rank's file. read_value_dump() assembles each (file,
// line, op, occurrence) into its global value; compare_value_dumps() reports the first that
// departs, as the parity run does, so a run on a cluster can be held against a run on one GPU (or a
// sim run) of the same program.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spmd/debug/parity.h>
#include <spmd/world/world.h>

namespace spmd {

// Starts writing `world`'s DTensors into `dir` (created if missing); they are written while the
// returned token lives (set_debug keeps it with the world). ConfigError when `dir` cannot be
// created or written.
std::shared_ptr<const void> start_value_dump(const World& world, const std::string& dir);

// One call site's global value in a dump.
struct DumpedValue {
  std::string file;
  uint32_t line = 0;
  std::string op;
  uint64_t occurrence = 0;  // of (file, line, op) on this mesh
  int64_t mesh = 0;         // the mesh's smallest rank
  uint64_t seq = 0;         // the smallest of its records'
  ParityValue value;
};

// Every value of the dump in `dir` (its values.rank*.jsonl files), assembled from the pieces, in
// program order. ConfigError naming the file and line for a missing folder, no files, or a record
// that does not parse.
std::vector<DumpedValue> read_value_dump(const std::string& dir);

// What compare_value_dumps found.
struct DumpComparison {
  size_t compared = 0;
  size_t other_shape = 0;  // a global shape or dtype that differs
  size_t only_one = 0;     // a site occurrence one dump has and the other lacks
  // The first departure (in `a`'s program order), as a sentence naming the site, the worst index,
  // both values and the last site that agreed; empty when none.
  std::string departure;
};

// Compares dump `a` (the run under test) with `b` (the reference: one GPU, sim on one rank),
// tolerance as parity_tolerance (`tol` above 0 for every float dtype).
DumpComparison compare_value_dumps(const std::vector<DumpedValue>& a,
                                   const std::vector<DumpedValue>& b, double tol = 0.0);

}  // namespace spmd
