// spmd/debug/trace_file.cpp: reading trace and flight-recorder files back into TraceRecords.
#include <spmd/debug/trace_file.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <spmd/core/error.h>

namespace spmd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

template <class T>
T get_or(const json& object, const char* key, T fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return it->get<T>();
}

TraceFileInfo parse_info(const json& other) {
  TraceFileInfo info;
  if (!other.is_object()) return info;
  info.kind = get_or<std::string>(other, "kind", "trace");
  info.reason = get_or<std::string>(other, "reason", "");
  info.ranks = get_or<std::vector<int>>(other, "ranks", {});
  info.world_size = get_or<int>(other, "world_size", 0);
  info.backend = get_or<std::string>(other, "backend", "");
  info.capacity = get_or<uint64_t>(other, "capacity", 0);
  info.first_event = get_or<uint64_t>(other, "first_event", 0);
  return info;
}

TraceRecord parse_record(const json& e) {
  TraceRecord r;
  r.op = get_or<std::string>(e, "name", "");
  r.rank = get_or<int>(e, "tid", 0);
  r.start_us = get_or<double>(e, "ts", 0.0);
  if (get_or<std::string>(e, "ph", "") == "X")
    r.end_us = r.start_us + get_or<double>(e, "dur", 0.0);
  const json args = e.value("args", json::object());
  r.sequence = get_or<uint64_t>(args, "seq", 0);
  r.dim_name = get_or<std::string>(args, "dim", get_or<std::string>(e, "cat", ""));
  r.detail = get_or<std::string>(args, "detail", "");
  r.group_ranks = get_or<std::vector<int>>(args, "group", {});
  r.shape = get_or<Shape>(args, "shape", {});
  r.dtype = get_or<std::string>(args, "dtype", "");
  r.bytes = get_or<int64_t>(args, "bytes", 0);
  r.file = get_or<std::string>(args, "file", "");
  r.line = get_or<uint32_t>(args, "line", 0);
  r.function = get_or<std::string>(args, "function", "");
  r.estimate_us = get_or<double>(args, "estimate_us", 0.0);
  return r;
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

void append(TraceFile& into, TraceFile&& part) {
  into.paths.insert(into.paths.end(), part.paths.begin(), part.paths.end());
  into.infos.insert(into.infos.end(), part.infos.begin(), part.infos.end());
  into.records.insert(into.records.end(), std::make_move_iterator(part.records.begin()),
                      std::make_move_iterator(part.records.end()));
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
      parse_info(doc.is_object() ? doc.value("otherData", json::object()) : json::object()));
  try {
    for (const json& e : *events) {
      if (!e.is_object()) continue;
      const std::string ph = get_or<std::string>(e, "ph", "");
      if (ph != "X" && ph != "i" && ph != "I") continue;
      out.records.push_back(parse_record(e));
    }
  } catch (const json::exception& e) {
    throw_error<ConfigError>("trace file '{}' has an event of an unexpected form: {}", source,
                             e.what());
  }
  std::stable_sort(out.records.begin(), out.records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

TraceFile read_trace_file(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw_error<ConfigError>("no *.json trace file in folder '{}'", path);
  } else if (fs::exists(path, ec)) {
    files.push_back(path);
  } else {
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
  for (const std::string& file : files) append(out, parse_trace_json(read_text(file), file));
  std::stable_sort(out.records.begin(), out.records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace spmd
