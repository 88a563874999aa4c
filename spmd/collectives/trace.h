// spmd/collectives/trace.h: the record of every collective this process issued.
//
// Every backend's collectives are recorded by the functional layer (collectives/functional.h):
// one TraceEvent per call, holding each participating rank's group and per-group sequence number.
// records() expands events into one TraceRecord per (rank, call): the schema shared by the Chrome
// trace export, the summary table, the flight-recorder dump and `spmd trace diff` (debug/).
// Under real backends the trace is a ring buffer of the last N events (the flight recorder).
//
// Note [Flight recorder]
// Under a real backend (mpi, nccl) launch() keeps the last SPMD_FLIGHT_RECORDER_SIZE events
// (default 2000; 0 turns the recorder off) unless --spmd-trace asks for all of them, and when
// the program fails it dumps them: dump_flight_recorder(world, reason) writes this process's
// records, oldest first, to
//   $SPMD_FLIGHT_RECORDER_DIR/spmd_flight_recorder.<job>.rank3.<UTC time>.json
// (the directory defaulting to $TMPDIR, else /tmp; created when missing), and prints the file's
// path and the last few records to stderr. <job> is the launcher's job id (LauncherInfo::job_id:
// mpirun's jobid, srun's job and step, spmdrun's launch), else "pid<pid>", so two jobs on one
// host, or one job's runs one after another, never overwrite each other's dumps, while one job's
// dumps are the per-rank files of $SPMD_FLIGHT_RECORDER_DIR/spmd_flight_recorder.<job>.json
// (debug/trace_file.h reads them together; the report names that path). SPMD_FLIGHT_RECORDER_FILE
// overrides all of this with one path, the rank inserted as for trace files
// (fr.json -> fr.rank3.json, rewritten by every run). The NCCL watchdog calls it on a timeout. The
// file is the Chrome trace JSON of
// Trace::to_chrome_json (it opens in Perfetto) with the same record args, plus
//   "state": "completed" | "pending"   per record (pending: issued, never finished: a hang shows
//                                     up as each rank's last, pending, call)
//   "otherData": {"producer": "spmdsim", "kind": "flight_recorder", "reason": "...",
//                 "ranks": [3], "world_size": 8, "backend": "mpi", "capacity": 2000,
//                 "first_event": 1234}
// where first_event is the number of this process's events dropped before the oldest one in
// the file (non-zero: the history is truncated). debug/trace_file.h reads such files back and
// debug/trace_diff.h compares them with another run's trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/mesh/group_family.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/shape.h>

namespace spmd {

class World;  // world/world.h

// Note [Pipeline context]
// The pipeline stage and microbatch this thread works on: spmd::pipeline's runner sets them around
// each action of a schedule (PipelineContextScope). Every collective traced meanwhile carries them
// (TraceEvent, TraceRecord: `spmd trace diff` then tells a stage that received microbatch 4 where
// the reference received 3), and the actions themselves are recorded as compute spans
// (Trace::add_span): Perfetto draws them on a track per stage, and the trace's summary draws the
// schedule as it ran (ranks x ticks). -1: not inside a pipeline action.
struct PipelineContext {
  int stage = -1;
  int microbatch = -1;
  char phase = 0;  // the action: 'F', 'B', 'I', 'W'; 0 when not said
};
PipelineContext pipeline_context();

class PipelineContextScope {
 public:
  PipelineContextScope(int stage, int microbatch, char phase = 0);
  ~PipelineContextScope();
  PipelineContextScope(const PipelineContextScope&) = delete;
  PipelineContextScope& operator=(const PipelineContextScope&) = delete;

 private:
  PipelineContext saved_;
};

// One action of a pipeline schedule as it ran on one rank (Note [Pipeline context]).
struct ComputeSpan {
  int rank = 0;
  int stage = -1;
  int microbatch = -1;
  char phase = 'F';   // F forward, B backward, I input gradient, W weight gradient
  int64_t tick = -1;  // the action's column in the schedule's picture
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool operator==(const ComputeSpan&) const = default;
};

// One rank's part in one collective call.
struct TraceParticipant {
  int rank = 0;
  int64_t group = 0;      // index of the rank's group in the family
  uint64_t sequence = 0;  // per-group sequence number
};

// One call of a collective by this process.
struct TraceEvent {
  uint64_t comm_id = 0;
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::string dim_name;
  std::string detail;  // the options, e.g. "op=sum"
  // The family (a handle: its groups are materialized once and shared, not copied per call).
  std::optional<GroupFamily> family;
  std::vector<TraceParticipant> participants;
  // The number of participants, also when the list is not kept (Trace::set_keep_participants).
  int64_t participant_count = 0;
  Shape shape;                     // the participants' input shape
  std::vector<Shape> rank_shapes;  // one per participant when their shapes differ, else empty
  DType dtype = DType::F32;
  int64_t bytes = 0;  // input bytes of one rank (the first participant)
  const char* file = "";
  const char* function = "";
  uint32_t line = 0;
  int64_t start_ns = 0;  // since the trace's epoch
  int64_t end_ns = 0;    // 0 while an async call is pending
  // Note [Pipeline context]: set by Trace::begin from the issuing thread's context.
  int stage = -1;
  int microbatch = -1;
  char phase = 0;
  double estimate_us = 0.0;
};

// One rank's view of one call: the flat schema every exporter writes.
struct TraceRecord {
  int rank = 0;
  uint64_t sequence = 0;
  std::string op;        // "all_reduce"
  std::string dim_name;  // "tp"
  std::string detail;    // "op=sum"
  std::vector<int> group_ranks;
  Shape shape;
  std::string dtype;
  int64_t bytes = 0;
  std::string file;
  uint32_t line = 0;
  std::string function;
  double start_us = 0.0;
  double end_us = 0.0;
  double estimate_us = 0.0;
  int stage = -1;  // Note [Pipeline context]; -1: none
  int microbatch = -1;

  bool operator==(const TraceRecord&) const = default;
};

// Totals per (op, mesh dim) over every event since the last clear(), dropped ones included.
struct TraceSummaryRow {
  std::string op;
  std::string dim_name;
  int64_t count = 0;         // calls (one per process call, not per rank)
  int64_t bytes = 0;         // sum of per-rank input bytes
  double estimate_us = 0.0;  // sum of cost-model estimates
  double measured_us = 0.0;  // sum of wall time of finished calls
};

class Trace {
 public:
  Trace();
  // An empty trace with `like`'s settings (capacity, enabled, participants) and clock, so events
  // it records can join `like` (append).
  static std::unique_ptr<Trace> like(const Trace& like);

  // Appends an event and returns its id (for finish()).
  uint64_t begin(TraceEvent event);
  // Sets the end time of event `id` (if it is still held).
  void finish(uint64_t id);
  // Nanoseconds since this trace's epoch.
  int64_t now_ns() const;

  // Keeps at most `events` events, dropping the oldest (0 = unlimited). The default is
  // kDefaultCapacity; launch() makes it unlimited when a trace file is requested.
  static constexpr std::size_t kDefaultCapacity = 1 << 16;
  void set_capacity(std::size_t events);
  std::size_t capacity() const;
  void set_enabled(bool enabled);
  bool enabled() const;
  // Whether events list their participants (default yes). A dry run over thousands of ranks
  // turns it off: events then keep one record's worth (op, dim, shape, bytes, estimate) and
  // records() has nothing for them; summaries still count every participant's bytes.
  void set_keep_participants(bool keep);
  bool keeps_participants() const;
  void clear();
  // Adds `other`'s events and spans after this trace's (as if recorded here, in their order) and
  // its summary rows to this one's. `other` must share this trace's clock (Trace::like).
  void append(const Trace& other);

  // Records one pipeline action as it ran (Note [Pipeline context]); kept while the trace is
  // enabled, at most capacity() of them (the oldest go first).
  void add_span(ComputeSpan span);
  std::vector<ComputeSpan> spans() const;

  std::vector<TraceEvent> events() const;
  std::size_t num_events() const;
  // Events dropped (capacity) or cleared before the oldest one held: the id of that event.
  uint64_t first_event_id() const;
  // One record per (participating rank, call), ordered by rank, then by issue order.
  std::vector<TraceRecord> records() const;
  // Running totals, in first-seen order.
  std::vector<TraceSummaryRow> summary() const;

  // Writes Chrome trace JSON (one track per rank; opens in Perfetto and chrome://tracing;
  // collectives/trace_export.h). ConfigError when the file cannot be written.
  void to_chrome_json(const std::string& path) const;
  std::string to_chrome_json_string() const;
  // Per op and mesh dim: count, bytes, estimated time on the configured topology.
  std::string summary_table() const;

 private:
  TraceSummaryRow& summary_row(CollectiveKind kind, const std::string& dim_name);

  // The event with logical index i (0 = oldest held) is ring_[(head_ + i) % ring_.size()].
  const TraceEvent& at(std::size_t i) const { return ring_[(head_ + i) % ring_.size()]; }

  mutable std::mutex mutex_;
  std::vector<TraceEvent> ring_;  // grows to capacity_, then the oldest slot is reused
  std::size_t head_ = 0;          // physical index of the oldest event
  uint64_t first_id_ = 0;         // id of the oldest event
  std::size_t capacity_ = kDefaultCapacity;
  std::vector<TraceSummaryRow> summary_;
  std::vector<ComputeSpan> spans_;
  bool enabled_ = true;
  bool keep_participants_ = true;
  int64_t epoch_ns_ = 0;
};

// Note [Traces of rank threads]
// Under the threads backend each rank thread records into a trace of its own, so what a rank reads
// or clears (trace().records(), trace().clear()) is its own history, as in a process of a real
// backend; when the rank threads end, launch() appends their traces, rank by rank, to the process
// trace, which the trace file and a program after launch() read.

// The trace this thread records into: its rank thread's (a TraceScope), else the process's.
Trace& trace();
// The process's trace, whatever thread asks.
Trace& process_trace();

// Makes `t` the trace of this thread while it lives (launch() gives each rank thread one).
class TraceScope {
 public:
  explicit TraceScope(Trace& t);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* previous_;
};

// ---- the flight recorder (Note [Flight recorder]; collectives/flight_recorder.cpp) ----------

// SPMD_FLIGHT_RECORDER_SIZE, or 2000 when unset. ConfigError for a value that is not a
// non-negative integer.
std::size_t flight_recorder_size();
// The file dump_flight_recorder writes for `world`'s ranks now (Note [Flight recorder]).
std::string flight_recorder_file(const World& world);
// Where dumps go: SPMD_FLIGHT_RECORDER_DIR, else TMPDIR, else /tmp.
std::string flight_recorder_dir();
// The job's name in dump files: the launcher's job id, else "pid<pid>".
std::string flight_recorder_job();
// Writes the last flight_recorder_size() events of the ranks `world` holds to
// flight_recorder_file(world) and prints the last few to stderr, each line prefixed with the
// rank, `reason` (e.g. "timeout after 600 s in all_reduce over 'tp'") first. Returns the path
// written, or "" when the recorder is off (size 0) or the file cannot be written (said on stderr:
// a dump happens on a failure path and never throws). Safe to call from a watchdog thread while
// other threads record.
std::string dump_flight_recorder(const World& world, std::string_view reason);

}  // namespace spmd
