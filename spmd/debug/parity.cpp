// spmd/debug/parity.cpp: the parity run's record and comparison (Note [Parity run]).
#include <spmd/debug/parity.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include <spmd/core/call_site.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>
#include <spmd/debug/checks.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/tensor/shape.h>

namespace spmd {
namespace {

// One call site as parity tells sites apart: the user's line and the op made there.
struct SiteKey {
  std::string file;
  uint32_t line = 0;
  std::string op;

  bool operator<(const SiteKey& other) const {
    return std::tie(line, op, file) < std::tie(other.line, other.op, other.file);
  }
  std::string text() const { return fmt::format("'{}' at {}", op, site_text(file, line)); }
};

struct Parity {
  std::mutex mutex;
  enum class Phase { Off, Record, Compare } phase = Phase::Off;
  uint64_t world = 0;  // the id of the world whose DTensors count
  int observer = 0;
  std::map<SiteKey, std::vector<ParityValue>> record;
  std::map<SiteKey, size_t> seen;  // the compare phase's occurrences so far
  std::string last_agreed;         // "'add' at gpt.cpp:42 (occurrence 3)"
  std::string last_recorded;       // the record phase's last DTensor, the same way
  size_t compared = 0;
  size_t other_shape = 0;  // the global shape or dtype differs from the reference's
  size_t unmatched = 0;    // an occurrence the reference never reached
  size_t nested = 0;       // inside another public call
  std::string summary;
};

// An optimizer's new parameter values are compared at this multiple of the tolerance: Adam divides
// each gradient element by its root mean square plus eps, so an element near 0 turns the last bits
// of a sum's order into a visible part of its update (Note [Parity run]).
constexpr double kStepToleranceFactor = 100.0;

Parity& parity() {
  static Parity* state = new Parity();  // never destroyed: worlds may outlive statics
  return *state;
}

// "[0, 5, 1]": the multi-index of flat element `flat` of `shape`.
std::string index_text(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) break;
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(index);
}

std::string placements_text(const DTensor& t) {
  return fmt::format("({}) on {}", to_string(t.placements()), t.mesh().to_string());
}

std::string summary_text(const Parity& p) {
  return fmt::format(
      "parity: {} DTensors compared with the one-rank run at {} call sites; not compared: {} made "
      "inside another call, {} of another shape, {} the one-rank run never made",
      p.compared, p.seen.size(), p.nested, p.other_shape, p.unmatched);
}

[[noreturn]] void report(Parity& p, const SiteKey& key, size_t occurrence, const ParityValue& got,
                         const ParityValue& expected, const ParityDeparture& d, double tol,
                         const DTensor& output) {
  p.phase = Parity::Phase::Off;
  const std::string last = p.last_agreed.empty()
                               ? std::string("none (this is the first DTensor compared)")
                               : p.last_agreed;
  const std::string sampled =
      got.stride > 1 ? fmt::format(" (every {}th element compared)", got.stride) : "";
  throw_error<ParityError>(
      "--spmd-debug=parity: {} (occurrence {}) departs from the same program on one rank: the "
      "values differ by {:.3g} of the tensor's largest (tolerance {:g} for {}){} and most at index "
      "{}: {:.9g} here, {:.9g} on one rank. Here it is shape {} {}. The last site that still "
      "agreed: {}. What differs was computed at this line or in the local code that made its "
      "inputs (from_local, to_local, per-rank math){}",
      key.text(), occurrence + 1, d.relative, tol, dtype_name(got.dtype), sampled,
      index_text(d.flat * got.stride, got.shape), d.got, d.expected, shape_str(output.shape()),
      placements_text(output), last,
      d.relative < 100 * tol && !p.last_agreed.empty()
          ? fmt::format(". A difference this small where earlier values agreed can also be "
                        "rounding carried through training steps (sums in another order, in {}); "
                        "if so, a larger --spmd-parity-tol accepts it",
                        dtype_name(got.dtype))
          : std::string());
}

void on_op(const OpEvent& e) {
  Parity& p = parity();
  std::unique_lock lock(p.mutex);
  if (p.phase == Parity::Phase::Off) return;
  const DTensor& out = e.output;
  if (out.mesh().world().state().id != p.world || !out.participates()) return;
  if (e.nested) {
    ++p.nested;
    return;
  }
  SiteKey key{e.location.file_name(), e.location.line(), std::string(e.op)};
  ParityValue value = parity_value(assemble_full_tensor(out), placements_text(out));
  if (p.phase == Parity::Phase::Record) {
    std::vector<ParityValue>& values = p.record[key];
    values.push_back(std::move(value));
    p.last_recorded = fmt::format("{} (occurrence {})", key.text(), values.size());
    return;
  }
  const size_t occurrence = p.seen[key]++;
  const auto it = p.record.find(key);
  if (it == p.record.end() || occurrence >= it->second.size()) {
    ++p.unmatched;
    return;
  }
  const ParityValue& expected = it->second[occurrence];
  if (expected.shape != value.shape || expected.dtype != value.dtype ||
      expected.stride != value.stride) {
    ++p.other_shape;
    return;
  }
  double tol = parity_tolerance(value.dtype, out.mesh().world().debug().parity_tol);
  if (e.op == "step") tol *= kStepToleranceFactor;
  if (auto d = parity_departure(value, expected, tol)) {
    report(p, key, occurrence, value, expected, *d, tol, out);
  }
  ++p.compared;
  p.last_agreed = fmt::format("{} (occurrence {})", key.text(), occurrence + 1);
}

void start(Parity::Phase phase, const World& world) {
  Parity& p = parity();
  std::lock_guard lock(p.mutex);
  if (p.observer == 0) p.observer = add_op_observer(on_op);
  p.phase = phase;
  p.world = world.state().id;
  p.seen.clear();
  p.last_agreed.clear();
  p.compared = p.other_shape = p.unmatched = p.nested = 0;
}

}  // namespace

double parity_tolerance(DType dtype, double override) {
  switch (dtype) {
    case DType::F64:
      return override > 0.0 ? override : 1e-9;
    case DType::F32:
      return override > 0.0 ? override : 1e-3;
    case DType::BF16:
    case DType::F16:
      return override > 0.0 ? override : 5e-2;
    default:
      return 0.0;
  }
}

ParityValue parity_value(const Tensor& tensor, std::string placements) {
  ParityValue v;
  v.shape = tensor.shape();
  v.dtype = tensor.dtype();
  v.placements = std::move(placements);
  const int64_t n = tensor.numel();
  v.stride = n > kParitySampleLimit ? (n + kParitySampleLimit - 1) / kParitySampleLimit : 1;
  const Tensor flat = tensor.detach().to(Device{}).contiguous().reshape({n}).to(DType::F64);
  std::vector<double> all = flat.to_vector<double>();
  if (v.stride == 1) {
    v.values = std::move(all);
  } else {
    for (int64_t i = 0; i < n; i += v.stride) v.values.push_back(all[static_cast<size_t>(i)]);
  }
  return v;
}

std::optional<ParityDeparture> parity_departure(const ParityValue& got, const ParityValue& expected,
                                                double tol) {
  if (got.values.size() != expected.values.size()) {
    throw_error<InternalError>("parity: comparing {} values with {}", got.values.size(),
                               expected.values.size());
  }
  const size_t n = got.values.size();
  const double* a = got.values.data();
  const double* b = expected.values.data();
  // One pass, no division, over chunks on parallel_for's threads (the comparison is most of what
  // a parity run adds): the scale (the largest finite |expected|), the largest finite
  // |difference| (its first index), the first pair of non-finite values that are not the same
  // (NaN with NaN, +inf with +inf agree). The worst relative difference is diff / scale, so the
  // largest difference is the worst element.
  struct Part {
    double scale = 0.0;
    double worst = 0.0;
    size_t worst_at = SIZE_MAX;
    size_t first_nonfinite = SIZE_MAX;
  };
  Part total;
  std::mutex merge;
  parallel_for(static_cast<int64_t>(n), int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    Part part;
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
      const double e = std::abs(b[i]);
      if (e > part.scale && e != INFINITY) part.scale = e;  // false for NaN
      const double diff = std::abs(a[i] - b[i]);
      if (diff > part.worst) {  // false for NaN
        part.worst = diff;
        part.worst_at = i;
      }
      if (!std::isfinite(diff) && part.first_nonfinite == SIZE_MAX) {
        const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i];
        if (!same) part.first_nonfinite = i;
      }
    }
    const std::lock_guard lock(merge);
    total.scale = std::max(total.scale, part.scale);
    if (part.worst > total.worst || (part.worst == total.worst && part.worst_at < total.worst_at)) {
      total.worst = part.worst;
      total.worst_at = part.worst_at;
    }
    total.first_nonfinite = std::min(total.first_nonfinite, part.first_nonfinite);
  });
  const double scale = total.scale;
  const double worst = total.worst;
  const size_t worst_at = total.worst_at == SIZE_MAX ? n : total.worst_at;
  const size_t first_nonfinite = total.first_nonfinite == SIZE_MAX ? n : total.first_nonfinite;
  size_t first_nonzero = n;
  auto at = [&](size_t i, double relative) {
    return ParityDeparture{static_cast<int64_t>(i), a[i], b[i], relative};
  };
  if (first_nonfinite != n) return at(first_nonfinite, INFINITY);
  if (worst_at == n) return std::nullopt;  // every pair equal (or the same non-finite value)
  if (scale == 0.0) {
    for (size_t i = 0; i < n && first_nonzero == n; ++i) {
      if (std::abs(a[i] - b[i]) > 0.0) first_nonzero = i;
    }
    return at(first_nonzero, INFINITY);
  }
  const double relative = worst / scale;
  if (relative > tol) return at(worst_at, relative);
  return std::nullopt;
}

void parity_record(const World& reference) {
  start(Parity::Phase::Record, reference);
  std::lock_guard lock(parity().mutex);
  parity().record.clear();
  parity().last_recorded.clear();
}

std::string parity_last_recorded() {
  std::lock_guard lock(parity().mutex);
  return parity().last_recorded;
}

void parity_compare(const World& world) {
  start(Parity::Phase::Compare, world);
}

void parity_end() {
  Parity& p = parity();
  std::lock_guard lock(p.mutex);
  if (p.phase == Parity::Phase::Compare || !p.seen.empty()) p.summary = summary_text(p);
  p.phase = Parity::Phase::Off;
  if (p.observer != 0) remove_op_observer(p.observer);
  p.observer = 0;
  p.record.clear();
  p.seen.clear();
}

std::string parity_summary() {
  std::lock_guard lock(parity().mutex);
  return parity().summary;
}

}  // namespace spmd
