// spmd/debug/checks.cpp: the check, replicate and nan modes of --spmd-debug (Note [Check modes])
// and set_debug, which installs their observers.
#include <spmd/debug/checks.h>

#include <cmath>
#include <map>
#include <mutex>
#include <optional>

#include <spmd/collectives/fingerprint.h>
#include <spmd/collectives/functional.h>
#include <spmd/collectives/reduce_kernels.h>
#include <spmd/core/error.h>
#include <spmd/debug/visualize.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/ops/ops.h>
#include <spmd/sim/local_ops.h>

namespace spmd {
namespace {

// ---- element access -----------------------------------------------------------------------------

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return index;
}

std::string index_str(int64_t flat, const Shape& shape) {
  return shape_str(unravel(flat, shape));
}

// Values as doubles (exact for every dtype but I64 beyond 2^53, which only messages print).
std::vector<double> values(const Tensor& t) {
  return t.to(Device{}).contiguous().to_vector<double>();
}

// Same value, NaN equal to NaN (and integers compared exactly).
bool same_value(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The first flat index where `a` and `b` (same shape) differ, NaN equal to NaN.
std::optional<int64_t> first_difference(const Tensor& a, const Tensor& b) {
  if (a.is_same(b)) return std::nullopt;
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
    std::vector<int64_t> x = a.to(Device{}).contiguous().to_vector<int64_t>();
    std::vector<int64_t> y = b.to(Device{}).contiguous().to_vector<int64_t>();
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != y[i]) return static_cast<int64_t>(i);
    }
    return std::nullopt;
  }
  std::vector<double> x = values(a);
  std::vector<double> y = values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!same_value(x[i], y[i])) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

struct NonFinite {
  int64_t flat;
  double value;
};

std::optional<NonFinite> first_nonfinite(const Tensor& t) {
  if (!is_floating(t.dtype()) || t.numel() == 0 || !has_nonfinite(t)) return std::nullopt;
  std::vector<double> v = values(t);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return NonFinite{static_cast<int64_t>(i), v[i]};
  }
  return std::nullopt;
}

std::string_view nonfinite_name(double v) {
  return std::isnan(v) ? "NaN" : (v > 0 ? "Inf" : "-Inf");
}

std::string describe_dtensor(const DTensor& t) {
  return fmt::format("{} {} {}", to_string(t.placements()), shape_str(t.shape()), t.dtype());
}

std::string describe_inputs(const OpEvent& e) {
  std::string out;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    out += fmt::format("{}input {}: {}", i ? "; " : "", i, describe_dtensor(*e.inputs[i]));
  }
  return out;
}

std::string describe_args(const OpEvent& e) {
  const std::string args = e.args.to_string();
  return args.empty() ? "" : fmt::format("; args {}", args);
}

// ---- assembling the global value
// ------------------------------------------------------------------

// For each mesh coordinate, the piece of the lowest held rank there (one sibling mesh).
class Pieces {
 public:
  explicit Pieces(const DTensor& t) : spec_(t.spec()) {
    const DTensorSpec::RankInfo& info = spec_.rank_info();
    for (size_t r = 0; r < info.ranks.size(); ++r) {
      pieces_.emplace(info.coordinates[r], &t.local().shards()[r]);
    }
    if (static_cast<int64_t>(pieces_.size()) != spec_.mesh().size()) {
      throw_error<PlacementError>(
          "assemble_full_tensor: the process holds pieces of {} of the {} positions of mesh {}; "
          "assembling without communication needs every rank (the sim backend)",
          pieces_.size(), spec_.mesh().size(), spec_.mesh().to_string());
    }
  }

  // The block at the Shard coordinates of `coordinate`: Replicate dims read at 0, Partial dims
  // reduced, mesh dims from `dim` on.
  Tensor block(std::vector<int64_t>& coordinate, size_t dim) const {
    const Placements& placements = spec_.placements();
    if (dim == placements.size()) return pieces_.at(coordinate)->contiguous();
    const Placement& p = placements[dim];
    if (is_replicate(p)) {
      coordinate[dim] = 0;
      return block(coordinate, dim + 1);
    }
    if (is_shard(p)) return block(coordinate, dim + 1);
    const int64_t n = spec_.mesh_shape()[dim];
    std::vector<Tensor> parts;
    std::vector<const void*> buffers;
    for (int64_t k = 0; k < n; ++k) {
      coordinate[dim] = k;
      parts.push_back(block(coordinate, dim + 1));
      buffers.push_back(parts.back().data_ptr());
    }
    coordinate[dim] = 0;
    Tensor out = empty(parts[0].shape(), parts[0].dtype());
    if (out.numel() > 0) {
      reduce_buffers(out.dtype(), std::get<Partial>(p).op, buffers.data(), n, out.data_ptr(),
                     out.numel());
    }
    return out;
  }

 private:
  const DTensorSpec& spec_;
  std::map<std::vector<int64_t>, const Tensor*> pieces_;
};

// Ranks (one sibling) whose piece holds global element `index`.
std::vector<int> holders(const DTensorSpec& spec, const std::vector<int64_t>& index) {
  std::vector<int> out;
  const DTensorSpec::RankInfo& info = spec.rank_info();
  for (size_t r = 0; r < info.ranks.size(); ++r) {
    bool inside = true;
    for (size_t d = 0; d < index.size() && inside; ++d) {
      const int64_t start = info.local_offsets[r][d];
      inside = index[d] >= start && index[d] < start + info.local_shapes[r][d];
    }
    if (inside) out.push_back(info.ranks[r]);
  }
  return out;
}

// ---- check
// ----------------------------------------------------------------------------------------

void check_against_full(const OpEvent& e) {
  std::vector<Tensor> full_inputs;
  full_inputs.reserve(e.inputs.size());
  for (const DTensor* input : e.inputs) full_inputs.push_back(assemble_full_tensor(*input));
  const Tensor got = assemble_full_tensor(e.output);
  const Tensor expected = e.reference(full_inputs);
  auto context = [&] {
    return fmt::format("{}; output: {}{}; mesh {}", describe_inputs(e), describe_dtensor(e.output),
                       describe_args(e), e.output.mesh().to_string());
  };
  if (got.shape() != expected.shape()) {
    throw_error<DivergenceError>(
        "--spmd-debug=check: DTensor op '{}' gives a global shape {} but the same op on the full "
        "tensors gives {} ({})",
        e.op, shape_str(got.shape()), shape_str(expected.shape()), context());
  }
  const CheckTolerance tol = check_tolerance(e.output.dtype());
  const bool exact = !is_floating(e.output.dtype());
  std::vector<double> g = values(got);
  std::vector<double> x = values(expected);
  int64_t worst = -1;
  double worst_error = 0.0;
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (same_value(g[i], x[i])) continue;
    const double error = std::abs(g[i] - x[i]);
    const bool within = !exact && error <= tol.atol + tol.rtol * std::abs(x[i]);
    if (within) continue;
    ++bad;
    if (worst < 0 || !(error <= worst_error)) {
      worst = static_cast<int64_t>(i);
      worst_error = error;
    }
  }
  if (worst < 0) return;
  const std::vector<int64_t> index = unravel(worst, got.shape());
  const std::string tolerance =
      exact ? "exact for " + std::string(dtype_name(e.output.dtype()))
            : fmt::format("tolerance {:g} + {:g} * |expected|", tol.atol, tol.rtol);
  throw_error<DivergenceError>(
      "--spmd-debug=check: DTensor op '{}' differs from the same op on the full tensors: max "
      "error {:g} at index {} (sharded {:g}, single-device {:g}; {} of {} elements off, {}); "
      "that element is held by rank(s) {} ({})",
      e.op, worst_error, shape_str(index), g[static_cast<size_t>(worst)],
      x[static_cast<size_t>(worst)], bad, g.size(), tolerance,
      rank_ranges(holders(e.output.spec(), index)), context());
}

// ---- replicate
// -------------------------------------------------------------------------------------

void check_replicas(const OpEvent& e, const DTensor& t, const std::string& which) {
  const DTensorSpec& spec = t.spec();
  const LocalTensor& local = t.local();
  for (int d = 0; d < spec.mesh_ndim(); ++d) {
    if (!is_replicate(spec.placements()[static_cast<size_t>(d)])) continue;
    for (const std::vector<int>& group : spec.mesh().group_family(d).groups()) {
      if (!local.holds(group[0])) continue;
      const Tensor& first = local.shard(group[0]);
      for (size_t k = 1; k < group.size(); ++k) {
        if (!local.holds(group[k])) continue;
        const Tensor& other = local.shard(group[k]);
        std::optional<int64_t> at = first_difference(first, other);
        if (!at) continue;
        const size_t i = static_cast<size_t>(*at);
        throw_error<DivergenceError>(
            "--spmd-debug=replicate: {} of DTensor op '{}' is Replicate on mesh dim {} ('{}') "
            "but its replicas differ: rank {} holds {:g} and rank {} holds {:g} at index {} of "
            "the piece (group ranks {}; {}; mesh {}){}",
            which, e.op, d, spec.mesh().dim_name(d), group[0], values(first)[i], group[k],
            values(other)[i], index_str(*at, first.shape()), ranks_str(group), describe_dtensor(t),
            spec.mesh().to_string(),
            which == "the output" ? ""
                                  : ": they diverged before this op (a write through "
                                    "mutable_shard, or from_local of rank-dependent data)");
      }
    }
  }
}

// ---- nan
// -------------------------------------------------------------------------------------------

// " (its inputs were finite on rank 2)" or " (input 1 already held NaN on rank 2 at index [3])".
template <class ShardOf>
std::string input_note(size_t num_inputs, int rank, ShardOf&& shard_of) {
  for (size_t i = 0; i < num_inputs; ++i) {
    const Tensor* shard = shard_of(i);
    if (shard == nullptr) continue;
    if (auto bad = first_nonfinite(*shard)) {
      return fmt::format(
          "; input {} already held {} on rank {} at index {}: it came from code the check does "
          "not see (LocalTensor::map, from_fn, from_local, data read in)",
          i, nonfinite_name(bad->value), rank, index_str(bad->flat, shard->shape()));
    }
  }
  return fmt::format("; its inputs were finite on rank {}", rank);
}

void check_nonfinite(const OpEvent& e) {
  const LocalTensor& local = e.output.local();
  const DTensorSpec::RankInfo& info = e.output.spec().rank_info();
  for (size_t r = 0; r < local.num_shards(); ++r) {
    const Tensor& piece = local.shards()[r];
    if (r > 0 && piece.is_same(local.shards()[r - 1])) continue;
    auto bad = first_nonfinite(piece);
    if (!bad) continue;
    const int rank = local.ranks()[r];
    std::vector<int64_t> global = unravel(bad->flat, piece.shape());
    for (size_t d = 0; d < global.size(); ++d) global[d] += info.local_offsets[r][d];
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: DTensor op '{}' produced {} on rank {} at index {} of its piece "
        "(global index {}){}; output {}; {}{}",
        e.op, nonfinite_name(bad->value), rank, index_str(bad->flat, piece.shape()),
        shape_str(global),
        input_note(e.inputs.size(), rank,
                   [&](size_t i) -> const Tensor* {
                     const LocalTensor& in = e.inputs[i]->local();
                     return in.holds(rank) ? &in.shard(rank) : nullptr;
                   }),
        describe_dtensor(e.output), describe_inputs(e), describe_args(e));
  }
}

void on_local_op(std::string_view op, std::span<const LocalTensor* const> inputs,
                 const LocalTensor& result, const SourceLocation& /*location*/) {
  // Thrown inside the op's call: the message ends with the user's line (core/error.h).
  for (size_t r = 0; r < result.num_shards(); ++r) {
    const Tensor& shard = result.shards()[r];
    if (r > 0 && shard.is_same(result.shards()[r - 1])) continue;
    auto bad = first_nonfinite(shard);
    if (!bad) continue;
    const int rank = result.ranks()[r];
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: LocalTensor op '{}' produced {} on rank {} at index {} (shape {}){}", op,
        nonfinite_name(bad->value), rank, index_str(bad->flat, shard.shape()),
        shape_str(shard.shape()), input_note(inputs.size(), rank, [&](size_t i) -> const Tensor* {
          return inputs[i]->holds(rank) ? &inputs[i]->shard(rank) : nullptr;
        }));
  }
}

void on_collective(const CollectiveEvent& e) {
  if (!e.world.debug().nan) return;
  const LocalTensor& result = e.output;
  for (size_t r = 0; r < result.num_shards(); ++r) {
    const Tensor& shard = result.shards()[r];
    if (r > 0 && shard.is_same(result.shards()[r - 1])) continue;
    auto bad = first_nonfinite(shard);
    if (!bad) continue;
    const int rank = result.ranks()[r];
    // Which held input was already non-finite, if any (under a real backend only this rank's).
    std::string note =
        "; every input this process holds was finite (an overflow in the "
        "reduction, or another process's input)";
    for (size_t i = 0; i < e.input.num_shards(); ++i) {
      if (auto in = first_nonfinite(e.input.shards()[i])) {
        note = fmt::format("; the input of rank {} already held {} at index {}", e.input.ranks()[i],
                           nonfinite_name(in->value),
                           index_str(in->flat, e.input.shards()[i].shape()));
        break;
      }
    }
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: {} over mesh dim '{}' at {} produced {} on rank {} at index {} "
        "(shape {}){}",
        e.kind, e.dim_name, call_site_text(e.location.file_name(), e.location.line()),
        nonfinite_name(bad->value), rank, index_str(bad->flat, shard.shape()),
        shape_str(shard.shape()), note);
  }
}

void on_op(const OpEvent& e) {
  const DebugOptions& debug = e.output.mesh().world().debug();
  if (debug.nan) check_nonfinite(e);
  if (debug.replicate) {
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      check_replicas(e, *e.inputs[i], fmt::format("input {}", i));
    }
    check_replicas(e, e.output, "the output");
  }
  if (debug.check) check_against_full(e);
}

// ---- installing the observers
// ----------------------------------------------------------------------

struct Installed {
  std::mutex mutex;
  int worlds = 0;      // live worlds with check, replicate or nan
  int nan_worlds = 0;  // of those, the ones with nan
  int op_observer = 0;
};

Installed& installed() {
  static Installed* state = new Installed();  // never destroyed: worlds may outlive statics
  return *state;
}

// Keeps the observers installed while a world holding it lives (WorldState::debug_hooks).
class HookToken {
 public:
  explicit HookToken(bool nan) : nan_(nan) {
    Installed& s = installed();
    std::lock_guard lock(s.mutex);
    if (s.worlds++ == 0) {
      s.op_observer = add_op_observer(on_op);
      set_collective_observer(on_collective);
    }
    if (nan_ && s.nan_worlds++ == 0) set_local_op_observer(on_local_op);
  }
  ~HookToken() {
    Installed& s = installed();
    std::lock_guard lock(s.mutex);
    if (nan_ && --s.nan_worlds == 0) set_local_op_observer(nullptr);
    if (--s.worlds == 0) {
      remove_op_observer(s.op_observer);
      set_collective_observer(nullptr);
    }
  }
  HookToken(const HookToken&) = delete;
  HookToken& operator=(const HookToken&) = delete;

 private:
  bool nan_;
};

}  // namespace

CheckTolerance check_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return {1e-9, 1e-12};
    case DType::F32:
      return {1e-4, 1e-5};
    case DType::BF16:
    case DType::F16:
      return {2e-2, 1e-2};
    default:
      return {0.0, 0.0};
  }
}

Tensor assemble_full_tensor(const DTensor& tensor) {
  const DTensorSpec& spec = tensor.spec();
  const Pieces pieces(tensor);
  const std::vector<int64_t> mesh_shape = spec.mesh_shape();
  Tensor out = empty(spec.shape(), spec.dtype());
  // Every combination of coordinates along the Shard mesh dims (0 elsewhere) names one block.
  std::vector<int64_t> coordinate(mesh_shape.size(), 0);
  while (true) {
    const Shape offset = spec.local_offset(coordinate);
    const Shape size = spec.local_shape(coordinate);
    if (shape_numel(size) > 0) {
      std::vector<int64_t> at = coordinate;
      Tensor block = pieces.block(at, 0);
      Tensor view = out;
      for (size_t d = 0; d < size.size(); ++d) {
        view = view.narrow(static_cast<int64_t>(d), offset[d], size[d]);
      }
      view.copy_(block);
    }
    int d = static_cast<int>(mesh_shape.size()) - 1;
    for (; d >= 0; --d) {
      if (!is_shard(spec.placements()[static_cast<size_t>(d)])) continue;
      if (++coordinate[static_cast<size_t>(d)] < mesh_shape[static_cast<size_t>(d)]) break;
      coordinate[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) break;
  }
  return out;
}

void set_debug(World& world, const DebugOptions& debug) {
  if (!world.defined())
    throw_error<Error>("set_debug: the world is undefined (default-constructed)");
  const WorldState& state = world.state();
  if ((debug.check || debug.replicate) &&
      state.held_ranks.size() != static_cast<size_t>(state.size)) {
    throw_error<ConfigError>(
        "--spmd-debug={}: this check compares the pieces of every rank, which only a process "
        "holding every rank has (the sim backend); this {} world holds rank(s) {}. Under real "
        "backends use --spmd-debug=fingerprint,nan",
        debug.check ? "check" : "replicate", state.backend_name, rank_ranges(state.held_ranks));
  }
  std::shared_ptr<const void> hooks;
  if (debug.check || debug.replicate || debug.nan)
    hooks = std::make_shared<const HookToken>(debug.nan);
  world.store_debug(debug, std::move(hooks));
}

}  // namespace spmd
