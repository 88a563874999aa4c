// spmd/debug/trace_diff.cpp: the per-rank comparison of two traces (debug/trace_diff.h).
#include <spmd/debug/trace_diff.h>

#include <algorithm>
#include <string_view>

#include <spmd/collectives/types.h>

namespace spmd {
namespace {

using Kind = TraceRankDiff::Kind;

// A ragged collective's detail prints its per-rank values, which each backend holds differently
// (Note [Ragged collectives]).
bool ragged(std::string_view op) {
  const std::optional<CollectiveKind> kind = parse_collective(op);
  return kind.has_value() && is_ragged(*kind);
}

std::vector<std::string> differing_fields(const TraceRecord& a, const TraceRecord& b) {
  std::vector<std::string> out;
  if (a.op != b.op) out.push_back("op");
  if (a.dim_name != b.dim_name) out.push_back("dim");
  if (a.group_ranks != b.group_ranks) out.push_back("group");
  if (a.shape != b.shape) out.push_back("shape");
  if (a.dtype != b.dtype) out.push_back("dtype");
  if (a.detail != b.detail && !(a.op == b.op && ragged(a.op))) out.push_back("detail");
  if (a.sequence != b.sequence) out.push_back("seq");
  // Note [Pipeline context]: a stage that sends or receives another microbatch than the
  // reference is a difference even when every shape agrees.
  if (a.stage != b.stage) out.push_back("stage");
  if (a.microbatch != b.microbatch) out.push_back("microbatch");
  return out;
}

// The first position in `records` of the call `r` is (same mesh dim, group, sequence number).
std::optional<std::size_t> find_call(const std::vector<TraceRecord>& records,
                                     const TraceRecord& r) {
  for (std::size_t i = 0; i < records.size(); ++i) {
    const TraceRecord& x = records[i];
    if (x.sequence == r.sequence && x.dim_name == r.dim_name && x.group_ranks == r.group_ranks) {
      return i;
    }
  }
  return std::nullopt;
}

TraceRankDiff diff_rank(int rank, const std::vector<TraceRecord>& ra,
                        const std::vector<TraceRecord>& rb, bool truncated_a, bool truncated_b) {
  TraceRankDiff d;
  d.rank = rank;
  if (rb.empty()) {
    d.kind = Kind::OnlyInA;
    return d;
  }
  if (ra.empty()) {
    d.kind = Kind::OnlyInB;
    return d;
  }
  std::size_t ia = 0;
  std::size_t ib = 0;
  if (truncated_a || truncated_b) {
    // A truncated history is the tail of the other: start both at the later first record.
    std::optional<std::size_t> b_in_a = truncated_b ? find_call(ra, rb[0]) : std::nullopt;
    std::optional<std::size_t> a_in_b = truncated_a ? find_call(rb, ra[0]) : std::nullopt;
    if (b_in_a) {
      ia = *b_in_a;
    } else if (a_in_b) {
      ib = *a_in_b;
    } else {
      d.kind = Kind::NoOverlap;
      d.a = ra[0];
      d.b = rb[0];
      return d;
    }
  }
  d.index_a = ia;
  d.index_b = ib;
  for (; ia < ra.size() && ib < rb.size(); ++ia, ++ib, ++d.compared) {
    std::vector<std::string> fields = differing_fields(ra[ia], rb[ib]);
    if (!fields.empty()) {
      d.kind = Kind::Differs;
      d.index_a = ia;
      d.index_b = ib;
      d.a = ra[ia];
      d.b = rb[ib];
      d.fields = std::move(fields);
      return d;
    }
  }
  d.index_a = ia;
  d.index_b = ib;
  if (ia < ra.size()) {
    d.kind = Kind::EndsEarlyB;
    d.a = ra[ia];
    d.b = rb.back();
  } else if (ib < rb.size()) {
    d.kind = Kind::EndsEarlyA;
    d.a = ra.back();
    d.b = rb[ib];
  }
  return d;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

bool TraceDiff::identical() const {
  return std::all_of(ranks.begin(), ranks.end(),
                     [](const TraceRankDiff& r) { return r.kind == Kind::Same; });
}

std::string TraceDiff::to_string() const {
  std::string out = fmt::format("trace diff: a = {} ({} records), b = {} ({} records)\n", name_a,
                                records_a, name_b, records_b);
  std::size_t differing = 0;
  for (const TraceRankDiff& r : ranks) {
    const std::string aligned = r.index_a != r.index_b
                                    ? fmt::format(" (aligned: a's record {} is b's record {})",
                                                  r.index_a - r.compared, r.index_b - r.compared)
                                    : "";
    switch (r.kind) {
      case Kind::Same:
        out += fmt::format("rank {}: the same {} records{}\n", r.rank, r.compared, aligned);
        continue;
      case Kind::Differs:
        out += fmt::format(
            "rank {}: first difference at record {} of a, {} of b (after {} equal)"
            "{}:\n  a: {}\n  b: {}\n  differs in: {}\n",
            r.rank, r.index_a, r.index_b, r.compared, aligned, format_record(*r.a),
            format_record(*r.b), join(r.fields));
        break;
      case Kind::EndsEarlyB:
        out += fmt::format(
            "rank {}: b ends after {} equal records{}; a goes on with:\n  a: {}\n"
            "  b's last: {}\n",
            r.rank, r.compared, aligned, format_record(*r.a), format_record(*r.b));
        break;
      case Kind::EndsEarlyA:
        out += fmt::format(
            "rank {}: a ends after {} equal records{}; b goes on with:\n  b: {}\n"
            "  a's last: {}\n",
            r.rank, r.compared, aligned, format_record(*r.b), format_record(*r.a));
        break;
      case Kind::OnlyInA:
        out += fmt::format("rank {}: only in a\n", r.rank);
        break;
      case Kind::OnlyInB:
        out += fmt::format("rank {}: only in b\n", r.rank);
        break;
      case Kind::NoOverlap:
        out += fmt::format(
            "rank {}: the truncated history does not overlap the other's first "
            "call:\n  a starts with: {}\n  b starts with: {}\n",
            r.rank, format_record(*r.a), format_record(*r.b));
        break;
    }
    ++differing;
  }
  out += differing == 0 ? "identical\n" : fmt::format("{} rank(s) differ\n", differing);
  return out;
}

TraceDiff diff_traces(const TraceFile& a, const TraceFile& b, std::string name_a,
                      std::string name_b) {
  TraceDiff out;
  out.name_a = std::move(name_a);
  out.name_b = std::move(name_b);
  out.records_a = a.records.size();
  out.records_b = b.records.size();
  std::vector<int> ranks = a.ranks();
  for (int r : b.ranks()) {
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  std::sort(ranks.begin(), ranks.end());
  for (int rank : ranks) {
    out.ranks.push_back(diff_rank(rank, a.records_of(rank), b.records_of(rank), a.truncated(rank),
                                  b.truncated(rank)));
  }
  return out;
}

TraceDiff diff_traces(const std::string& path_a, const std::string& path_b) {
  return diff_traces(read_trace_file(path_a), read_trace_file(path_b), path_a, path_b);
}

}  // namespace spmd
