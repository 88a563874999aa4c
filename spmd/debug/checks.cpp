// spmd/debug/checks.cpp: the check, replicate and nan modes of --spmd-debug (Note [Check modes])
// and set_debug, which installs their observers.
#include <spmd/debug/checks.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <spmd/collectives/backend.h>
#include <spmd/collectives/fingerprint.h>
#include <spmd/collectives/functional.h>
#include <spmd/collectives/reduce_kernels.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/debug/value_dump.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/mesh/layout.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/nonfinite.h>
#include <spmd/world/spmd_types.h>

namespace spmd {
namespace {

// ---- element access -----------------------------------------------------------------------------

std::string index_str(int64_t flat, const Shape& shape) {
  return shape_str(unravel_index(flat, shape));
}

// Values as doubles (exact for every dtype but I64 beyond 2^53, which only messages print).
std::vector<double> values(const Tensor& t) {
  return t.detach().to(Device{}).contiguous().to_vector<double>();
}

// Same value, NaN equal to NaN (and integers compared exactly).
bool same_value(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The first flat index where `a` and `b` (same shape) differ, NaN equal to NaN.
std::optional<int64_t> first_difference(const Tensor& a, const Tensor& b) {
  if (a.is_same(b)) return std::nullopt;
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
    std::vector<int64_t> x = a.detach().to(Device{}).contiguous().to_vector<int64_t>();
    std::vector<int64_t> y = b.detach().to(Device{}).contiguous().to_vector<int64_t>();
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

// The first NaN or infinity of `t` (with `nan_only`, the first NaN: --spmd-debug=nan:allow-inf).
std::optional<NonFinite> first_nonfinite(const Tensor& t, bool nan_only) {
  if (!is_floating(t.dtype()) || t.numel() == 0 || !has_nonfinite(t)) return std::nullopt;
  std::vector<double> v = values(t);
  for (size_t i = 0; i < v.size(); ++i) {
    if (nan_only ? std::isnan(v[i]) : !std::isfinite(v[i])) {
      return NonFinite{static_cast<int64_t>(i), v[i]};
    }
  }
  return std::nullopt;
}

// What to do about an infinity the report is about: -inf masks are common (causal attention).
std::string_view inf_hint(double v) {
  return std::isnan(v) ? ""
                       : " (infinities that are meant, such as a -inf mask, pass with "
                         "--spmd-debug=nan:allow-inf)";
}

// Whether the LocalTensor hook, which has no world, reports infinities: unless every world with
// nan allows them.
std::atomic<bool> g_local_nan_only{false};

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

// ---- every rank's pieces --------------------------------------------------------------------

// Every rank's piece of a DTensor, with each rank's mesh coordinate: the held pieces under sim,
// gathered over the mesh with internal collectives under threads and mpi (Note [Check modes]).
// Under sim the ranks of every sibling mesh are there; a gathered set has this rank's sibling.
struct PieceSet {
  const DTensorSpec* spec = nullptr;
  std::vector<int> ranks;  // ascending under sim, in group order when gathered
  std::vector<std::vector<int64_t>> coordinates;
  std::vector<Tensor> pieces;
  bool gathered = false;

  const Tensor* piece(int rank) const {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == rank) return &pieces[i];
    }
    return nullptr;
  }
};

PieceSet held_pieces(const DTensor& t) {
  PieceSet set;
  set.spec = &t.spec();
  const DTensorSpec::RankInfo& info = t.spec().rank_info();
  set.ranks = info.ranks;
  set.coordinates = info.coordinates;
  set.pieces = t.local().shards();
  return set;
}

// The name of the 1-D mesh over all dims that the gathers run on: internal, one per layout.
std::string gather_mesh_name(const DeviceMesh& mesh) {
  return "spmd_debug" + coalesce(mesh.layout()).to_string();
}

// The pieces of this rank's sibling mesh, gathered: the shapes first (pieces may differ in shape),
// then every piece flattened and padded to the largest.
PieceSet gathered_pieces(const DTensor& t) {
  const DeviceMesh& mesh = t.mesh();
  const LocalTensor& local = t.local();
  if (local.num_shards() != 1) {
    throw_error<Unsupported>(
        "--spmd-debug=check,replicate: gathering the pieces of a DTensor on mesh {} needs one "
        "held rank per process or thread (this one holds ranks {})",
        mesh.to_string(), ranks_str(local.ranks()));
  }
  const DeviceMesh flat = mesh.ndim() == 1 ? mesh : mesh.flatten(gather_mesh_name(mesh));
  const int me = local.ranks().front();
  const GroupFamily family = flat.group_family(0);
  const auto where = family.locate(me);
  SPMD_CHECK(where.has_value());
  const std::vector<int> group = family.group(where->group);
  const int64_t n = static_cast<int64_t>(group.size());
  const Tensor mine = local.shard_at(0).detach().to(Device{}).contiguous();
  const int64_t nd = mine.dim();

  std::vector<int64_t> row{mine.numel()};
  row.insert(row.end(), mine.shape().begin(), mine.shape().end());
  const LocalTensor rows = LocalTensor({me}, {from_vector(row, {1, nd + 1})});
  const std::vector<int64_t> shapes =
      internal_collective(rows, flat, 0, AllGatherOptions{0}).shard_at(0).to_vector<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i)
    longest = std::max(longest, shapes[static_cast<size_t>(i * (nd + 1))]);

  PieceSet set;
  set.spec = &t.spec();
  set.gathered = true;
  Tensor all;
  if (longest > 0) {
    Tensor padded = zeros({1, longest}, mine.dtype());
    if (mine.numel() > 0) padded.narrow(1, 0, mine.numel()).copy_(mine.reshape({1, mine.numel()}));
    all = internal_collective(LocalTensor({me}, {padded}), flat, 0, AllGatherOptions{0})
              .shards()
              .front();
  }
  for (int64_t i = 0; i < n; ++i) {
    const int rank = group[static_cast<size_t>(i)];
    const auto* entry = &shapes[static_cast<size_t>(i * (nd + 1))];
    const int64_t numel = entry[0];
    const Shape shape(entry + 1, entry + 1 + nd);
    Tensor piece = numel == 0 ? zeros(shape, mine.dtype())
                              : all.select(0, i).narrow(0, 0, numel).reshape(shape).contiguous();
    set.ranks.push_back(rank);
    set.coordinates.push_back(*mesh.coordinate_of(rank));
    set.pieces.push_back(std::move(piece));
  }
  return set;
}

// Every rank's pieces, gathering when this process does not hold them all.
PieceSet all_pieces(const DTensor& t) {
  const World& world = t.mesh().world();
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) return held_pieces(t);
  return gathered_pieces(t);
}

// ---- assembling the global value
// ------------------------------------------------------------------

// For each mesh coordinate, the piece of the lowest rank there (one sibling mesh).
class Pieces {
 public:
  explicit Pieces(const PieceSet& set) : spec_(*set.spec) {
    for (size_t r = 0; r < set.ranks.size(); ++r) {
      auto [it, fresh] =
          pieces_.emplace(set.coordinates[r], std::pair{set.ranks[r], &set.pieces[r]});
      if (!fresh && set.ranks[r] < it->second.first) it->second = {set.ranks[r], &set.pieces[r]};
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
    if (dim == placements.size()) return pieces_.at(coordinate).second->contiguous();
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
  std::map<std::vector<int64_t>, std::pair<int, const Tensor*>> pieces_;
};

Tensor assemble(const PieceSet& set) {
  const DTensorSpec& spec = *set.spec;
  const Pieces pieces(set);
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

// Ranks whose piece holds global element `index` (of every sibling mesh in the set).
std::vector<int> holders(const PieceSet& set, const std::vector<int64_t>& index) {
  std::vector<int> out;
  const DTensorSpec& spec = *set.spec;
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    const Shape offset = spec.local_offset(set.coordinates[r]);
    const Shape size = spec.local_shape(set.coordinates[r]);
    bool inside = true;
    for (size_t d = 0; d < index.size() && inside; ++d) {
      inside = index[d] >= offset[d] && index[d] < offset[d] + size[d];
    }
    if (inside) out.push_back(set.ranks[r]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- check
// ----------------------------------------------------------------------------------------

void check_against_full(const OpEvent& e, const std::vector<PieceSet>& inputs,
                        const PieceSet& output) {
  std::vector<Tensor> full_inputs;
  full_inputs.reserve(inputs.size());
  for (const PieceSet& input : inputs) full_inputs.push_back(assemble(input));
  const Tensor got = assemble(output);
  const Tensor expected = e.reference(full_inputs);
  auto context = [&] {
    return fmt::format("{}; output: {}{}; mesh {}", describe_inputs(e), describe_dtensor(e.output),
                       describe_args(e), e.output.mesh().to_string());
  };
  if (got.shape() != expected.shape()) {
    throw_error<DivergenceError>(
        "--spmd-debug=check: DTensor op '{}' at {} gives a global shape {} but the same op on the "
        "full tensors gives {} ({})",
        e.op, site_text(e.location), shape_str(got.shape()), shape_str(expected.shape()),
        context());
  }
  // The loosest of the output's and the float inputs' tolerances: a value carries the rounding of
  // the narrowest dtype it went through (a BF16 gradient pending a sum, cast to F32, sums its
  // pieces in F32 where the full tensor was summed in BF16 first).
  CheckTolerance tol = check_tolerance(e.output.dtype());
  for (const DTensor* in : e.inputs) {
    if (!is_floating(in->dtype())) continue;
    const CheckTolerance t = check_tolerance(in->dtype());
    tol.atol = std::max(tol.atol, t.atol);
    tol.rtol = std::max(tol.rtol, t.rtol);
  }
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
  const std::vector<int64_t> index = unravel_index(worst, got.shape());
  const std::string tolerance =
      exact ? "exact for " + std::string(dtype_name(e.output.dtype()))
            : fmt::format("tolerance {:g} + {:g} * |expected|", tol.atol, tol.rtol);
  throw_error<DivergenceError>(
      "--spmd-debug=check: DTensor op '{}' at {} differs from the same op on the full tensors: "
      "max error {:g} at index {} (sharded {:g}, single-device {:g}; {} of {} elements off, {}); "
      "that element is held by rank(s) {} ({})",
      e.op, site_text(e.location), worst_error, shape_str(index), g[static_cast<size_t>(worst)],
      x[static_cast<size_t>(worst)], bad, g.size(), tolerance,
      ranks_compact(holders(output, index)), context());
}

// ---- replicate
// -------------------------------------------------------------------------------------

// What a replica difference in `which` of the op means, for the report.
enum class Role { Input, Output, Claim };

void check_replicas(const OpEvent& e, const PieceSet& set, const DTensor& t, Role role,
                    size_t input) {
  const DTensorSpec& spec = *set.spec;
  for (int d = 0; d < spec.mesh_ndim(); ++d) {
    if (!is_replicate(spec.placements()[static_cast<size_t>(d)])) continue;
    for (const std::vector<int>& group : spec.mesh().group_family(d).groups()) {
      const Tensor* first = set.piece(group[0]);
      if (first == nullptr) continue;
      for (size_t k = 1; k < group.size(); ++k) {
        const Tensor* other = set.piece(group[k]);
        if (other == nullptr) continue;
        std::optional<int64_t> at = first_difference(*first, *other);
        if (!at) continue;
        const size_t i = static_cast<size_t>(*at);
        const std::string facts = fmt::format(
            "rank {} holds {:g} and rank {} holds {:g} at index {} of the piece (group ranks {}; "
            "{}; mesh {})",
            group[0], values(*first)[i], group[k], values(*other)[i],
            index_str(*at, first->shape()), ranks_str(group), describe_dtensor(t),
            spec.mesh().to_string());
        const DebugOptions& debug = e.output.mesh().world().debug();
        const std::string mode = debug.replicate ? "replicate" : debug.check ? "check" : "types";
        if (role == Role::Claim && e.op == "to_local") {
          const std::string name = spec.mesh().dim_name(d);
          throw_error<DivergenceError>(
              "--spmd-debug={}: to_local at {} claims through grad_placements {} that the "
              "gradient of its LocalTensor is Replicate on mesh dim {} ('{}'), but the gradient "
              "that arrived differs between the ranks: {}. The '{}' pieces differ: this gradient "
              "is Partial over '{}' (each rank computed its own term of the sum), not Replicate; "
              "pass grad_placements with Partial{{}} on '{}' to that to_local",
              mode, site_text(e.location), to_string(spec.placements()), d, name, facts, name, name,
              name);
        }
        if (role == Role::Claim) {
          throw_error<DivergenceError>(
              "--spmd-debug={}: DTensor::from_local at {} claims Replicate on mesh dim {} ('{}') "
              "but the pieces differ: {}. If each rank holds a partial sum, say Partial() (and "
              "redistribute to Replicate); if the pieces are meant to differ, say Shard, or reduce "
              "them first",
              mode, site_text(e.location), d, spec.mesh().dim_name(d), facts);
        }
        throw_error<DivergenceError>(
            "--spmd-debug={}: {} of DTensor op '{}' at {} is Replicate on mesh dim {} ('{}') but "
            "its replicas differ: {}{}",
            mode, role == Role::Output ? std::string("the output") : fmt::format("input {}", input),
            e.op, site_text(e.location), d, spec.mesh().dim_name(d), facts,
            role == Role::Output ? ""
                                 : ": they diverged before this op (a write through "
                                   "mutable_shard, a LocalTensor computed per rank, or from_local "
                                   "of rank-dependent data)");
      }
    }
  }
}

// ---- nan
// -------------------------------------------------------------------------------------------

// " (its inputs were finite on rank 2)" or " (input 1 already held NaN on rank 2 at index [3])".
template <class ShardOf>
std::string input_note(size_t num_inputs, int rank, bool nan_only, ShardOf&& shard_of) {
  for (size_t i = 0; i < num_inputs; ++i) {
    const Tensor* shard = shard_of(i);
    if (shard == nullptr) continue;
    if (auto bad = first_nonfinite(*shard, nan_only)) {
      return fmt::format(
          "; input {} already held {} on rank {} at index {}: it came from code the check does "
          "not see (LocalTensor::map, from_fn, from_local, data read in)",
          i, nonfinite_name(bad->value), rank, index_str(bad->flat, shard->shape()));
    }
  }
  return fmt::format("; its inputs were finite on rank {}", rank);
}

void check_nonfinite(const OpEvent& e, bool nan_only) {
  if (expected_overflow()) return;  // Note [Expected overflow]
  const LocalTensor& local = e.output.local();
  const DTensorSpec::RankInfo& info = e.output.spec().rank_info();
  for (size_t r = 0; r < local.num_shards(); ++r) {
    const Tensor& piece = local.shard_at(r);
    if (r > 0 && piece.is_same(local.shard_at(r - 1))) continue;
    auto bad = first_nonfinite(piece, nan_only);
    if (!bad) continue;
    const int rank = local.ranks()[r];
    std::vector<int64_t> global = unravel_index(bad->flat, piece.shape());
    for (size_t d = 0; d < global.size(); ++d) global[d] += info.local_offsets[r][d];
    const bool claim = e.inputs.empty();  // from_local: the user's pieces
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: {} '{}' at {} {} {} on rank {} at index {} of its piece (global index "
        "{}){}; output {}; {}{}{}",
        claim ? (e.op == "to_local" ? "the gradient of" : "DTensor::from_local") : "DTensor op",
        e.op, site_text(e.location), claim ? "received" : "produced", nonfinite_name(bad->value),
        rank, index_str(bad->flat, piece.shape()), shape_str(global),
        claim ? std::string()
              : input_note(e.inputs.size(), rank, nan_only,
                           [&](size_t i) -> const Tensor* {
                             const LocalTensor& in = e.inputs[i]->local();
                             return in.holds(rank) ? &in.shard(rank) : nullptr;
                           }),
        describe_dtensor(e.output), describe_inputs(e), describe_args(e), inf_hint(bad->value));
  }
}

void on_local_op(std::string_view op, std::span<const LocalTensor* const> inputs,
                 const LocalTensor& result, const SourceLocation& location) {
  if (expected_overflow()) return;  // Note [Expected overflow]
  const bool nan_only = g_local_nan_only.load(std::memory_order_relaxed);
  for (size_t r = 0; r < result.num_shards(); ++r) {
    const Tensor& shard = result.shard_at(r);
    if (r > 0 && shard.is_same(result.shard_at(r - 1))) continue;
    auto bad = first_nonfinite(shard, nan_only);
    if (!bad) continue;
    const int rank = result.ranks()[r];
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: LocalTensor op '{}' at {} produced {} on rank {} at index {} (shape "
        "{}){}{}",
        op, site_text(location), nonfinite_name(bad->value), rank,
        index_str(bad->flat, shard.shape()), shape_str(shard.shape()),
        input_note(inputs.size(), rank, nan_only,
                   [&](size_t i) -> const Tensor* {
                     return inputs[i]->holds(rank) ? &inputs[i]->shard(rank) : nullptr;
                   }),
        inf_hint(bad->value));
  }
}

// ---- divergence: the shadow run (Note [Shadow run]) -------------------------------------------

struct ShadowCall {
  CollectiveKind kind;
  std::string dim_name;
  std::string file;
  uint32_t line = 0;

  bool operator==(const ShadowCall&) const = default;
  std::string to_string() const {
    return fmt::format("{} over mesh dim '{}' at {}", kind, dim_name, site_text(file, line));
  }
};

struct Shadow {
  std::mutex mutex;
  enum class Phase { Off, Record, Compare } phase = Phase::Off;
  std::vector<ShadowCall> calls;  // the shadow pass's collectives
  size_t next = 0;                // the real pass's position
  bool complete = true;           // false: the shadow pass threw part way
};

Shadow& shadow() {
  static Shadow* state = new Shadow();
  return *state;
}

void on_shadow_collective(const CollectiveEvent& e) {
  Shadow& sh = shadow();
  std::lock_guard lock(sh.mutex);
  if (sh.phase == Shadow::Phase::Off) return;
  ShadowCall call{e.kind, e.dim_name, e.location.file_name(), e.location.line()};
  if (sh.phase == Shadow::Phase::Record) {
    sh.calls.push_back(std::move(call));
    return;
  }
  const size_t i = sh.next++;
  if (i < sh.calls.size() && sh.calls[i] == call) return;
  if (i >= sh.calls.size() && !sh.complete) return;
  sh.phase = Shadow::Phase::Off;
  throw_error<DivergenceError>(
      "--spmd-debug=divergence: {} is collective #{} of the coordinator (rank 0), but the other "
      "ranks {} there: only the coordinator reaches this call (code under "
      "`if (world.is_coordinator())`?). On a cluster rank 0 waits here for peers that never come",
      call.to_string(), i,
      i < sh.calls.size() ? "issue " + sh.calls[i].to_string() : std::string("issue no more"));
}

void on_collective(const CollectiveEvent& e) {
  const DebugOptions& debug = e.world.debug();
  if (debug.divergence) on_shadow_collective(e);
  if (!debug.nan || expected_overflow()) return;
  const bool nan_only = debug.allow_inf;
  const LocalTensor& result = e.output;
  for (size_t r = 0; r < result.num_shards(); ++r) {
    const Tensor& shard = result.shard_at(r);
    if (r > 0 && shard.is_same(result.shard_at(r - 1))) continue;
    auto bad = first_nonfinite(shard, nan_only);
    if (!bad) continue;
    const int rank = result.ranks()[r];
    // Which held input was already non-finite, if any (under a real backend only this rank's).
    std::string note =
        "; every input this process holds was finite (an overflow in the "
        "reduction, or another process's input)";
    for (size_t i = 0; i < e.input.num_shards(); ++i) {
      if (auto in = first_nonfinite(e.input.shard_at(i), nan_only)) {
        note = fmt::format("; the input of rank {} already held {} at index {}", e.input.ranks()[i],
                           nonfinite_name(in->value),
                           index_str(in->flat, e.input.shard_at(i).shape()));
        break;
      }
    }
    throw_error<NonFiniteError>(
        "--spmd-debug=nan: {} over mesh dim '{}' at {} produced {} on rank {} at index {} "
        "(shape {}){}{}",
        e.kind, e.dim_name, site_text(e.location), nonfinite_name(bad->value), rank,
        index_str(bad->flat, shard.shape()), shape_str(shard.shape()), note, inf_hint(bad->value));
  }
}

// Whether this process can see every rank's piece of a DTensor on `world`: it holds them all
// (sim), or gathers them with internal collectives over CPU tensors (threads, mpi).
bool sees_every_piece(const World& world) {
  const WorldState& state = world.state();
  return state.held_ranks.size() == static_cast<size_t>(state.size) ||
         (state.held_ranks.size() == 1 && state.device_type == "cpu");
}

void on_op(const OpEvent& e) {
  // notify_value's events name values other events already checked.
  if (e.def == &value_event_def()) return;
  const DebugOptions& debug = e.output.mesh().world().debug();
  if (debug.nan) check_nonfinite(e, debug.allow_inf);
  // to_local's grad_placements, checked against the gradient that arrived: under replicate and
  // types (whose claims it is), wherever the pieces can be seen.
  if (e.op == "to_local" && e.inputs.empty()) {
    if ((debug.check || debug.replicate || debug.types) &&
        sees_every_piece(e.output.mesh().world()))
      check_replicas(e, all_pieces(e.output), e.output, Role::Claim, 0);
    return;
  }
  if (!debug.check && !debug.replicate) return;
  // Every rank's pieces (gathered under threads and mpi, in the same order on every rank).
  std::vector<PieceSet> inputs;
  inputs.reserve(e.inputs.size());
  for (const DTensor* input : e.inputs) inputs.push_back(all_pieces(*input));
  const PieceSet output = all_pieces(e.output);
  // Root causes first: an input whose replicas already differ, then the user's claim
  // (from_local), then the op's own output.
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_replicas(e, inputs[i], *e.inputs[i], Role::Input, i);
  }
  const bool claim = e.inputs.empty();
  check_replicas(e, output, e.output, claim ? Role::Claim : Role::Output, 0);
  // An op whose result depends on the split (FP8 training's rank-local scales) has no full-tensor
  // equivalent to compare with.
  const bool split_dependent =
      e.def != nullptr && e.def->split_dependent != nullptr && e.def->split_dependent(e.args);
  if (debug.check && !claim && !split_dependent) check_against_full(e, inputs, output);
}

// ---- installing the observers
// ----------------------------------------------------------------------

struct Installed {
  std::mutex mutex;
  int worlds = 0;             // live worlds with check, replicate or nan
  int nan_worlds = 0;         // of those, the ones with nan
  int strict_nan_worlds = 0;  // of those, the ones that report infinities too
  int op_observer = 0;
};

Installed& installed() {
  static Installed* state = new Installed();  // never destroyed: worlds may outlive statics
  return *state;
}

// Keeps the observers installed while a world holding it lives (WorldState::debug_hooks).
class HookToken {
 public:
  HookToken(bool nan, bool allow_inf) : nan_(nan), strict_(nan && !allow_inf) {
    Installed& s = installed();
    std::lock_guard lock(s.mutex);
    if (s.worlds++ == 0) {
      s.op_observer = add_op_observer(on_op);
      set_collective_observer(on_collective);
    }
    if (strict_) ++s.strict_nan_worlds;
    if (nan_ && s.nan_worlds++ == 0) set_local_op_observer(on_local_op);
    g_local_nan_only.store(s.strict_nan_worlds == 0, std::memory_order_relaxed);
  }
  ~HookToken() {
    Installed& s = installed();
    std::lock_guard lock(s.mutex);
    if (strict_) --s.strict_nan_worlds;
    g_local_nan_only.store(s.strict_nan_worlds == 0, std::memory_order_relaxed);
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
  bool strict_;
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
  return assemble(held_pieces(tensor));
}

void create_debug_communicators(const DeviceMesh& mesh) {
  const DebugOptions& debug = mesh.world().debug();
  if (!debug.check && !debug.replicate) return;
  const DeviceMesh flat = mesh.ndim() == 1 ? mesh : mesh.flatten(gather_mesh_name(mesh));
  (void)communicator(flat, 0, internal_comm_options());
}

void set_debug(World& world, const DebugOptions& debug) {
  if (!world.defined())
    throw_error<Error>("set_debug: the world is undefined (default-constructed)");
  const WorldState& state = world.state();
  const bool holds_all = state.held_ranks.size() == static_cast<size_t>(state.size);
  if ((debug.check || debug.replicate) && !holds_all && state.device_type != "cpu") {
    throw_error<ConfigError>(
        "--spmd-debug={}: this check compares the pieces of every rank; on the {} backend that "
        "would gather every piece onto every GPU, which spmdsim does not do. Run the program "
        "under sim or threads for it, and use --spmd-debug=fingerprint,nan here",
        debug.check ? "check" : "replicate", state.backend_name);
  }
  if ((debug.check || debug.replicate) && !holds_all && state.held_ranks.size() != 1) {
    throw_error<ConfigError>(
        "--spmd-debug={}: gathering the pieces needs one rank per process or thread; this {} "
        "world holds rank(s) {}",
        debug.check ? "check" : "replicate", state.backend_name, ranks_compact(state.held_ranks));
  }
  if (debug.divergence && !world.backend().is_lockstep()) {
    throw_error<ConfigError>(
        "--spmd-debug=divergence: the shadow run is the sim backend's check (one process plays "
        "every rank); under {} each rank runs its own control flow, and a collective only some "
        "ranks issue is already reported (a DeadlockError under threads, the watchdog under mpi)",
        state.backend_name);
  }
  if (debug.parity && !(world.backend().is_lockstep() && holds_all)) {
    throw_error<ConfigError>(
        "--spmd-debug=parity: the run on one rank is the sim backend's check (one process holds "
        "every rank and both runs); under {} run the program with --spmd-backend=sim for it",
        state.backend_name);
  }
  if (debug.all) {
    throw_error<ConfigError>(
        "set_debug: `all` must be resolved to the backend's checks first (launch() does: "
        "BackendDriver::debug_all)");
  }
  std::shared_ptr<const HookToken> checks;
  if (debug.check || debug.replicate || debug.nan || debug.divergence || debug.types)
    checks = std::make_shared<const HookToken>(debug.nan, debug.allow_inf);
  // Types are on in the process while a world with them lives; the data check needs every shard
  // (Note [Types against the data] in world/spmd_types.cpp).
  std::shared_ptr<const TypesScope> types;
  if (debug.types) types = std::make_shared<const TypesScope>(holds_all && state.size > 1);
  // Note [Value dumps] (debug/value_dump.h): this world's DTensors written while it lives.
  std::shared_ptr<const void> dump;
  if (!debug.dump_values.empty()) dump = start_value_dump(world, debug.dump_values);
  world.store_debug(
      debug, std::make_shared<
                 const std::tuple<std::shared_ptr<const HookToken>,
                                  std::shared_ptr<const TypesScope>, std::shared_ptr<const void>>>(
                 std::move(checks), std::move(types), std::move(dump)));
}

void shadow_run_record() {
  Shadow& sh = shadow();
  std::lock_guard lock(sh.mutex);
  sh.phase = Shadow::Phase::Record;
  sh.calls.clear();
  sh.next = 0;
  sh.complete = true;
}

void shadow_run_compare(bool shadow_completed) {
  Shadow& sh = shadow();
  std::lock_guard lock(sh.mutex);
  sh.phase = Shadow::Phase::Compare;
  sh.next = 0;
  sh.complete = shadow_completed;
}

void shadow_run_finish() {
  Shadow& sh = shadow();
  std::lock_guard lock(sh.mutex);
  const bool comparing = sh.phase == Shadow::Phase::Compare;
  sh.phase = Shadow::Phase::Off;
  if (!comparing || !sh.complete || sh.next >= sh.calls.size()) return;
  throw_error<DivergenceError>(
      "--spmd-debug=divergence: {} is collective #{} of the ranks other than the coordinator, "
      "but the coordinator (rank 0) issues no more collectives: only the other ranks reach this "
      "call (code under `if (!world.is_coordinator())`?). On a cluster they wait here for rank 0",
      sh.calls[sh.next].to_string(), sh.next);
}

void shadow_run_end() {
  Shadow& sh = shadow();
  std::lock_guard lock(sh.mutex);
  sh.phase = Shadow::Phase::Off;
  sh.calls.clear();
  sh.next = 0;
}

}  // namespace spmd
