// spmd/debug/value_dump.cpp: writing, reading and comparing value dumps (Note [Value dumps]).
#include <spmd/debug/value_dump.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <spmd/core/call_site.h>
#include <spmd/core/error.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/tensor/meta.h>
#include <spmd/tensor/shape.h>

namespace spmd {
namespace {

using nlohmann::json;

// ---- writing ------------------------------------------------------------------------------------

// One world's files and counters.
struct Writer {
  std::string dir;
  std::map<int, std::ofstream> files;  // per held rank
  std::map<std::tuple<std::string, uint32_t, std::string, int64_t>, uint64_t> occurrences;
  uint64_t seq = 0;
};

struct Dumps {
  std::mutex mutex;
  std::map<uint64_t, std::shared_ptr<Writer>> writers;  // by world id
  int observer = 0;
};

Dumps& dumps() {
  static Dumps* state = new Dumps();  // never destroyed: worlds may outlive statics
  return *state;
}

json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double number_of(const json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string s = v.get<std::string>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  throw_error<ConfigError>("value dump: '{}' is not a number", s);
}

int64_t sample_stride(int64_t numel) {
  return numel > kParitySampleLimit ? (numel + kParitySampleLimit - 1) / kParitySampleLimit : 1;
}

// Calls f(global flat index, piece flat index) for every element of the block [offset, offset +
// size) of a tensor of `shape`, in the block's row-major order.
template <class F>
void for_each_in_block(const Shape& shape, const Shape& offset, const Shape& size, F&& f) {
  const int64_t n = shape_numel(size);
  if (n == 0) return;
  const Strides strides = contiguous_strides(shape);
  std::vector<int64_t> index(size.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t flat = 0;
    for (size_t d = 0; d < size.size(); ++d) flat += (offset[d] + index[d]) * strides[d];
    f(flat, k);
    for (size_t d = size.size(); d-- > 0;) {
      if (++index[d] < size[d]) break;
      index[d] = 0;
    }
  }
}

void write_event(Writer& w, const OpEvent& e) {
  const DTensor& out = e.output;
  const DTensorSpec& spec = out.spec();
  const Placements& placements = spec.placements();
  // How the pieces along Partial mesh dims combine; an avg piece is divided by its group size.
  std::string reduce = "sum";
  std::vector<int64_t> mesh_shape = spec.mesh_shape();
  double scale = 1.0;
  for (size_t d = 0; d < placements.size(); ++d) {
    if (!is_partial(placements[d])) continue;
    const ReduceOp op = std::get<Partial>(placements[d]).op;
    if (op == ReduceOp::Avg) {
      scale /= static_cast<double>(mesh_shape[d]);
    } else if (op == ReduceOp::Max || op == ReduceOp::Min) {
      const std::string name = op == ReduceOp::Max ? "max" : "min";
      if (reduce != "sum" && reduce != name) return;  // mixed reductions: not written
      reduce = name;
    } else if (op != ReduceOp::Sum) {
      return;  // product and bitwise partials: not written
    }
  }
  const std::string file = e.location.file_name();
  const uint32_t line = e.location.line();
  const std::string op(e.op);
  // The mesh by its smallest rank: under sim one process counts the occurrences of a line that
  // runs on several meshes (a pipeline's stages) together, elsewhere each process its own.
  const std::vector<int64_t> table = out.mesh().rank_table_values().values;
  const int64_t mesh = table.empty() ? 0 : *std::min_element(table.begin(), table.end());
  const uint64_t occurrence = w.occurrences[{file, line, op, mesh}]++;
  const uint64_t seq = w.seq++;
  const Shape& shape = spec.shape();
  const int64_t stride = sample_stride(shape_numel(shape));
  const DTensorSpec::RankInfo& info = spec.rank_info();
  for (size_t i = 0; i < info.ranks.size(); ++i) {
    const int rank = info.ranks[i];
    bool replica = false;
    for (size_t d = 0; d < placements.size(); ++d) {
      replica |= is_replicate(placements[d]) && info.coordinates[i][d] != 0;
    }
    if (replica) continue;
    const Tensor piece = out.local().shard(rank).detach().to(Device{}).contiguous();
    const std::vector<double> all =
        piece.reshape({piece.numel()}).to(DType::F64).to_vector<double>();
    json values = json::array();
    for_each_in_block(shape, info.local_offsets[i], info.local_shapes[i],
                      [&](int64_t flat, int64_t k) {
                        if (flat % stride == 0) values.push_back(number(all[k] * scale));
                      });
    json record = {{"seq", seq},
                   {"file", file},
                   {"line", line},
                   {"op", op},
                   {"occurrence", occurrence},
                   {"mesh", mesh},
                   {"shape", shape},
                   {"dtype", std::string(dtype_name(spec.dtype()))},
                   {"placements", to_string(placements)},
                   {"rank", rank},
                   {"offset", info.local_offsets[i]},
                   {"size", info.local_shapes[i]},
                   {"stride", stride},
                   {"reduce", reduce},
                   {"values", std::move(values)}};
    auto it = w.files.find(rank);
    if (it == w.files.end()) {
      const std::string path = fmt::format("{}/values.rank{}.jsonl", w.dir, rank);
      it = w.files.emplace(rank, std::ofstream(path, std::ios::trunc)).first;
      if (!it->second) {
        throw_error<ConfigError>("--spmd-dump-values: cannot write {}", path);
      }
    }
    it->second << record.dump() << '\n';
  }
}

void on_op(const OpEvent& e) {
  if (e.nested || !e.output.participates() || meta_tensors()) return;
  Dumps& d = dumps();
  std::shared_ptr<Writer> w;
  {
    std::lock_guard lock(d.mutex);
    auto it = d.writers.find(e.output.mesh().world().state().id);
    if (it == d.writers.end()) return;
    w = it->second;
  }
  write_event(*w, e);
}

// Keeps one world's writer (and the observer, while any writer lives).
class DumpToken {
 public:
  DumpToken(uint64_t world, std::shared_ptr<Writer> writer) : world_(world) {
    Dumps& d = dumps();
    std::lock_guard lock(d.mutex);
    d.writers[world_] = std::move(writer);
    if (d.observer == 0) d.observer = add_op_observer(on_op);
  }
  ~DumpToken() {
    Dumps& d = dumps();
    std::lock_guard lock(d.mutex);
    d.writers.erase(world_);
    if (d.writers.empty() && d.observer != 0) {
      remove_op_observer(d.observer);
      d.observer = 0;
    }
  }
  DumpToken(const DumpToken&) = delete;
  DumpToken& operator=(const DumpToken&) = delete;

 private:
  uint64_t world_;
};

// ---- reading ------------------------------------------------------------------------------------

struct Assembly {
  DumpedValue value;
  std::string reduce = "sum";
  std::vector<bool> filled;
};

}  // namespace

std::shared_ptr<const void> start_value_dump(const World& world, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw_error<ConfigError>("--spmd-dump-values={}: cannot create the folder ({})", dir,
                             ec ? ec.message() : std::string("not a folder"));
  }
  auto writer = std::make_shared<Writer>();
  writer->dir = dir;
  // Every held rank's file, also when the program makes no DTensor (an empty dump).
  for (int rank : world.held_ranks()) {
    const std::string path = fmt::format("{}/values.rank{}.jsonl", dir, rank);
    std::ofstream file(path, std::ios::trunc);
    if (!file) throw_error<ConfigError>("--spmd-dump-values={}: cannot write {}", dir, path);
    writer->files.emplace(rank, std::move(file));
  }
  return std::make_shared<const DumpToken>(world.state().id, std::move(writer));
}

std::vector<DumpedValue> read_value_dump(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    throw_error<ConfigError>("spmd parity: {} is not a folder (--spmd-dump-values writes one)",
                             dir);
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("values.rank", 0) == 0 && entry.path().extension() == ".jsonl") {
      files.push_back(entry.path());
    }
  }
  if (files.empty()) {
    throw_error<ConfigError>("spmd parity: {} holds no values.rank*.jsonl files", dir);
  }
  std::sort(files.begin(), files.end());
  std::map<std::tuple<std::string, uint32_t, std::string, int64_t, uint64_t>, Assembly> by_site;
  for (const fs::path& path : files) {
    std::ifstream in(path);
    std::string text;
    for (int n = 1; std::getline(in, text); ++n) {
      if (text.empty()) continue;
      try {
        const json r = json::parse(text);
        const std::string file = r.at("file").get<std::string>();
        const auto line = r.at("line").get<uint32_t>();
        const std::string op = r.at("op").get<std::string>();
        const auto occurrence = r.at("occurrence").get<uint64_t>();
        const auto mesh = r.value("mesh", int64_t{0});
        const Shape shape = r.at("shape").get<Shape>();
        const auto dtype = parse_dtype(r.at("dtype").get<std::string>());
        if (!dtype) throw_error<ConfigError>("unknown dtype {}", r.at("dtype").dump());
        const auto stride = r.at("stride").get<int64_t>();
        const Shape offset = r.at("offset").get<Shape>();
        const Shape size = r.at("size").get<Shape>();
        if (offset.size() != shape.size() || size.size() != shape.size() || stride < 1) {
          throw_error<ConfigError>("the offset, size or stride does not fit shape {}",
                                   shape_str(shape));
        }
        for (size_t d = 0; d < shape.size(); ++d) {
          if (offset[d] < 0 || size[d] < 0 || offset[d] + size[d] > shape[d]) {
            throw_error<ConfigError>("the piece [{}, +{}) lies outside shape {}", shape_str(offset),
                                     shape_str(size), shape_str(shape));
          }
        }
        Assembly& a = by_site[{file, line, op, mesh, occurrence}];
        const int64_t kept = (shape_numel(shape) + stride - 1) / stride;
        if (a.filled.empty() && a.value.value.values.empty()) {
          a.value.file = file;
          a.value.line = line;
          a.value.op = op;
          a.value.occurrence = occurrence;
          a.value.mesh = mesh;
          a.value.seq = r.at("seq").get<uint64_t>();
          a.value.value.shape = shape;
          a.value.value.dtype = *dtype;
          a.value.value.placements = r.at("placements").get<std::string>();
          a.value.value.stride = stride;
          a.value.value.values.assign(static_cast<size_t>(kept), 0.0);
          a.filled.assign(static_cast<size_t>(kept), false);
          a.reduce = r.at("reduce").get<std::string>();
        } else if (a.value.value.shape != shape || a.value.value.stride != stride) {
          throw_error<ConfigError>("shape {} where another rank's record of it has {}",
                                   shape_str(shape), shape_str(a.value.value.shape));
        }
        a.value.seq = std::min(a.value.seq, r.at("seq").get<uint64_t>());
        const json& values = r.at("values");
        size_t next = 0;
        for_each_in_block(shape, offset, size, [&](int64_t flat, int64_t) {
          if (flat % stride != 0) return;
          if (next >= values.size()) {
            throw_error<ConfigError>("fewer values than the piece [{}, +{}) holds",
                                     shape_str(offset), shape_str(size));
          }
          const double v = number_of(values[next++]);
          const auto k = static_cast<size_t>(flat / stride);
          double& slot = a.value.value.values[k];
          if (!a.filled[k]) {
            slot = v;
          } else if (a.reduce == "max") {
            slot = std::max(slot, v);
          } else if (a.reduce == "min") {
            slot = std::min(slot, v);
          } else {
            slot += v;
          }
          a.filled[k] = true;
        });
        if (next != values.size()) {
          throw_error<ConfigError>("{} values for a piece that holds {}", values.size(), next);
        }
      } catch (const json::exception& e) {
        throw_error<ConfigError>("spmd parity: {}:{}: not a value record ({})", path.string(), n,
                                 e.what());
      } catch (const ConfigError& e) {
        throw_error<ConfigError>("spmd parity: {}:{}: {}", path.string(), n, e.what());
      }
    }
  }
  std::vector<DumpedValue> out;
  out.reserve(by_site.size());
  for (auto& [key, a] : by_site) out.push_back(std::move(a.value));
  std::sort(out.begin(), out.end(), [](const DumpedValue& x, const DumpedValue& y) {
    return std::tie(x.seq, x.line, x.op) < std::tie(y.seq, y.line, y.op);
  });
  return out;
}

namespace {

using CompareKey = std::tuple<std::string, uint32_t, std::string, size_t, uint64_t>;

// Each value's key across dumps: its site, the index of its mesh among the meshes that site ran on
// (by smallest rank: a pipeline's stage 0 first), its occurrence there.
std::vector<CompareKey> compare_keys(const std::vector<DumpedValue>& values) {
  std::map<std::tuple<std::string, uint32_t, std::string>, std::set<int64_t>> meshes;
  for (const DumpedValue& v : values) meshes[{v.file, v.line, v.op}].insert(v.mesh);
  std::vector<CompareKey> keys;
  keys.reserve(values.size());
  for (const DumpedValue& v : values) {
    const std::set<int64_t>& at = meshes[{v.file, v.line, v.op}];
    const auto m = static_cast<size_t>(std::distance(at.begin(), at.find(v.mesh)));
    keys.emplace_back(v.file, v.line, v.op, m, v.occurrence);
  }
  return keys;
}

}  // namespace

DumpComparison compare_value_dumps(const std::vector<DumpedValue>& a,
                                   const std::vector<DumpedValue>& b, double tol) {
  std::map<CompareKey, const DumpedValue*> ref;
  const std::vector<CompareKey> b_keys = compare_keys(b);
  for (size_t i = 0; i < b.size(); ++i) ref[b_keys[i]] = &b[i];
  const std::vector<CompareKey> a_keys = compare_keys(a);
  DumpComparison c;
  std::string last;
  for (size_t i = 0; i < a.size(); ++i) {
    const DumpedValue& v = a[i];
    auto it = ref.find(a_keys[i]);
    if (it == ref.end()) {
      ++c.only_one;
      continue;
    }
    const ParityValue& expected = it->second->value;
    if (expected.shape != v.value.shape || expected.dtype != v.value.dtype ||
        expected.stride != v.value.stride) {
      ++c.other_shape;
      continue;
    }
    const double t = parity_tolerance(v.value.dtype, tol);
    const std::string site = fmt::format("'{}' at {} (occurrence {})", v.op,
                                         site_text(v.file, v.line), v.occurrence + 1);
    if (auto d = parity_departure(v.value, expected, t)) {
      std::vector<int64_t> index(v.value.shape.size(), 0);
      int64_t flat = d->flat * v.value.stride;
      for (size_t k = index.size(); k-- > 0;) {
        index[k] = v.value.shape[k] == 0 ? 0 : flat % v.value.shape[k];
        flat = v.value.shape[k] == 0 ? 0 : flat / v.value.shape[k];
      }
      c.departure = fmt::format(
          "{} departs from the reference dump: the values differ by {:.3g} of the tensor's "
          "largest (tolerance {:g} for {}) and most at index {}: {:.9g} here, {:.9g} in the "
          "reference. Here it is shape {} ({}), there ({}). The last site that still agreed: {}",
          site, d->relative, t, dtype_name(v.value.dtype), shape_str(index), d->got, d->expected,
          shape_str(v.value.shape), v.value.placements, expected.placements,
          last.empty() ? std::string("none (this is the first value compared)") : last);
      return c;
    }
    ++c.compared;
    last = site;
  }
  c.only_one += b.size() > c.compared + c.other_shape ? b.size() - c.compared - c.other_shape : 0;
  return c;
}

}  // namespace spmd
