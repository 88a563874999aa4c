// spmd/testing/assertions.cpp: the predicate formatters of EXPECT_DTENSOR_EQ/NEAR,
// EXPECT_PLACEMENTS and EXPECT_REPLICATED, and the report of a failure the rank threads share.
#include <spmd/testing/assertions.h>

#include <cxxabi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <spmd/collectives/functional.h>
#include <spmd/tensor/autograd_meta.h>
#include <spmd/tensor/compare.h>
#include <spmd/tensor/factory.h>
#include <spmd/world/backend_driver.h>

namespace spmd::testing {
namespace {

// ---- element access -----------------------------------------------------------------------------

// A tensor's elements as doubles (floating dtypes) or exactly as int64 (integers, Bool).
struct Elements {
  DType dtype = DType::F32;
  std::vector<double> floats;
  std::vector<int64_t> ints;

  explicit Elements(const Tensor& t) : dtype(t.dtype()) {
    const Tensor host = t.detach().to(Device{}).contiguous();
    if (is_floating(dtype)) {
      floats = host.to(DType::F64).to_vector<double>();
    } else {
      ints = host.to(DType::I64).to_vector<int64_t>();
    }
  }
  size_t size() const { return is_floating(dtype) ? floats.size() : ints.size(); }
  // Same value; NaN equals NaN.
  bool same(size_t i, const Elements& other) const {
    if (!is_floating(dtype)) return ints[i] == other.ints[i];
    const double a = floats[i];
    const double b = other.floats[i];
    return a == b || (std::isnan(a) && std::isnan(b));
  }
  double as_double(size_t i) const {
    return is_floating(dtype) ? floats[i] : static_cast<double>(ints[i]);
  }
  // Element i as the dtype prints it: floats at their own precision, Bool as true/false.
  std::string str(size_t i) const {
    if (dtype == DType::Bool) return ints[i] ? "true" : "false";
    return is_floating(dtype) ? format(floats[i]) : fmt::format("{}", ints[i]);
  }
  // A value (an element, a difference) at the dtype's precision.
  std::string format(double value) const {
    return dtype == DType::F64 ? fmt::format("{}", value)
                               : fmt::format("{}", static_cast<float>(value));
  }
};

// ---- who is reporting ---------------------------------------------------------------------------

// The lowest rank of a mesh (of all its sibling meshes).
int lowest_rank(const DeviceMesh& mesh) {
  const std::vector<int64_t> ranks = mesh.rank_table_values().values;
  return static_cast<int>(*std::min_element(ranks.begin(), ranks.end()));
}

// A failure that every rank in scope reaches alike (they compared the same gathered data), as this
// rank reports it. Under sim, `message` as it is. Otherwise the lowest rank in scope, `reporter`,
// gives `message` and every other rank one line, "the same failure as rank R: <summary>", so a
// failure is printed in full once, not once per rank. Under threads, whose rank threads report
// into one GoogleTest run, each starts with the rank; under mpi and nccl the test main prefixes
// the lines of every rank but the coordinator.
std::string as_reported(const World& world, int reporter, const std::string& summary,
                        const std::string& message) {
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) return message;
  const int rank = world.held_ranks().front();
  const BackendDriver* driver = find_backend_driver(world.backend_name());
  const std::string prefix =
      driver != nullptr && driver->thread_per_world ? fmt::format("[rank {}] ", rank) : "";
  if (rank == reporter) return prefix + message;
  return fmt::format("{}the same failure as rank {}: {}", prefix, reporter, summary);
}

// ---- the DTensor comparisons --------------------------------------------------------------------

// One side of a comparison: a DTensor or a full Tensor, and its full tensor.
struct Side {
  std::string expr;
  const DTensor* dtensor = nullptr;
  Tensor full;

  Side(const char* e, const DTensor& d) : expr(e), dtensor(&d) {
    NoGradGuard no_grad;
    full = d.detach().full_tensor();
  }
  Side(const char* e, const Tensor& t) : expr(e), full(t) {}

  std::string describe() const {
    if (dtensor == nullptr)
      return fmt::format("Tensor {} {}", shape_str(full.shape()), full.dtype());
    return fmt::format("DTensor {} {}, {} on {}", shape_str(dtensor->shape()), dtensor->dtype(),
                       to_string(dtensor->placements()), dtensor->mesh().to_string());
  }

  // "; index [1, 6] is on rank 3" for a DTensor: every rank of the mesh (of every sibling mesh)
  // whose piece holds the element, computed from the spec, so every process can say it.
  std::string where(const std::vector<int64_t>& index) const {
    if (dtensor == nullptr) return "";
    const DTensorSpec& spec = dtensor->spec();
    const RankTable table = spec.mesh().rank_table_values();
    const std::vector<int64_t> mesh_shape = spec.mesh_shape();
    int64_t mesh_size = 1;
    for (int64_t s : mesh_shape) mesh_size *= s;
    std::vector<int> ranks;
    for (size_t p = 0; p < table.values.size(); ++p) {
      const std::vector<int64_t> coordinate =
          unravel_index(static_cast<int64_t>(p) % mesh_size, mesh_shape);
      const Shape offset = spec.local_offset(coordinate);
      const Shape size = spec.local_shape(coordinate);
      bool inside = true;
      for (size_t d = 0; d < index.size() && inside; ++d) {
        inside = index[d] >= offset[d] && index[d] < offset[d] + size[d];
      }
      if (inside) ranks.push_back(static_cast<int>(table.values[p]));
    }
    std::sort(ranks.begin(), ranks.end());
    return fmt::format("; index {} is {}on rank{} {}", shape_str(index),
                       spec.has_partial() ? "a partial value " : "", ranks.size() == 1 ? "" : "s",
                       ranks_compact(ranks));
  }

  const World* world() const { return dtensor ? &dtensor->mesh().world() : nullptr; }
  int lowest_rank() const { return dtensor ? testing::lowest_rank(dtensor->mesh()) : INT_MAX; }
};

// Compares the full tensors: exactly, or within `atol`.
::testing::AssertionResult compare(const Side& a, const Side& b, const char* atol_expr,
                                   std::optional<double> atol) {
  const World* world = a.world() ? a.world() : b.world();
  const int reporter = std::min(a.lowest_rank(), b.lowest_rank());
  const size_t width = std::max(a.expr.size(), b.expr.size());
  const std::string summary = fmt::format("the full tensors of {} and {} differ", a.expr, b.expr);
  auto fail = [&](const std::string& message) {
    return ::testing::AssertionFailure()
           << (world ? as_reported(*world, reporter, summary, message) : message);
  };
  auto both = [&] {
    return fmt::format("\n  {:<{}}: {}\n  {:<{}}: {}", a.expr, width, a.describe(), b.expr, width,
                       b.describe());
  };
  if (a.full.shape() != b.full.shape()) {
    return fail(fmt::format("The full tensors of {} and {} differ in shape: {} vs {}{}", a.expr,
                            b.expr, shape_str(a.full.shape()), shape_str(b.full.shape()), both()));
  }
  if (a.full.dtype() != b.full.dtype()) {
    return fail(fmt::format(
        "The full tensors of {} and {} differ in dtype: {} vs {} (convert one with .to()){}",
        a.expr, b.expr, a.full.dtype(), b.full.dtype(), both()));
  }
  const Elements x(a.full);
  const Elements y(b.full);
  std::optional<size_t> first;
  std::optional<size_t> first_nan;  // the first element off by NaN (NaN on one side only)
  size_t count = 0;
  size_t largest_at = 0;
  double largest = -1.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x.same(i, y)) continue;
    const double difference = std::abs(x.as_double(i) - y.as_double(i));
    if (atol && difference <= *atol) continue;
    ++count;
    if (!first) first = i;
    if (std::isnan(difference)) {
      if (!first_nan) first_nan = i;
    } else if (difference > largest) {
      largest = difference;
      largest_at = i;
    }
  }
  if (first_nan) {
    largest = NAN;
    largest_at = *first_nan;
  }
  if (!first) return ::testing::AssertionSuccess();
  const Shape& shape = a.full.shape();
  const std::vector<int64_t> index = unravel_index(static_cast<int64_t>(*first), shape);
  std::string how = "differ";
  std::string detail;
  if (atol) {
    how = fmt::format("differ by more than {}", *atol);
    if (how.substr(how.rfind(' ') + 1) != atol_expr) how += fmt::format(" ({})", atol_expr);
    const double difference = std::abs(x.as_double(*first) - y.as_double(*first));
    detail = fmt::format(" (difference {}", x.format(difference));
    if (largest_at != *first) {
      detail += fmt::format("; the largest is {} at index {}", x.format(largest),
                            shape_str(unravel_index(static_cast<int64_t>(largest_at), shape)));
    }
    detail += ")";
  }
  const size_t value_width = std::max(x.str(*first).size(), y.str(*first).size());
  return fail(fmt::format(
      "The full tensors of {} and {} {} at {} of {} elements; the first is index {}{}:\n"
      "  {:<{}} = {:<{}}  {}{}\n"
      "  {:<{}} = {:<{}}  {}{}",
      a.expr, b.expr, how, count, x.size(), shape_str(index), detail, a.expr, width, x.str(*first),
      value_width, a.describe(), a.where(index), b.expr, width, y.str(*first), value_width,
      b.describe(), b.where(index)));
}

// ---- EXPECT_REPLICATED --------------------------------------------------------------------------

// The first difference between two shards, or nullopt: "rank 0 holds 0.5 and rank 2 holds 0.25 at
// index [1, 3] (shape [2, 4] f32)".
std::optional<std::string> shard_difference(int rank_a, const Tensor& a, int rank_b,
                                            const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return fmt::format("rank {} holds a {} {} shard and rank {} a {} {} one", rank_a,
                       shape_str(a.shape()), a.dtype(), rank_b, shape_str(b.shape()), b.dtype());
  }
  if (a.is_same(b)) return std::nullopt;
  const Elements x(a);
  const Elements y(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x.same(i, y)) continue;
    size_t count = 0;
    for (size_t j = i; j < x.size(); ++j) count += x.same(j, y) ? 0 : 1;
    return fmt::format(
        "rank {} holds {} and rank {} holds {} at index {} ({} of {} elements "
        "differ; shape {} {})",
        rank_a, x.str(i), rank_b, y.str(i),
        shape_str(unravel_index(static_cast<int64_t>(i), a.shape())), count, x.size(),
        shape_str(a.shape()), a.dtype());
  }
  return std::nullopt;
}

// The slots of a shard's header: dtype, ndim, then up to kHeaderDims sizes (a shard of more dims
// has the product of the rest in the last slot).
constexpr int64_t kHeaderDims = 8;

Tensor shard_header(const Tensor& shard) {
  std::vector<int64_t> header(2 + kHeaderDims, 0);
  header[0] = static_cast<int64_t>(shard.dtype());
  header[1] = shard.dim();
  for (int64_t d = 0; d < shard.dim(); ++d) {
    const size_t slot = static_cast<size_t>(2 + std::min(d, kHeaderDims - 1));
    header[slot] = d < kHeaderDims ? shard.size(d) : header[slot] * shard.size(d);
  }
  return from_vector(header, {2 + kHeaderDims});
}

std::string header_str(const Tensor& header) {
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  const Shape shape(h.begin() + 2, h.begin() + 2 + std::min(h[1], kHeaderDims));
  return fmt::format("{} {}", shape_str(shape), static_cast<DType>(h[0]));
}

// The first difference within the group of each held rank, from the group's gathered headers and
// data (threads, mpi, nccl): the group and what differs.
std::optional<std::pair<std::vector<int>, std::string>> gathered_difference(
    const LocalTensor& shards, const DeviceMesh& mesh, const MeshDim& dim,
    const std::vector<std::vector<int>>& groups) {
  constexpr int64_t kSlots = 2 + kHeaderDims;
  auto group_of = [&](int rank) -> const std::vector<int>& {
    return *std::find_if(groups.begin(), groups.end(), [&](const std::vector<int>& g) {
      return std::find(g.begin(), g.end(), rank) != g.end();
    });
  };
  const LocalTensor headers =
      all_gather(shards.map([](int, const Tensor& s) { return shard_header(s); }), mesh, dim);
  bool same_headers = true;
  std::optional<std::pair<std::vector<int>, std::string>> found;
  for (int rank : shards.ranks()) {
    const std::vector<int>& group = group_of(rank);
    const Tensor all = headers.shard(rank);
    const Tensor first = all.narrow(0, 0, kSlots);
    for (size_t k = 1; k < group.size() && !found; ++k) {
      const Tensor header = all.narrow(0, static_cast<int64_t>(k) * kSlots, kSlots);
      if (equal(header, first)) continue;
      same_headers = false;
      found = {group, fmt::format("rank {} holds a {} shard and rank {} a {} one", group[0],
                                  header_str(first), group[k], header_str(header))};
    }
  }
  // Every rank of a group reaches the same verdict on the headers, so the group gathers the data
  // together or not at all.
  if (!same_headers) return found;
  const LocalTensor data = all_gather(
      shards.map([](int, const Tensor& s) { return s.contiguous().reshape({s.numel()}); }), mesh,
      dim);
  for (int rank : shards.ranks()) {
    const std::vector<int>& group = group_of(rank);
    const Tensor& mine = shards.shard(rank);
    const int64_t numel = mine.numel();
    const Tensor all = data.shard(rank);
    const Tensor first = all.narrow(0, 0, numel).reshape(mine.shape());
    for (size_t k = 1; k < group.size(); ++k) {
      const Tensor other =
          all.narrow(0, static_cast<int64_t>(k) * numel, numel).reshape(mine.shape());
      if (auto difference = shard_difference(group[0], first, group[k], other)) {
        return std::pair{group, *difference};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type.name());
}

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return fmt::format("{}: {}", e.type_name(), e.what());
  } catch (const std::exception& e) {
    return fmt::format("{}: {}", type_name(typeid(e)), e.what());
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const DTensor& a,
                                      const DTensor& b) {
  return compare(Side(a_expr, a), Side(b_expr, b), nullptr, std::nullopt);
}
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const DTensor& a,
                                      const Tensor& b) {
  return compare(Side(a_expr, a), Side(b_expr, b), nullptr, std::nullopt);
}
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const Tensor& a,
                                      const DTensor& b) {
  return compare(Side(a_expr, a), Side(b_expr, b), nullptr, std::nullopt);
}
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const Tensor& a,
                                      const Tensor& b) {
  return compare(Side(a_expr, a), Side(b_expr, b), nullptr, std::nullopt);
}
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const DTensor& a, const DTensor& b,
                                        double atol) {
  return compare(Side(a_expr, a), Side(b_expr, b), atol_expr, atol);
}
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const DTensor& a, const Tensor& b,
                                        double atol) {
  return compare(Side(a_expr, a), Side(b_expr, b), atol_expr, atol);
}
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const Tensor& a, const DTensor& b,
                                        double atol) {
  return compare(Side(a_expr, a), Side(b_expr, b), atol_expr, atol);
}
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const Tensor& a, const Tensor& b,
                                        double atol) {
  return compare(Side(a_expr, a), Side(b_expr, b), atol_expr, atol);
}

::testing::AssertionResult placements_are(const char* d_expr, const char* expected_expr,
                                          const DTensor& d, const Placements& expected) {
  Placements want = expected;
  for (Placement& p : want) {
    if (const Shard* s = std::get_if<Shard>(&p); s && s->dim < 0) {
      p = Shard{static_cast<int>(s->dim + d.dim())};
    }
  }
  if (want == d.placements()) return ::testing::AssertionSuccess();
  // The expected value's expression, unless it is the placements' own text ("S(1)").
  const std::string source = fmt::format("\"{}\"", to_string(expected)) == expected_expr
                                 ? ""
                                 : fmt::format(" ({})", expected_expr);
  return ::testing::AssertionFailure() << as_reported(
             d.mesh().world(), lowest_rank(d.mesh()),
             fmt::format("{} has placements {}, expected {}", d_expr, to_string(d.placements()),
                         to_string(want)),
             fmt::format("{} has placements {}, expected {}{}; {} is a DTensor {} {} on {}", d_expr,
                         to_string(d.placements()), to_string(want), source, d_expr,
                         shape_str(d.shape()), d.dtype(), d.mesh().to_string()));
}

::testing::AssertionResult placements_are(const char* d_expr, const char* expected_expr,
                                          const DTensor& d, std::string_view expected) {
  Placements parsed;
  try {
    parsed = parse_placements(expected);
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << "EXPECT_PLACEMENTS(" << d_expr << ", " << expected_expr
                                         << "): the expected placements do not parse: " << e.what();
  }
  return placements_are(d_expr, expected_expr, d, parsed);
}

::testing::AssertionResult replicated(const char* local_expr, const char* mesh_expr,
                                      const char* dim_expr, const LocalTensor& local,
                                      const DeviceMesh& mesh, const MeshDim& dim) {
  NoGradGuard no_grad;
  const LocalTensor shards = local.detach();
  const World& world = mesh.world();
  std::vector<std::vector<int>> groups;
  try {
    groups = mesh.groups(dim);
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << "EXPECT_REPLICATED(" << local_expr << ", " << mesh_expr
                                         << ", " << dim_expr << "): " << e.what();
  }
  const std::string summary = fmt::format("the shards of {} are not replicated along mesh dim {}",
                                          local_expr, dim.to_string());
  const std::string what =
      fmt::format("The shards of {} are not replicated along mesh dim {} of {}", local_expr,
                  dim.to_string(), mesh.to_string());
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) {
    // Every rank is here (sim): compare each group's held shards with its first.
    std::optional<std::string> first;
    std::vector<int> first_group;
    int bad_groups = 0;
    for (const std::vector<int>& group : groups) {
      std::optional<int> reference;
      for (int rank : group) {
        if (!shards.holds(rank)) continue;
        if (!reference) {
          reference = rank;
          continue;
        }
        if (auto difference =
                shard_difference(*reference, shards.shard(*reference), rank, shards.shard(rank))) {
          if (!first) {
            first = difference;
            first_group = group;
          }
          ++bad_groups;
          break;
        }
      }
    }
    if (!first) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << fmt::format("{}: in group {}, {}{}", what, ranks_str(first_group), *first,
                          groups.size() > 1
                              ? fmt::format(" ({} of {} groups differ)", bad_groups, groups.size())
                              : "");
  }
  // Each rank compares the shards of its own group, gathered.
  for (int rank : shards.ranks()) {
    if (!mesh.contains(rank)) {
      return ::testing::AssertionFailure()
             << fmt::format("EXPECT_REPLICATED({}, {}, {}): rank {} is not in {}", local_expr,
                            mesh_expr, dim_expr, rank, mesh.to_string());
    }
  }
  if (auto difference = gathered_difference(shards, mesh, dim, groups)) {
    return ::testing::AssertionFailure() << as_reported(
               world, *std::min_element(difference->first.begin(), difference->first.end()),
               summary,
               fmt::format("{}: in group {}, {}", what, ranks_str(difference->first),
                           difference->second));
  }
  return ::testing::AssertionSuccess();
}

}  // namespace spmd::testing
