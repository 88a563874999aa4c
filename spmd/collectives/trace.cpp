// spmd/collectives/trace.cpp: recording of trace events and their expansion into per-rank records.
// The exporters (Chrome JSON, summary table) are collectives/trace_export.cpp.
#include <spmd/collectives/trace.h>

#include <algorithm>
#include <chrono>

namespace spmd {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Trace::Trace() : epoch_ns_(steady_ns()) {}

std::unique_ptr<Trace> Trace::like(const Trace& like) {
  auto out = std::make_unique<Trace>();
  std::lock_guard lock(like.mutex_);
  out->epoch_ns_ = like.epoch_ns_;
  out->capacity_ = like.capacity_;
  out->enabled_ = like.enabled_;
  out->keep_participants_ = like.keep_participants_;
  return out;
}

int64_t Trace::now_ns() const {
  return steady_ns() - epoch_ns_;
}

TraceSummaryRow& Trace::summary_row(CollectiveKind kind, const std::string& dim_name) {
  const std::string_view op = collective_name(kind);
  for (TraceSummaryRow& row : summary_) {
    if (row.op == op && row.dim_name == dim_name) return row;
  }
  summary_.push_back(TraceSummaryRow{std::string(op), dim_name});
  return summary_.back();
}

namespace {
thread_local PipelineContext t_pipeline;
}  // namespace

PipelineContext pipeline_context() {
  return t_pipeline;
}

PipelineContextScope::PipelineContextScope(int stage, int microbatch, char phase)
    : saved_(t_pipeline) {
  t_pipeline = PipelineContext{stage, microbatch, phase};
}

PipelineContextScope::~PipelineContextScope() {
  t_pipeline = saved_;
}

uint64_t Trace::begin(TraceEvent event) {
  if (event.stage < 0 && event.microbatch < 0) {
    event.stage = t_pipeline.stage;
    event.microbatch = t_pipeline.microbatch;
    event.phase = t_pipeline.phase;
  }
  std::lock_guard lock(mutex_);
  if (!enabled_) return UINT64_MAX;
  TraceSummaryRow& row = summary_row(event.kind, event.dim_name);
  row.count += 1;
  row.bytes += event.bytes * event.participant_count;
  row.estimate_us += event.estimate_us;
  if (capacity_ == 0 || ring_.size() < capacity_) {
    // Not wrapped yet: events are in order from index 0.
    ring_.push_back(std::move(event));
    return first_id_ + ring_.size() - 1;
  }
  ring_[head_] = std::move(event);
  head_ = (head_ + 1) % ring_.size();
  ++first_id_;
  return first_id_ + ring_.size() - 1;
}

void Trace::finish(uint64_t id) {
  const int64_t now = now_ns();
  std::lock_guard lock(mutex_);
  if (id < first_id_ || id >= first_id_ + ring_.size()) return;
  TraceEvent& e = ring_[(head_ + (id - first_id_)) % ring_.size()];
  e.end_ns = now;
  summary_row(e.kind, e.dim_name).measured_us += static_cast<double>(now - e.start_ns) / 1e3;
}

void Trace::set_capacity(std::size_t events) {
  std::lock_guard lock(mutex_);
  std::vector<TraceEvent> ordered;
  const std::size_t keep = events == 0 ? ring_.size() : std::min(events, ring_.size());
  ordered.reserve(keep);
  for (std::size_t i = ring_.size() - keep; i < ring_.size(); ++i) {
    ordered.push_back(std::move(ring_[(head_ + i) % ring_.size()]));
  }
  first_id_ += ring_.size() - keep;
  ring_ = std::move(ordered);
  head_ = 0;
  capacity_ = events;
}

std::size_t Trace::capacity() const {
  std::lock_guard lock(mutex_);
  return capacity_;
}

void Trace::set_enabled(bool enabled) {
  std::lock_guard lock(mutex_);
  enabled_ = enabled;
}

bool Trace::enabled() const {
  std::lock_guard lock(mutex_);
  return enabled_;
}

void Trace::set_keep_participants(bool keep) {
  std::lock_guard lock(mutex_);
  keep_participants_ = keep;
}

bool Trace::keeps_participants() const {
  std::lock_guard lock(mutex_);
  return keep_participants_;
}

void Trace::clear() {
  std::lock_guard lock(mutex_);
  first_id_ += ring_.size();
  ring_.clear();
  head_ = 0;
  summary_.clear();
  spans_.clear();
}

void Trace::add_span(ComputeSpan span) {
  std::lock_guard lock(mutex_);
  if (!enabled_) return;
  if (capacity_ != 0 && spans_.size() >= capacity_) spans_.erase(spans_.begin());
  spans_.push_back(span);
}

std::vector<ComputeSpan> Trace::spans() const {
  std::lock_guard lock(mutex_);
  return spans_;
}

void Trace::append(const Trace& other) {
  if (&other == this) return;
  const std::vector<TraceEvent> added = other.events();
  const std::vector<TraceSummaryRow> rows = other.summary();
  const std::vector<ComputeSpan> spans = other.spans();
  std::lock_guard lock(mutex_);
  spans_.insert(spans_.end(), spans.begin(), spans.end());
  for (const TraceEvent& e : added) {
    if (capacity_ == 0 || ring_.size() < capacity_) {
      ring_.push_back(e);
    } else {
      ring_[head_] = e;
      head_ = (head_ + 1) % ring_.size();
      ++first_id_;
    }
  }
  for (const TraceSummaryRow& r : rows) {
    auto it = std::find_if(summary_.begin(), summary_.end(), [&](const TraceSummaryRow& mine) {
      return mine.op == r.op && mine.dim_name == r.dim_name;
    });
    if (it == summary_.end()) {
      summary_.push_back(r);
      continue;
    }
    it->count += r.count;
    it->bytes += r.bytes;
    it->estimate_us += r.estimate_us;
    it->measured_us += r.measured_us;
  }
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceEvent> out;
  out.reserve(ring_.size());
  for (std::size_t i = 0; i < ring_.size(); ++i) out.push_back(at(i));
  return out;
}

std::size_t Trace::num_events() const {
  std::lock_guard lock(mutex_);
  return ring_.size();
}

uint64_t Trace::first_event_id() const {
  std::lock_guard lock(mutex_);
  return first_id_;
}

std::vector<TraceSummaryRow> Trace::summary() const {
  std::lock_guard lock(mutex_);
  return summary_;
}

std::vector<TraceRecord> Trace::records() const {
  std::vector<TraceEvent> snapshot = events();
  std::vector<TraceRecord> out;
  for (const TraceEvent& e : snapshot) {
    for (size_t i = 0; i < e.participants.size(); ++i) {
      const TraceParticipant& p = e.participants[i];
      TraceRecord r;
      r.rank = p.rank;
      r.sequence = p.sequence;
      r.op = std::string(collective_name(e.kind));
      r.dim_name = e.dim_name;
      r.detail = e.detail;
      if (e.family && p.group >= 0 && p.group < e.family->num_groups()) {
        r.group_ranks = e.family->groups()[static_cast<size_t>(p.group)];
      }
      r.shape = e.rank_shapes.empty() ? e.shape : e.rank_shapes[i];
      r.dtype = std::string(dtype_name(e.dtype));
      r.bytes = e.bytes;
      r.file = e.file;
      r.line = e.line;
      r.function = e.function;
      r.start_us = static_cast<double>(e.start_ns) / 1e3;
      r.end_us = static_cast<double>(e.end_ns) / 1e3;
      r.estimate_us = e.estimate_us;
      r.stage = e.stage;
      r.microbatch = e.microbatch;
      out.push_back(std::move(r));
    }
  }
  // Per rank, in issue order (stable: events are already in issue order).
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

namespace {
thread_local Trace* t_trace = nullptr;
}  // namespace

Trace& process_trace() {
  static Trace instance;
  return instance;
}

Trace& trace() {
  return t_trace != nullptr ? *t_trace : process_trace();
}

TraceScope::TraceScope(Trace& t) : previous_(t_trace) {
  t_trace = &t;
}

TraceScope::~TraceScope() {
  t_trace = previous_;
}

}  // namespace spmd
