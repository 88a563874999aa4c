// spmd/debug/trace_file.cpp: reading trace and flight-recorder files back into TraceRecords.
#include <spmd/debug/trace_file.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <spmd/core/error.h>
#include <spmd/core/format.h>

namespace spmd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A JSON value for a message: scalars as written (long strings cut), containers by their size
// (dumping one would recurse as deep as it nests).
std::string shown(const json& value) {
  if (value.is_array()) return fmt::format("an array of {} items", value.size());
  if (value.is_object()) return fmt::format("an object of {} keys", value.size());
  if (value.is_null()) return "missing";
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kShown = 80;
  if (text.size() > kShown) text = text.substr(0, kShown) + "...";
  return text;
}

// Reads the fields of one JSON object of a trace file, checking each value's type and range:
// ConfigError naming the file, the object (an event by its index, or otherData) and the field.
class FieldReader {
 public:
  FieldReader(const json& object, const std::string& source, std::string where)
      : object_(object), source_(source), where_(std::move(where)) {}

  const json* find(const char* key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::string string(const char* key, std::string fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(key, *v, "a string");
    return v->get<std::string>();
  }

  // An integer in [lo, hi].
  int64_t integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    return integer_value(key, *v, lo, hi);
  }

  uint64_t unsigned_integer(const char* key, uint64_t fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    if (v->is_number_integer() && v->get<int64_t>() >= 0) return v->get<uint64_t>();
    fail(key, *v, "a non-negative integer");
  }

  // A finite number >= 0.
  double non_negative(const char* key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0.0) {
      fail(key, *v, "a finite number >= 0");
    }
    return v->get<double>();
  }

  // A list of integers in [lo, hi].
  std::vector<int64_t> integers(const char* key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (v == nullptr) return {};
    if (!v->is_array()) fail(key, *v, fmt::format("a list of integers in [{}, {}]", lo, hi));
    std::vector<int64_t> out;
    out.reserve(v->size());
    for (const json& item : *v) {
      if (!is_integer_in(item, lo, hi)) {
        fail(key, *v, fmt::format("a list of integers in [{}, {}]", lo, hi));
      }
      out.push_back(item.is_number_unsigned() ? static_cast<int64_t>(item.get<uint64_t>())
                                              : item.get<int64_t>());
    }
    return out;
  }

  std::vector<int> ranks(const char* key) const {
    std::vector<int> out;
    for (int64_t r : integers(key, 0, std::numeric_limits<int>::max())) {
      out.push_back(static_cast<int>(r));
    }
    return out;
  }

  [[noreturn]] void fail(const char* key, const json& value, std::string_view expected) const {
    throw_error<ConfigError>("trace file '{}': {}: \"{}\" is {}, expected {}", source_, where_, key,
                             shown(value), expected);
  }

 private:
  static bool is_integer_in(const json& v, int64_t lo, int64_t hi) {
    if (v.is_number_unsigned()) {
      return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi);
    }
    return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  }

  int64_t integer_value(const char* key, const json& v, int64_t lo, int64_t hi) const {
    if (!is_integer_in(v, lo, hi)) fail(key, v, fmt::format("an integer in [{}, {}]", lo, hi));
    return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  }

  const json& object_;
  const std::string& source_;
  std::string where_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

TraceFileInfo parse_info(const json& other, const std::string& source) {
  TraceFileInfo info;
  if (other.is_null()) return info;
  const FieldReader f(other, source, "otherData");
  if (!other.is_object()) f.fail("otherData", other, "an object");
  info.kind = f.string("kind", "trace");
  info.reason = f.string("reason", "");
  info.ranks = f.ranks("ranks");
  info.world_size = static_cast<int>(f.integer("world_size", 0, 0, kMaxInt));
  info.backend = f.string("backend", "");
  info.capacity = f.unsigned_integer("capacity", 0);
  info.first_event = f.unsigned_integer("first_event", 0);
  return info;
}

TraceRecord parse_record(const FieldReader& f, const std::string& source, size_t index) {
  TraceRecord r;
  r.op = f.string("name", "");
  if (r.op.empty()) {
    const json* name = f.find("name");
    f.fail("name", name ? *name : json(), "the collective's name");
  }
  r.rank = static_cast<int>(f.integer("tid", 0, 0, kMaxInt));
  r.start_us = f.non_negative("ts", 0.0);
  if (f.string("ph", "") == "X") r.end_us = r.start_us + f.non_negative("dur", 0.0);
  const json* args = f.find("args");
  if (args != nullptr && !args->is_object()) f.fail("args", *args, "an object");
  static const json kNoArgs = json::object();
  const FieldReader a(args != nullptr ? *args : kNoArgs, source,
                      fmt::format("event {} ({}, rank {}) args", index, r.op, r.rank));
  r.sequence = a.unsigned_integer("seq", 0);
  r.dim_name = a.string("dim", f.string("cat", ""));
  r.detail = a.string("detail", "");
  r.group_ranks = a.ranks("group");
  r.shape = a.integers("shape", 0, kMaxInt64);
  r.dtype = a.string("dtype", "");
  r.bytes = a.integer("bytes", 0, 0, kMaxInt64);
  r.file = a.string("file", "");
  r.line = static_cast<uint32_t>(a.integer("line", 0, 0, std::numeric_limits<uint32_t>::max()));
  r.function = a.string("function", "");
  r.estimate_us = a.non_negative("estimate_us", 0.0);
  r.stage = static_cast<int>(a.integer("stage", -1, -1, kMaxInt));
  r.microbatch = static_cast<int>(a.integer("microbatch", -1, -1, kMaxInt));
  return r;
}

// A compute span (category "pipeline"): a pipeline action as it ran (Note [Pipeline context]).
ComputeSpan parse_span(const FieldReader& f, const std::string& source, size_t index) {
  ComputeSpan c;
  c.rank = static_cast<int>(f.integer("tid", 0, 0, kMaxInt));
  const double start = f.non_negative("ts", 0.0);
  c.start_ns = static_cast<int64_t>(start * 1e3);
  c.end_ns = static_cast<int64_t>((start + f.non_negative("dur", 0.0)) * 1e3);
  const json* args = f.find("args");
  if (args == nullptr || !args->is_object()) {
    f.fail("args", args ? *args : json(), "an object with stage, microbatch, phase and tick");
  }
  const FieldReader a(*args, source,
                      fmt::format("event {} (compute, rank {}) args", index, c.rank));
  c.stage = static_cast<int>(a.integer("stage", -1, -1, kMaxInt));
  c.microbatch = static_cast<int>(a.integer("microbatch", -1, -1, kMaxInt));
  c.tick = a.integer("tick", -1, -1, kMaxInt64);
  const std::string phase = a.string("phase", "");
  if (phase.size() != 1 || std::string_view("FBIW").find(phase[0]) == std::string_view::npos) {
    a.fail("phase", json(phase), "one of F, B, I, W");
  }
  c.phase = phase[0];
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error<ConfigError>("cannot open trace file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The per-rank files of `path` (Note [Trace files]): stem.rank<N>ext and stem.ranks<...>ext.
std::vector<std::string> per_rank_files(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string stem = p.has_extension() ? p.stem().string() : p.filename().string();
  const std::string ext = p.has_extension() ? p.extension().string() : "";
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(stem + ".rank")) continue;
    if (!ext.empty() && !name.ends_with(ext)) continue;
    out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The rank a per-rank file's name gives: stem.rank3.json and stem.rank3.<stamp>.json -> 3;
// -1 for another name (stem.ranks0_1.json: the ranks are in the file).
int rank_in_name(const std::string& file, const std::string& stem) {
  const std::string name = fs::path(file).filename().string();
  const std::string prefix = stem + ".rank";
  if (!name.starts_with(prefix)) return -1;
  int rank = -1;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  const auto [next, ec] = std::from_chars(begin, end, rank);
  if (ec != std::errc() || next == begin || (next != end && *next != '.')) return -1;
  return rank;
}

// Note [Per-rank trace files]
// A path read through its per-rank files (trace.json -> trace.rank0.json, trace.rank1.json, ...)
// stands for the whole world's trace, so the files must hold every rank once: the ranks a file
// holds are those its otherData lists (written for every per-rank file), those with records, and
// the one its name gives; the world is otherData's world_size, or else reaches the highest rank
// seen. A rank held by no file, or by two, is a ConfigError naming the file(s), rather than a
// trace (or a diff of two) that silently lacks that rank. A folder, or a file given by its own
// name, is read as it is.
class PerRankSet {
 public:
  PerRankSet(std::string path) : path_(std::move(path)) {
    const fs::path p(path_);
    stem_ = p.has_extension() ? p.stem().string() : p.filename().string();
    ext_ = p.has_extension() ? p.extension().string() : "";
    dir_ = p.has_parent_path() ? p.parent_path() : fs::path();
  }

  void add(const std::string& file, const TraceFile& part) {
    std::vector<int> ranks = part.ranks();
    for (const TraceFileInfo& info : part.infos) {
      ranks.insert(ranks.end(), info.ranks.begin(), info.ranks.end());
      world_size_ = std::max(world_size_, info.world_size);
    }
    const int named = rank_in_name(file, stem_);
    if (named >= 0) ranks.push_back(named);
    const std::string name = fs::path(file).filename().string();
    if (named >= 0 && name != stem_ + ".rank" + std::to_string(named) + ext_) stamped_ = true;
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    for (int rank : ranks) {
      auto [it, inserted] = holder_.emplace(rank, file);
      if (!inserted) {
        throw_error<ConfigError>(
            "trace file '{}': rank {} is in two of its per-rank files, '{}' and '{}' (two runs' "
            "files in one folder?); give the file you mean by its own name",
            path_, rank, it->second, file);
      }
    }
  }

  void check() const {
    const int highest = holder_.empty() ? -1 : holder_.rbegin()->first;
    const int world = std::max(world_size_, highest + 1);
    std::vector<int> missing;
    for (int rank = 0; rank < world; ++rank) {
      if (!holder_.contains(rank)) missing.push_back(rank);
    }
    if (missing.empty()) return;
    constexpr size_t kNamed = 8;
    std::vector<std::string> names;
    for (size_t i = 0; i < missing.size() && i < kNamed; ++i) {
      const std::string name =
          fmt::format("{}.rank{}{}{}", stem_, missing[i], stamped_ ? ".*" : "", ext_);
      names.push_back((dir_ / name).string());
    }
    std::vector<int> held;
    for (const auto& [rank, file] : holder_) held.push_back(rank);
    throw_error<ConfigError>(
        "trace file '{}': its per-rank files hold ranks {} of a world of {}, so rank{} {} {} "
        "missing: no {}{}; give the files that exist by their own names to read only them",
        path_, ranks_compact(held), world, missing.size() == 1 ? "" : "s", ranks_compact(missing),
        missing.size() == 1 ? "is" : "are", fmt::join(names, ", "),
        missing.size() > kNamed ? ", ..." : "");
  }

 private:
  std::string path_;
  std::string stem_;
  std::string ext_;
  fs::path dir_;
  bool stamped_ = false;
  int world_size_ = 0;
  std::map<int, std::string> holder_;  // rank -> the file holding it
};

void append(TraceFile& into, TraceFile&& part) {
  into.paths.insert(into.paths.end(), part.paths.begin(), part.paths.end());
  into.infos.insert(into.infos.end(), part.infos.begin(), part.infos.end());
  into.records.insert(into.records.end(), std::make_move_iterator(part.records.begin()),
                      std::make_move_iterator(part.records.end()));
  into.spans.insert(into.spans.end(), part.spans.begin(), part.spans.end());
}

}  // namespace

std::vector<int> TraceFile::ranks() const {
  std::vector<int> out;
  for (const TraceRecord& r : records) {
    if (std::find(out.begin(), out.end(), r.rank) == out.end()) out.push_back(r.rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool TraceFile::truncated(int rank) const {
  for (const TraceFileInfo& info : infos) {
    if (info.first_event == 0) continue;
    if (info.ranks.empty() ||
        std::find(info.ranks.begin(), info.ranks.end(), rank) != info.ranks.end()) {
      return true;
    }
  }
  return false;
}

std::vector<TraceRecord> TraceFile::records_of(int rank) const {
  std::vector<TraceRecord> out;
  for (const TraceRecord& r : records) {
    if (r.rank == rank) out.push_back(r);
  }
  return out;
}

TraceFile parse_trace_json(std::string_view text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw_error<ConfigError>("trace file '{}' is not JSON: {}", source, e.what());
  }
  // Both the object form and the bare array form of the Trace Event Format.
  const json* events = &doc;
  if (doc.is_object()) {
    auto it = doc.find("traceEvents");
    if (it == doc.end() || !it->is_array()) {
      throw_error<ConfigError>("trace file '{}' has no \"traceEvents\" array", source);
    }
    events = &*it;
  } else if (!doc.is_array()) {
    throw_error<ConfigError>("trace file '{}' is neither a JSON object nor an array", source);
  }
  TraceFile out;
  out.paths.push_back(source);
  out.infos.push_back(
      parse_info(doc.is_object() ? doc.value("otherData", json()) : json(), source));
  size_t index = 0;
  for (const json& e : *events) {
    const FieldReader f(e, source, fmt::format("event {}", index));
    if (!e.is_object()) {
      throw_error<ConfigError>("trace file '{}': event {} is {}, expected an object per event ({})",
                               source, index, shown(e),
                               doc.is_object() ? "in its \"traceEvents\" array"
                                               : "the file is a bare JSON array of events");
    }
    const std::string ph = f.string("ph", "");
    if (ph == "X" && f.string("cat", "") == "pipeline") {
      out.spans.push_back(parse_span(f, source, index));
    } else if (ph == "X" || ph == "i" || ph == "I") {
      out.records.push_back(parse_record(f, source, index));
    }
    ++index;
  }
  std::stable_sort(out.records.begin(), out.records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

TraceFile read_trace_file(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> files;
  bool per_rank = false;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw_error<ConfigError>("no *.json trace file in folder '{}'", path);
  } else if (fs::exists(path, ec)) {
    files.push_back(path);
  } else {
    per_rank = true;
    files = per_rank_files(path);
    if (files.empty()) {
      throw_error<ConfigError>("no trace file '{}' (nor per-rank files such as '{}')", path,
                               fs::path(path).has_extension()
                                   ? (fs::path(path).replace_extension().string() + ".rank0" +
                                      fs::path(path).extension().string())
                                   : path + ".rank0");
    }
  }
  TraceFile out;
  PerRankSet set(path);
  for (const std::string& file : files) {
    TraceFile part = parse_trace_json(read_text(file), file);
    if (per_rank) set.add(file, part);
    append(out, std::move(part));
  }
  // The check of Note [Per-rank trace files].
  if (per_rank) set.check();
  std::stable_sort(out.records.begin(), out.records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace spmd
