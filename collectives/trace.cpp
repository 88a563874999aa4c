// collectives/trace.cpp: recording of trace events and their expansion into per-rank records.
// The exporters (Chrome JSON, summary table) live in debug/.
#include "collectives/trace.h"

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

int64_t Trace::now_ns() const { return steady_ns() - epoch_ns_; }

TraceSummaryRow& Trace::summary_row(CollectiveKind kind, const std::string& dim_name) {
  const std::string_view op = collective_name(kind);
  for (TraceSummaryRow& row : summary_) {
    if (row.op == op && row.dim_name == dim_name) return row;
  }
  summary_.push_back(TraceSummaryRow{std::string(op), dim_name});
  return summary_.back();
}

uint64_t Trace::begin(TraceEvent event) {
  std::lock_guard lock(mutex_);
  if (!enabled_) return UINT64_MAX;
  TraceSummaryRow& row = summary_row(event.kind, event.dim_name);
  row.count += 1;
  row.bytes += event.bytes * static_cast<int64_t>(event.participants.size());
  row.estimate_us += event.estimate_us;
  if (capacity_ != 0 && events_.size() >= capacity_) {
    events_.pop_front();
    ++first_id_;
  }
  events_.push_back(std::move(event));
  return first_id_ + events_.size() - 1;
}

void Trace::finish(uint64_t id) {
  const int64_t now = now_ns();
  std::lock_guard lock(mutex_);
  if (id < first_id_ || id >= first_id_ + events_.size()) return;
  TraceEvent& e = events_[id - first_id_];
  e.end_ns = now;
  summary_row(e.kind, e.dim_name).measured_us += static_cast<double>(now - e.start_ns) / 1e3;
}

void Trace::set_capacity(std::size_t events) {
  std::lock_guard lock(mutex_);
  capacity_ = events;
  while (capacity_ != 0 && events_.size() > capacity_) {
    events_.pop_front();
    ++first_id_;
  }
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

void Trace::clear() {
  std::lock_guard lock(mutex_);
  first_id_ += events_.size();
  events_.clear();
  summary_.clear();
}

std::vector<TraceSummaryRow> Trace::summary() const {
  std::lock_guard lock(mutex_);
  return summary_;
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard lock(mutex_);
  return {events_.begin(), events_.end()};
}

std::size_t Trace::num_events() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::vector<TraceRecord> Trace::records() const {
  std::vector<TraceEvent> snapshot = events();
  std::vector<TraceRecord> out;
  for (const TraceEvent& e : snapshot) {
    for (const TraceParticipant& p : e.participants) {
      TraceRecord r;
      r.rank = p.rank;
      r.sequence = p.sequence;
      r.op = std::string(collective_name(e.kind));
      r.dim_name = e.dim_name;
      r.detail = e.detail;
      if (e.family && p.group >= 0 && p.group < e.family->num_groups()) {
        r.group_ranks = e.family->groups()[static_cast<size_t>(p.group)];
      }
      r.shape = p.shape;
      r.dtype = std::string(dtype_name(e.dtype));
      r.bytes = e.bytes;
      r.file = e.file;
      r.line = e.line;
      r.function = e.function;
      r.start_us = static_cast<double>(e.start_ns) / 1e3;
      r.end_us = static_cast<double>(e.end_ns) / 1e3;
      r.estimate_us = e.estimate_us;
      out.push_back(std::move(r));
    }
  }
  // Per rank, in issue order (stable: events are already in issue order).
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

Trace& trace() {
  static Trace instance;
  return instance;
}

}  // namespace spmd
