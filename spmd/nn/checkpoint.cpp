// spmd/nn/checkpoint.cpp: save and load of distributed checkpoints (Note [Checkpoint format]).
#include <spmd/nn/checkpoint.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/shape.h>

namespace spmd::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "spmdsim-checkpoint";
constexpr int kVersion = 1;

// ---- safetensors
// ----------------------------------------------------------------------------------

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::Bool:
      return "BOOL";
    case DType::F8E4M3FN:
      return "F8_E4M3";
    case DType::F8E5M2:
      return "F8_E5M2";
  }
  return "F32";
}

std::optional<DType> dtype_of_safetensors(const std::string& name) {
  for (DType d : kAllDTypes) {
    if (name == safetensors_dtype(d)) return d;
  }
  return std::nullopt;
}

// Writes `tensors` (name, contiguous CPU tensor) as one safetensors file.
void write_safetensors(const fs::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = text.size();
  char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  out.write(le, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& entry : tensors) {
    out.write(static_cast<const char*>(entry.second.data_ptr()),
              static_cast<std::streamsize>(entry.second.nbytes()));
  }
  out.flush();
  if (!out) throw_error<ConfigError>("checkpoint::save: cannot write {}", path.string());
}

// One safetensors file's header, read once per load.
struct SafetensorsFile {
  fs::path path;
  uint64_t data_start = 0;
  uint64_t file_size = 0;
  json header;
};

SafetensorsFile open_safetensors(const fs::path& path) {
  SafetensorsFile f;
  f.path = path;
  std::error_code ec;
  f.file_size = fs::file_size(path, ec);
  if (ec) {
    throw_error<ConfigError>("checkpoint::load: {} is missing ({})", path.string(), ec.message());
  }
  std::ifstream in(path, std::ios::binary);
  unsigned char le[8] = {};
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (!in || length > f.file_size - 8) {
    throw_error<ConfigError>("checkpoint::load: {} is truncated or not a safetensors file",
                             path.string());
  }
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  try {
    f.header = json::parse(text);
  } catch (const json::exception& e) {
    throw_error<ConfigError>("checkpoint::load: {}: the safetensors header does not parse ({})",
                             path.string(), e.what());
  }
  f.data_start = 8 + length;
  return f;
}

Tensor read_tensor(const SafetensorsFile& f, const std::string& name) {
  auto it = f.header.find(name);
  if (it == f.header.end()) {
    throw_error<ConfigError>("checkpoint::load: {} holds no tensor '{}'", f.path.string(), name);
  }
  const auto dtype = dtype_of_safetensors(it->at("dtype").get<std::string>());
  if (!dtype) {
    throw_error<ConfigError>("checkpoint::load: {}: tensor '{}' has dtype {} spmdsim lacks",
                             f.path.string(), name, it->at("dtype").dump());
  }
  const Shape shape = it->at("shape").get<Shape>();
  const auto range = it->at("data_offsets").get<std::vector<uint64_t>>();
  Tensor t = empty(shape, *dtype);
  if (range.size() != 2 || range[1] < range[0] || range[1] - range[0] != t.nbytes() ||
      f.data_start + range[1] > f.file_size) {
    throw_error<ConfigError>(
        "checkpoint::load: {} is truncated: tensor '{}' ({} {}) needs bytes [{}, {}) of the data, "
        "the file holds {}",
        f.path.string(), name, dtype_name(*dtype), shape_str(shape), range.empty() ? 0 : range[0],
        range.size() < 2 ? 0 : range[1], f.file_size - f.data_start);
  }
  std::ifstream in(f.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(f.data_start + range[0]));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (!in)
    throw_error<ConfigError>("checkpoint::load: {}: reading '{}' failed", f.path.string(), name);
  return t;
}

// ---- chunks -------------------------------------------------------------------------------------

struct Chunk {
  int rank = 0;
  Shape offset;
  Shape size;
};

std::string chunk_name(const std::string& key, const Shape& offset) {
  std::string out = key + "@";
  for (size_t d = 0; d < offset.size(); ++d) out += fmt::format("{}{}", d ? "," : "", offset[d]);
  return out;
}

std::string rank_file(int rank) {
  return fmt::format("rank{}.safetensors", rank);
}

// Every chunk of a DTensor of `spec`, whichever process holds it: the pieces of the mesh's ranks at
// coordinate 0 along every Replicate mesh dim. PlacementError naming `key` for a Partial.
std::vector<Chunk> chunks_of(const std::string& key, const DTensorSpec& spec) {
  const Placements& placements = spec.placements();
  for (size_t d = 0; d < placements.size(); ++d) {
    if (is_partial(placements[d])) {
      throw_error<PlacementError>(
          "checkpoint::save: '{}' is Partial on mesh dim {} ({}): its pieces are not its value; "
          "redistribute it (to Replicate) before saving",
          key, d, to_string(placements));
    }
  }
  const std::vector<int64_t> mesh_shape = spec.mesh_shape();
  const std::vector<int64_t> ranks = spec.mesh().rank_table().contiguous().to_vector<int64_t>();
  std::vector<Chunk> out;
  std::vector<int64_t> coordinate(mesh_shape.size(), 0);
  for (size_t flat = 0; flat < ranks.size(); ++flat) {
    size_t rest = flat;
    bool replica = false;
    for (size_t d = mesh_shape.size(); d-- > 0;) {
      coordinate[d] = static_cast<int64_t>(rest % static_cast<size_t>(mesh_shape[d]));
      rest /= static_cast<size_t>(mesh_shape[d]);
      replica |= is_replicate(placements[d]) && coordinate[d] != 0;
    }
    if (replica) continue;
    Chunk c{static_cast<int>(ranks[flat]), spec.local_offset(coordinate),
            spec.local_shape(coordinate)};
    if (shape_numel(c.size) > 0 || shape_numel(spec.shape()) == 0) out.push_back(std::move(c));
  }
  return out;
}

const DTensor& dtensor_entry(const std::string& key, const Entry& e, const char* op) {
  const DTensor* t = std::get<DTensor*>(e);
  if (t == nullptr || !t->defined()) {
    throw_error<ConfigError>("checkpoint::{}: '{}' is a null or undefined DTensor", op, key);
  }
  return *t;
}

const Tensor& tensor_entry(const std::string& key, const Entry& e, const char* op) {
  const Tensor* t = std::get<Tensor*>(e);
  if (t == nullptr || !t->defined()) {
    throw_error<ConfigError>("checkpoint::{}: '{}' is a null or undefined Tensor", op, key);
  }
  return *t;
}

// A barrier over every rank of `world` (nothing to wait for under sim).
void world_barrier(const World& world) {
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) return;
  barrier(init_device_mesh(world, {world.size()}, {"checkpoint"}));
}

// The folder to read for checkpoint `dir`: DIR, or DIR.old when a save died between moving the
// previous checkpoint aside and moving the new one in (Note [Checkpoint format]).
std::string folder_to_read(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "index.json", ec)) return dir;
  const std::string old = dir + ".old";
  if (fs::exists(fs::path(old) / "index.json", ec)) return old;
  return dir;
}

json read_index(const std::string& dir, const char* op) {
  const fs::path path = fs::path(dir) / "index.json";
  std::ifstream in(path);
  if (!in) {
    throw_error<ConfigError>(
        "checkpoint::{}: {} is not a checkpoint: it has no index.json (a save that did not finish "
        "leaves the folder as it was, or writes nothing)",
        op, dir);
  }
  json index;
  try {
    in >> index;
  } catch (const json::exception& e) {
    throw_error<ConfigError>("checkpoint::{}: {} does not parse ({})", op, path.string(), e.what());
  }
  if (index.value("format", "") != kFormat) {
    throw_error<ConfigError>("checkpoint::{}: {} is not an spmdsim checkpoint index", op,
                             path.string());
  }
  return index;
}

// What a save writes: each held rank's chunks (copied: the state may change afterwards) and, on
// the coordinator, the index.
struct Snapshot {
  World world;
  fs::path target;
  fs::path tmp;
  std::map<int, std::vector<std::pair<std::string, Tensor>>> files;
  json entries = json::object();
};

Snapshot snapshot(const World& world, const StateDict& state, const std::string& dir) {
  Snapshot s;
  s.world = world;
  s.target = fs::path(dir);
  s.tmp = fs::path(dir + ".tmp");
  for (const auto& [key, entry] : state) {
    json chunks = json::array();
    if (std::holds_alternative<DTensor*>(entry)) {
      const DTensor& t = dtensor_entry(key, entry, "save");
      for (const Chunk& c : chunks_of(key, t.spec())) {
        chunks.push_back({{"file", rank_file(c.rank)},
                          {"name", chunk_name(key, c.offset)},
                          {"offset", c.offset},
                          {"size", c.size}});
        if (!t.local().holds(c.rank)) continue;
        s.files[c.rank].emplace_back(
            chunk_name(key, c.offset),
            t.local().shard(c.rank).detach().to(Device{}).contiguous().clone());
      }
      s.entries[key] = {{"shape", t.shape()},
                        {"dtype", std::string(dtype_name(t.dtype()))},
                        {"placements", to_string(t.placements())},
                        {"chunks", std::move(chunks)}};
    } else {
      const Tensor& t = tensor_entry(key, entry, "save");
      const int writer = 0;  // rank 0 writes plain tensors
      const Shape zero(t.shape().size(), 0);
      chunks.push_back({{"file", rank_file(writer)},
                        {"name", chunk_name(key, zero)},
                        {"offset", zero},
                        {"size", t.shape()}});
      if (world.holds(writer)) {
        s.files[writer].emplace_back(chunk_name(key, zero),
                                     t.detach().to(Device{}).contiguous().clone());
      }
      s.entries[key] = {{"shape", t.shape()},
                        {"dtype", std::string(dtype_name(t.dtype()))},
                        {"placements", ""},
                        {"chunks", std::move(chunks)}};
    }
  }
  // DIR.tmp, fresh, before any process writes into it.
  std::error_code ec;
  if (world.is_coordinator()) {
    fs::remove_all(s.tmp, ec);
    fs::create_directories(s.tmp, ec);
    if (ec) {
      throw_error<ConfigError>("checkpoint::save: cannot create {} ({})", s.tmp.string(),
                               ec.message());
    }
  }
  world_barrier(world);
  return s;
}

void write_files(const Snapshot& s) {
  for (const auto& [rank, tensors] : s.files) write_safetensors(s.tmp / rank_file(rank), tensors);
}

// When every process has written its files: the index, then the rename over the previous
// checkpoint (Note [Checkpoint format]).
void finish(Snapshot& s) {
  world_barrier(s.world);
  if (s.world.is_coordinator()) {
    const json index = {{"format", kFormat},
                        {"version", kVersion},
                        {"world_size", s.world.size()},
                        {"entries", std::move(s.entries)}};
    {
      std::ofstream out(s.tmp / "index.json", std::ios::trunc);
      out << index.dump(1) << '\n';
      out.flush();
      if (!out) {
        throw_error<ConfigError>("checkpoint::save: cannot write {}/index.json", s.tmp.string());
      }
    }
    std::error_code ec;
    // DIR moves aside to DIR.old, then DIR.tmp to DIR. A process killed between the two leaves
    // no DIR: load reads DIR.old, and the next save keeps it until its own DIR is in place.
    const fs::path old = fs::path(s.target.string() + ".old");
    if (fs::exists(s.target)) {
      fs::remove_all(old, ec);
      fs::rename(s.target, old, ec);
    }
    fs::rename(s.tmp, s.target, ec);
    if (ec) {
      throw_error<ConfigError>("checkpoint::save: cannot move {} to {} ({})", s.tmp.string(),
                               s.target.string(), ec.message());
    }
    fs::remove_all(old, ec);
  }
  world_barrier(s.world);
}

}  // namespace

struct AsyncSave::State {
  Snapshot snapshot;
  std::thread writer;
  std::exception_ptr error;
};

AsyncSave::AsyncSave(AsyncSave&&) noexcept = default;
AsyncSave& AsyncSave::operator=(AsyncSave&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (...) {
      // A move-assignment cannot report it; wait() on the old handle would have.
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

AsyncSave::~AsyncSave() {
  try {
    wait();
  } catch (...) {
    // Destructors do not throw; call wait() to see the error.
  }
}

void AsyncSave::wait() {
  if (!state_) return;
  std::unique_ptr<State> s = std::move(state_);
  if (s->writer.joinable()) s->writer.join();
  if (s->error) std::rethrow_exception(s->error);
  finish(s->snapshot);
}

namespace {

// The world of the state's DTensors, for the forms without a world argument.
World world_of(const StateDict& state, std::string_view op) {
  for (const auto& [key, entry] : state) {
    if (const auto* d = std::get_if<DTensor*>(&entry);
        d != nullptr && *d != nullptr && (*d)->defined()) {
      return (*d)->mesh().world();
    }
  }
  throw_error<ConfigError>(
      "checkpoint::{}: the state has no defined DTensor to take the world from ({} entries); call "
      "checkpoint::{}(world, state, dir)",
      op, state.size(), op);
}

}  // namespace

void save(const StateDict& state, const std::string& dir, SourceLocation loc) {
  const UserCallSite site(loc);
  save(world_of(state, "save"), state, dir, loc);
}

AsyncSave async_save(const StateDict& state, const std::string& dir, SourceLocation loc) {
  const UserCallSite site(loc);
  return save_async(world_of(state, "async_save"), state, dir, loc);
}

void save(const World& world, const StateDict& state, const std::string& dir, SourceLocation loc) {
  const UserCallSite site(loc);
  Snapshot s = snapshot(world, state, dir);
  write_files(s);
  finish(s);
}

AsyncSave save_async(const World& world, const StateDict& state, const std::string& dir,
                     SourceLocation loc) {
  const UserCallSite site(loc);
  AsyncSave handle;
  handle.state_ = std::make_unique<AsyncSave::State>();
  AsyncSave::State* s = handle.state_.get();
  s->snapshot = snapshot(world, state, dir);
  s->writer = std::thread([s] {
    try {
      write_files(s->snapshot);
    } catch (...) {
      s->error = std::current_exception();
    }
  });
  return handle;
}

void load(const StateDict& state, const std::string& checkpoint, SourceLocation loc) {
  const UserCallSite site(loc);
  const std::string dir = folder_to_read(checkpoint);
  const json index = read_index(dir, "load");
  const json& entries = index.at("entries");
  std::map<std::string, std::shared_ptr<SafetensorsFile>> opened;
  auto file = [&](const std::string& name) -> const SafetensorsFile& {
    auto& f = opened[name];
    if (!f) f = std::make_shared<SafetensorsFile>(open_safetensors(fs::path(dir) / name));
    return *f;
  };
  for (const auto& [key, entry] : state) {
    auto it = entries.find(key);
    if (it == entries.end()) {
      throw_error<ConfigError>(
          "checkpoint::load: the checkpoint at {} has no '{}' (it holds {} "
          "entries)",
          dir, key, entries.size());
    }
    const Shape shape = it->at("shape").get<Shape>();
    const auto dtype = parse_dtype(it->at("dtype").get<std::string>());
    const bool is_dtensor = std::holds_alternative<DTensor*>(entry);
    const Shape want = is_dtensor ? dtensor_entry(key, entry, "load").shape()
                                  : tensor_entry(key, entry, "load").shape();
    const DType want_dtype = is_dtensor ? dtensor_entry(key, entry, "load").dtype()
                                        : tensor_entry(key, entry, "load").dtype();
    if (shape != want || !dtype || *dtype != want_dtype) {
      throw_error<ConfigError>(
          "checkpoint::load: '{}' is {} {} in the checkpoint at {} but {} {} here (a checkpoint "
          "of another model?)",
          key, it->at("dtype").get<std::string>(), shape_str(shape), dir, dtype_name(want_dtype),
          shape_str(want));
    }
    // The block [offset, offset + size) of the global value, from every chunk that overlaps it.
    auto read_block = [&](const Shape& offset, const Shape& size) {
      Tensor block = zeros(size, want_dtype);
      int64_t covered = 0;
      for (const json& c : it->at("chunks")) {
        const Shape co = c.at("offset").get<Shape>();
        const Shape cs = c.at("size").get<Shape>();
        Shape lo(size.size()), len(size.size());
        bool overlaps = true;
        for (size_t d = 0; d < size.size() && overlaps; ++d) {
          lo[d] = std::max(offset[d], co[d]);
          const int64_t hi = std::min(offset[d] + size[d], co[d] + cs[d]);
          len[d] = hi - lo[d];
          overlaps = len[d] > 0;
        }
        if (!overlaps) continue;
        const Tensor chunk =
            read_tensor(file(c.at("file").get<std::string>()), c.at("name").get<std::string>());
        if (chunk.shape() != cs) {
          throw_error<ConfigError>(
              "checkpoint::load: chunk '{}' of {} has shape {}, the index says {}",
              c.at("name").get<std::string>(), dir, shape_str(chunk.shape()), shape_str(cs));
        }
        Tensor src = chunk;
        Tensor dst = block;
        for (size_t d = 0; d < size.size(); ++d) {
          src = src.narrow(static_cast<int64_t>(d), lo[d] - co[d], len[d]);
          dst = dst.narrow(static_cast<int64_t>(d), lo[d] - offset[d], len[d]);
        }
        dst.copy_(src);
        covered += shape_numel(len);
      }
      if (covered != shape_numel(size)) {
        throw_error<ConfigError>(
            "checkpoint::load: the chunks of '{}' in {} cover {} of the {} elements of block {} "
            "at {}",
            key, dir, covered, shape_numel(size), shape_str(size), shape_str(offset));
      }
      return block;
    };
    if (!is_dtensor) {
      Tensor* t = std::get<Tensor*>(entry);
      const bool leaf = t->requires_grad();
      Tensor loaded = read_block(Shape(shape.size(), 0), shape).to(t->device());
      if (leaf) loaded.requires_grad_();
      *t = std::move(loaded);
      continue;
    }
    DTensor* t = std::get<DTensor*>(entry);
    const DTensorSpec::RankInfo& info = t->spec().rank_info();
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < info.ranks.size(); ++i) {
      pieces.push_back(read_block(info.local_offsets[i], info.local_shapes[i])
                           .to(t->local().shard(info.ranks[i]).device()));
    }
    const bool leaf = t->requires_grad();
    DTensor loaded(LocalTensor(info.ranks, std::move(pieces)), t->spec_ptr());
    if (leaf) loaded.requires_grad_();
    *t = std::move(loaded);
  }
}

std::map<std::string, EntryInfo> inspect(const std::string& checkpoint) {
  const std::string dir = folder_to_read(checkpoint);
  const json index = read_index(dir, "inspect");
  std::map<std::string, EntryInfo> out;
  for (const auto& [key, e] : index.at("entries").items()) {
    EntryInfo info;
    info.shape = e.at("shape").get<Shape>();
    info.dtype = parse_dtype(e.at("dtype").get<std::string>()).value_or(DType::F32);
    info.placements = e.at("placements").get<std::string>();
    info.chunks = e.at("chunks").size();
    for (const json& c : e.at("chunks")) {
      info.bytes +=
          static_cast<uint64_t>(shape_numel(c.at("size").get<Shape>())) * itemsize(info.dtype);
    }
    out[key] = std::move(info);
  }
  return out;
}

}  // namespace spmd::checkpoint
