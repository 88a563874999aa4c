// The collectives conformance table (ggml test-backend-ops style): every collective x group
// family (1-D, 2-D, 3-D meshes, sliced, flattened, unflattened, from_ranks permutations, size-1
// dims) x shape (including 0-size) x dtype x reduce op, each checked against an element-by-element
// reference computed here from the inputs' definition.
//
// Inputs are exact by construction: element i of rank r's input is a small integer drawn from
// (seed, r, i), so sums and products are exact in every dtype and results compare with ==
// (tolerance only for Avg). Every process can compute every rank's input, so the same body runs
// under backends where a process or thread holds only its own rank (mpirun, threads), checking the
// held ranks only.
// Failures name the case, the rank, the element index, the expected and the actual value.
//
// Under nccl the inputs are made on the host and LocalTensor::from_fn moves them to each rank's
// GPU (Note [NCCL device placement]); results come back through to_vector. Floating Avg is
// compared with a tolerance there too: NCCL pre-multiplies by 1/n (Note [NCCL semantics]).
// SPMD_CONFORMANCE_DTYPES=f32,bf16,... limits the table to those dtypes (scripts/gpu-check thins
// its slow runs of several ranks time-sharing one GPU this way).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/functional.h>
#include <spmd/core/env.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/random.h>
#include <spmd/testing.h>
#include <spmd/world/local_tensor.h>

namespace spmd {
namespace {

// ---- inputs ---------------------------------------------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Values in {-2, -1, 1, 2} (bool: {0, 1}): sums and products of up to 8 of them are exact in
// BF16, F16 and F32.
double input_value(uint64_t seed, int rank, int64_t index, DType dtype) {
  const uint64_t h =
      mix(seed ^ mix(static_cast<uint64_t>(rank) * 1000003ULL + static_cast<uint64_t>(index)));
  if (dtype == DType::Bool) return static_cast<double>((h >> 7) & 1);
  static const double kValues[4] = {-2, -1, 1, 2};
  return kValues[h & 3];
}

std::vector<double> input_values(uint64_t seed, int rank, const Shape& shape, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = input_value(seed, rank, static_cast<int64_t>(i), dtype);
  return v;
}

Tensor make_input(uint64_t seed, int rank, const Shape& shape, DType dtype) {
  // from_vector makes a 1-D tensor for an empty shape; reshape gives the 0-d one.
  return from_vector(input_values(seed, rank, shape, dtype)).reshape(shape).to(dtype);
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// ---- reference reductions -------------------------------------------------------------------

double fold(ReduceOp op, DType dtype, const std::vector<double>& v) {
  const double n = static_cast<double>(v.size());
  if (dtype == DType::Bool) {
    bool acc = v[0] != 0;
    for (size_t i = 1; i < v.size(); ++i) {
      const bool x = v[i] != 0;
      if (op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::BOr) acc = acc || x;
      if (op == ReduceOp::Product || op == ReduceOp::Min || op == ReduceOp::BAnd) acc = acc && x;
      if (op == ReduceOp::BXor) acc = acc != x;
    }
    return acc ? 1.0 : 0.0;
  }
  if (is_integral(dtype)) {
    int64_t acc = static_cast<int64_t>(v[0]);
    for (size_t i = 1; i < v.size(); ++i) {
      const int64_t x = static_cast<int64_t>(v[i]);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg:
          acc += x;
          break;
        case ReduceOp::Product:
          acc *= x;
          break;
        case ReduceOp::Min:
          acc = std::min(acc, x);
          break;
        case ReduceOp::Max:
          acc = std::max(acc, x);
          break;
        case ReduceOp::BAnd:
          acc &= x;
          break;
        case ReduceOp::BOr:
          acc |= x;
          break;
        case ReduceOp::BXor:
          acc ^= x;
          break;
      }
    }
    if (op == ReduceOp::Avg) acc /= static_cast<int64_t>(v.size());
    return static_cast<double>(acc);
  }
  double acc = v[0];
  for (size_t i = 1; i < v.size(); ++i) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc += v[i];
        break;
      case ReduceOp::Product:
        acc *= v[i];
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v[i]);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v[i]);
        break;
      default:
        break;
    }
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

std::vector<ReduceOp> ops_for(DType dtype) {
  // Float8 tensors are moved, never reduced (Conformance.Float8IsMovedNotReduced).
  if (is_float8(dtype)) return {};
  if (dtype == DType::Bool) {
    return {ReduceOp::Sum,  ReduceOp::Product, ReduceOp::Min, ReduceOp::Max,
            ReduceOp::BAnd, ReduceOp::BOr,     ReduceOp::BXor};
  }
  if (is_integral(dtype)) {
    return {ReduceOp::Sum, ReduceOp::Avg,  ReduceOp::Product, ReduceOp::Min,
            ReduceOp::Max, ReduceOp::BAnd, ReduceOp::BOr,     ReduceOp::BXor};
  }
  return {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
}

double tolerance(DType dtype, ReduceOp op) {
  if (op != ReduceOp::Avg || !is_floating(dtype)) return 0.0;
  return dtype == DType::BF16 ? 1e-2 : dtype == DType::F16 ? 1e-3 : 1e-6;
}

// The concatenation of the group members' inputs along dim d (all_gather, gather).
std::vector<double> concat_reference(uint64_t seed, const std::vector<int>& group,
                                     const Shape& shape, int64_t d, DType dtype) {
  Shape out_shape = shape;
  out_shape[static_cast<size_t>(d)] *= static_cast<int64_t>(group.size());
  std::vector<double> expected(static_cast<size_t>(shape_numel(out_shape)));
  for (size_t i = 0; i < expected.size(); ++i) {
    std::vector<int64_t> idx = unravel_index(static_cast<int64_t>(i), out_shape);
    const int64_t piece = shape[static_cast<size_t>(d)];
    const int member = group[static_cast<size_t>(idx[static_cast<size_t>(d)] / piece)];
    idx[static_cast<size_t>(d)] %= piece;
    expected[i] = input_value(seed, member, ravel(idx, shape), dtype);
  }
  return expected;
}

// The element-wise reduction of the group members' inputs (all_reduce, reduce).
std::vector<double> fold_reference(uint64_t seed, const std::vector<int>& group, const Shape& shape,
                                   ReduceOp op, DType dtype) {
  std::vector<double> expected(static_cast<size_t>(shape_numel(shape)));
  std::vector<double> v(group.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    for (size_t k = 0; k < group.size(); ++k) {
      v[k] = input_value(seed, group[k], static_cast<int64_t>(i), dtype);
    }
    expected[i] = fold(op, dtype, v);
  }
  return expected;
}

// The dtypes of the table: every dtype, or those SPMD_CONFORMANCE_DTYPES lists.
const std::vector<DType>& table_dtypes() {
  static const std::vector<DType> dtypes = [] {
    const auto list = env_value("SPMD_CONFORMANCE_DTYPES");
    if (!list) return std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes));
    std::vector<DType> out;
    size_t start = 0;
    while (start <= list->size()) {
      size_t end = list->find(',', start);
      if (end == std::string::npos) end = list->size();
      const std::string name = list->substr(start, end - start);
      if (!name.empty()) {
        const auto dtype = parse_dtype(name);
        if (!dtype) throw_error<ConfigError>("SPMD_CONFORMANCE_DTYPES: unknown dtype '{}'", name);
        out.push_back(*dtype);
      }
      start = end + 1;
    }
    return out;
  }();
  return dtypes;
}

// ---- group families -------------------------------------------------------------------------

struct Family {
  std::string name;
  std::function<DeviceMesh(const World&)> make;
  std::string dim;
};

std::vector<Family> families(int w) {
  std::vector<Family> out;
  out.push_back(
      {"1d", [w](const World& world) { return init_device_mesh(world, {w}, {"x"}); }, "x"});
  if (w % 2 == 0) {
    auto mesh2 = [w](const World& world) {
      return init_device_mesh(world, {2, w / 2}, {"a", "b"});
    };
    out.push_back({"2d_inner", mesh2, "b"});
    out.push_back({"2d_outer", mesh2, "a"});
    out.push_back(
        {"unflatten_inner",
         [w](const World& world) {
           return init_device_mesh(world, {w}, {"x"}).unflatten(0, {2, w / 2}, {"u", "v"});
         },
         "v"});
    out.push_back(
        {"unflatten_outer",
         [w](const World& world) {
           return init_device_mesh(world, {w}, {"x"}).unflatten("x", {2, w / 2}, {"u", "v"});
         },
         "u"});
    out.push_back({"from_ranks_perm",
                   [w](const World& world) {
                     // A permutation of the world: rank ids reversed within halves, halves swapped.
                     std::vector<int64_t> ids(static_cast<size_t>(w));
                     for (int i = 0; i < w; ++i)
                       ids[static_cast<size_t>(i)] = (w / 2 + (w - 1 - i)) % w;
                     return DeviceMesh::from_ranks(world, from_vector(ids, {2, w / 2}), {"p", "q"});
                   },
                   "q"});
    out.push_back({"from_ranks_perm_outer",
                   [w](const World& world) {
                     std::vector<int64_t> ids(static_cast<size_t>(w));
                     for (int i = 0; i < w; ++i) ids[static_cast<size_t>(i)] = (3 * i + 1) % w;
                     if (w % 3 == 0) std::iota(ids.rbegin(), ids.rend(), 0);
                     return DeviceMesh::from_ranks(world, from_vector(ids, {2, w / 2}), {"p", "q"});
                   },
                   "p"});
    out.push_back({"size1_dim",
                   [w](const World& world) {
                     return init_device_mesh(world, {1, w}, {"one", "all"});
                   },
                   "one"});
  }
  if (w % 4 == 0) {
    auto mesh3 = [w](const World& world) {
      return init_device_mesh(world, {2, 2, w / 4}, {"a", "b", "c"});
    };
    out.push_back({"3d_a", mesh3, "a"});
    out.push_back({"3d_b", mesh3, "b"});
    out.push_back({"3d_c", mesh3, "c"});
    out.push_back({"sliced_skip",
                   [mesh3](const World& world) {
                     return mesh3(world)[{"a", "c"}];
                   },
                   "a"});
    out.push_back({"flatten_contiguous",
                   [mesh3](const World& world) {
                     return mesh3(world)[{"a", "b"}].flatten("ab");
                   },
                   "ab"});
    out.push_back({"flatten_strided",
                   [mesh3](const World& world) {
                     return mesh3(world)[{"a", "c"}].flatten("ac");
                   },
                   "ac"});
  }
  return out;
}

struct ShapeCase {
  std::string name;
  Shape shape;
};

std::vector<ShapeCase> shapes_for(int64_t g, bool with_scalar) {
  std::vector<ShapeCase> out = {
      {"vec", {2 * g}}, {"mat", {g, 3}}, {"empty", {0, 2}}, {"cube", {2, 2 * g, 2}}};
  if (with_scalar) out.push_back({"scalar", {}});
  return out;
}

// ---- the harness ----------------------------------------------------------------------------

// One case's context: the mesh, the group of every held rank, and the inputs.
struct CaseMesh {
  DeviceMesh mesh;
  std::vector<std::vector<int>> groups;
  int64_t group_size = 0;

  const std::vector<int>& group_of(int rank, int64_t* index) const {
    for (const auto& g : groups) {
      for (size_t i = 0; i < g.size(); ++i) {
        if (g[i] == rank) {
          *index = static_cast<int64_t>(i);
          return g;
        }
      }
    }
    ADD_FAILURE() << "rank " << rank << " is in no group";
    static const std::vector<int> none;
    return none;
  }
};

CaseMesh setup(const World& world, const Family& family) {
  CaseMesh s{family.make(world), {}, 0};
  s.groups = s.mesh.groups(family.dim);
  s.group_size = static_cast<int64_t>(s.groups.front().size());
  return s;
}

// Compares one rank's result with the expected shape and values; reports the first difference.
void expect_result(const std::string& label, int rank, const Tensor& got, const Shape& shape,
                   const std::vector<double>& expected, double tol) {
  ASSERT_TRUE(got.defined()) << label << ": rank " << rank << ": no result";
  ASSERT_EQ(got.shape(), shape) << label << ": rank " << rank << ": shape "
                                << shape_str(got.shape()) << ", expected " << shape_str(shape);
  std::vector<double> v = got.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    const bool ok =
        tol == 0.0 ? v[i] == expected[i]
                   : std::abs(v[i] - expected[i]) <= tol * std::max(1.0, std::abs(expected[i]));
    if (!ok) {
      ADD_FAILURE() << label << ": rank " << rank << " index " << i << " expected " << expected[i]
                    << " got " << v[i];
      return;
    }
  }
}

// Per thread: under threads every rank thread runs the same cases and must draw the same seeds.
thread_local uint64_t g_seed = 1;

template <class Body>
int for_each_case(const World& world, bool with_scalar, Body&& body) {
  int cases = 0;
  for (const Family& family : families(world.size())) {
    CaseMesh s = setup(world, family);
    for (const ShapeCase& sc : shapes_for(s.group_size, with_scalar)) {
      for (DType dtype : table_dtypes()) {
        body(family, s, sc, dtype, g_seed++);
        ++cases;
      }
    }
  }
  return cases;
}

std::string label_of(const char* op, const Family& f, const ShapeCase& sc, DType dtype,
                     const std::string& extra = "") {
  return fmt::format("{}/{}/{}/{}/{}{}", op, f.name, f.dim, sc.name, dtype,
                     extra.empty() ? "" : "/" + extra);
}

LocalTensor inputs(const World& world, uint64_t seed, const Shape& shape, DType dtype) {
  return LocalTensor::from_fn(world, [&](int r) { return make_input(seed, r, shape, dtype); });
}

// ---- the tests, one per collective ----------------------------------------------------------

SPMD_TEST(Conformance, AllReduce) {
  int cases = for_each_case(
      world, true,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        for (ReduceOp op : ops_for(dtype)) {
          const std::string label =
              label_of("all_reduce", f, sc, dtype, std::string(reduce_op_name(op)));
          LocalTensor y = all_reduce(x, s.mesh, f.dim, op);
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            std::vector<double> expected = fold_reference(seed, group, sc.shape, op, dtype);
            expect_result(label, r, y.shard(r), sc.shape, expected, tolerance(dtype, op));
          }
        }
      });
  EXPECT_GT(cases, 0);
}

SPMD_TEST(Conformance, AllGather) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        for (int64_t gd : {int64_t{0}, int64_t{-1}}) {
          const std::string label =
              label_of("all_gather", f, sc, dtype, fmt::format("gather_dim={}", gd));
          LocalTensor y = all_gather(x, s.mesh, f.dim, gd);
          const int64_t d = gd < 0 ? gd + static_cast<int64_t>(sc.shape.size()) : gd;
          Shape out_shape = sc.shape;
          out_shape[static_cast<size_t>(d)] *= s.group_size;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            expect_result(label, r, y.shard(r), out_shape,
                          concat_reference(seed, group, sc.shape, d, dtype), 0.0);
          }
        }
      });
}

SPMD_TEST(Conformance, ReduceScatter) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        const int64_t sd = sc.name == "cube" ? 1 : 0;
        for (ReduceOp op : ops_for(dtype)) {
          const std::string label =
              label_of("reduce_scatter", f, sc, dtype,
                       fmt::format("{}/scatter_dim={}", reduce_op_name(op), sd));
          LocalTensor y = reduce_scatter(x, s.mesh, f.dim, op, sd);
          Shape out_shape = sc.shape;
          const int64_t piece = out_shape[static_cast<size_t>(sd)] / s.group_size;
          out_shape[static_cast<size_t>(sd)] = piece;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            std::vector<double> expected(static_cast<size_t>(shape_numel(out_shape)));
            for (size_t i = 0; i < expected.size(); ++i) {
              std::vector<int64_t> idx = unravel_index(static_cast<int64_t>(i), out_shape);
              idx[static_cast<size_t>(sd)] += gi * piece;
              std::vector<double> v;
              for (int m : group) v.push_back(input_value(seed, m, ravel(idx, sc.shape), dtype));
              expected[i] = fold(op, dtype, v);
            }
            expect_result(label, r, y.shard(r), out_shape, expected, tolerance(dtype, op));
          }
        }
      });
}

SPMD_TEST(Conformance, AllToAll) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        std::vector<std::pair<int64_t, int64_t>> dims = {{0, 0}};
        if (sc.name == "mat" || sc.name == "empty") dims.push_back({0, 1});
        if (sc.name == "cube") dims = {{1, 1}, {1, 0}, {1, 2}};
        for (auto [split, concat] : dims) {
          const std::string label = label_of("all_to_all", f, sc, dtype,
                                             fmt::format("split={},concat={}", split, concat));
          LocalTensor y = all_to_all(x, s.mesh, f.dim, split, concat);
          Shape piece_shape = sc.shape;
          piece_shape[static_cast<size_t>(split)] /= s.group_size;
          Shape out_shape = piece_shape;
          out_shape[static_cast<size_t>(concat)] *= s.group_size;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            std::vector<double> expected(static_cast<size_t>(shape_numel(out_shape)));
            for (size_t i = 0; i < expected.size(); ++i) {
              std::vector<int64_t> idx = unravel_index(static_cast<int64_t>(i), out_shape);
              const int64_t pc = piece_shape[static_cast<size_t>(concat)];
              const int source = group[static_cast<size_t>(idx[static_cast<size_t>(concat)] / pc)];
              idx[static_cast<size_t>(concat)] %= pc;
              idx[static_cast<size_t>(split)] += gi * piece_shape[static_cast<size_t>(split)];
              expected[i] = input_value(seed, source, ravel(idx, sc.shape), dtype);
            }
            expect_result(label, r, y.shard(r), out_shape, expected, 0.0);
          }
        }
      });
}

SPMD_TEST(Conformance, AllToAllSingle) {
  for (const Family& f : families(world.size())) {
    CaseMesh s = setup(world, f);
    const int64_t n = s.group_size;
    for (DType dtype : table_dtypes()) {
      const uint64_t seed = g_seed++;
      // Uneven: group rank i sends (i + j) % 3 rows to group rank j.
      auto in_for = [&](int r) {
        int64_t gi = 0;
        s.group_of(r, &gi);
        std::vector<int64_t> splits(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) splits[static_cast<size_t>(j)] = (gi + j) % 3;
        return splits;
      };
      auto out_for = [&](int r) {
        int64_t gj = 0;
        s.group_of(r, &gj);
        std::vector<int64_t> splits(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) splits[static_cast<size_t>(i)] = (i + gj) % 3;
        return splits;
      };
      auto rows_of = [](const std::vector<int64_t>& v) {
        return std::accumulate(v.begin(), v.end(), int64_t{0});
      };
      const std::vector<int>& held = world.held_ranks();
      PerRank<std::vector<int64_t>> in_splits =
          PerRank<std::vector<int64_t>>::from_fn(held, in_for);
      PerRank<std::vector<int64_t>> out_splits =
          PerRank<std::vector<int64_t>>::from_fn(held, out_for);
      LocalTensor x = LocalTensor::from_fn(world, [&](int r) {
        return make_input(seed, r, {rows_of(in_for(r)), 2}, dtype);
      });
      const std::string label = fmt::format("all_to_all_single/{}/{}/{}", f.name, f.dim, dtype);
      LocalTensor y = all_to_all_single(x, s.mesh, f.dim, out_splits, in_splits);
      for (int r : held) {
        int64_t gj = 0;
        const auto& group = s.group_of(r, &gj);
        std::vector<double> expected;
        for (int64_t i = 0; i < n; ++i) {
          const int source = group[static_cast<size_t>(i)];
          std::vector<int64_t> src_splits(static_cast<size_t>(n));
          for (int64_t k = 0; k < n; ++k) src_splits[static_cast<size_t>(k)] = (i + k) % 3;
          int64_t first_row = 0;
          for (int64_t k = 0; k < gj; ++k) first_row += src_splits[static_cast<size_t>(k)];
          for (int64_t row = 0; row < src_splits[static_cast<size_t>(gj)]; ++row) {
            for (int64_t c = 0; c < 2; ++c) {
              expected.push_back(input_value(seed, source, (first_row + row) * 2 + c, dtype));
            }
          }
        }
        expect_result(label, r, y.shard(r), {rows_of(out_for(r)), 2}, expected, 0.0);
      }
      // Even split (no split sizes).
      LocalTensor even = inputs(world, seed, {2 * n, 3}, dtype);
      LocalTensor z = all_to_all_single(even, s.mesh, f.dim, {}, {});
      for (int r : held) {
        int64_t gj = 0;
        const auto& group = s.group_of(r, &gj);
        std::vector<double> expected;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t e = 0; e < 6; ++e) {
            expected.push_back(input_value(seed, group[static_cast<size_t>(i)], gj * 6 + e, dtype));
          }
        }
        expect_result(label + "/even", r, z.shard(r), {2 * n, 3}, expected, 0.0);
      }
    }
  }
}

SPMD_TEST(Conformance, Broadcast) {
  for_each_case(
      world, true,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        for (int src : {0, static_cast<int>(s.group_size) - 1}) {
          LocalTensor y = broadcast(x, s.mesh, f.dim, src);
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            expect_result(label_of("broadcast", f, sc, dtype, fmt::format("src={}", src)), r,
                          y.shard(r), sc.shape,
                          input_values(seed, group[static_cast<size_t>(src)], sc.shape, dtype),
                          0.0);
          }
        }
      });
}

SPMD_TEST(Conformance, Scatter) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        const int64_t sd = sc.name == "cube" ? 1 : 0;
        for (int src : {0, static_cast<int>(s.group_size) - 1}) {
          LocalTensor y = scatter(x, s.mesh, f.dim, src, sd);
          Shape out_shape = sc.shape;
          const int64_t piece = out_shape[static_cast<size_t>(sd)] / s.group_size;
          out_shape[static_cast<size_t>(sd)] = piece;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            std::vector<double> expected(static_cast<size_t>(shape_numel(out_shape)));
            for (size_t i = 0; i < expected.size(); ++i) {
              std::vector<int64_t> idx = unravel_index(static_cast<int64_t>(i), out_shape);
              idx[static_cast<size_t>(sd)] += gi * piece;
              expected[i] =
                  input_value(seed, group[static_cast<size_t>(src)], ravel(idx, sc.shape), dtype);
            }
            expect_result(label_of("scatter", f, sc, dtype, fmt::format("src={}", src)), r,
                          y.shard(r), out_shape, expected, 0.0);
          }
        }
      });
}

SPMD_TEST(Conformance, Gather) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        for (int dst : {0, static_cast<int>(s.group_size) - 1}) {
          const int64_t gd = sc.name == "cube" ? 2 : 0;
          LocalTensor y = gather(x, s.mesh, f.dim, dst, gd);
          Shape out_shape = sc.shape;
          out_shape[static_cast<size_t>(gd)] *= s.group_size;
          Shape none_shape = sc.shape;
          none_shape[static_cast<size_t>(gd)] = 0;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            const std::string label = label_of("gather", f, sc, dtype, fmt::format("dst={}", dst));
            if (gi != dst) {
              expect_result(label, r, y.shard(r), none_shape, {}, 0.0);
              continue;
            }
            expect_result(label, r, y.shard(r), out_shape,
                          concat_reference(seed, group, sc.shape, gd, dtype), 0.0);
          }
        }
      });
}

SPMD_TEST(Conformance, Reduce) {
  for_each_case(
      world, false,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        const int dst = static_cast<int>(s.group_size) - 1;
        for (ReduceOp op : ops_for(dtype)) {
          LocalTensor y = reduce(x, s.mesh, f.dim, op, dst);
          Shape none_shape = sc.shape;
          none_shape[0] = 0;
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            const std::string label =
                label_of("reduce", f, sc, dtype, std::string(reduce_op_name(op)));
            if (gi != dst) {
              expect_result(label, r, y.shard(r), none_shape, {}, 0.0);
              continue;
            }
            std::vector<double> expected = fold_reference(seed, group, sc.shape, op, dtype);
            expect_result(label, r, y.shard(r), sc.shape, expected, tolerance(dtype, op));
          }
        }
      });
}

SPMD_TEST(Conformance, Permute) {
  for_each_case(
      world, true,
      [&](const Family& f, const CaseMesh& s, const ShapeCase& sc, DType dtype, uint64_t seed) {
        LocalTensor x = inputs(world, seed, sc.shape, dtype);
        const int n = static_cast<int>(s.group_size);
        std::vector<int> shift(static_cast<size_t>(n));
        std::vector<int> chain(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          shift[static_cast<size_t>(i)] = (i + 1) % n;
          chain[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;  // group rank 0 receives nothing
        }
        for (const auto& dst_of : {shift, chain}) {
          LocalTensor y = permute(x, s.mesh, f.dim, dst_of);
          for (int r : world.held_ranks()) {
            int64_t gi = 0;
            const auto& group = s.group_of(r, &gi);
            int source = -1;
            for (int i = 0; i < n; ++i) {
              if (dst_of[static_cast<size_t>(i)] == gi) source = group[static_cast<size_t>(i)];
            }
            std::vector<double> expected =
                source < 0 ? std::vector<double>(static_cast<size_t>(shape_numel(sc.shape)), 0.0)
                           : input_values(seed, source, sc.shape, dtype);
            expect_result(label_of("permute", f, sc, dtype, fmt::format("dst_of={}", dst_of)), r,
                          y.shard(r), sc.shape, expected, 0.0);
          }
        }
      });
}

// Note [Reduction order] on inexact data: rank r's input is randn(seed + r), so sums, products
// and averages round, and every backend must give the bits of ((x0 op x1) op x2) op ... with the
// accumulation type of the note (F32 for BF16 and F32, F64 for F64), rounded once. The reference
// is that loop, written out here. Groups of 4 and 8 under mpirun are what Note [Rank-ordered
// floating reductions] (backends/mpi/collectives.cpp) is for. NCCL brackets as it likes (Note [NCCL
// semantics]), so this test does not run there.
template <class Acc>
std::vector<double> rank_order_fold(const std::vector<std::vector<double>>& rows, ReduceOp op) {
  std::vector<double> out(rows.front().size());
  for (size_t i = 0; i < out.size(); ++i) {
    Acc acc = static_cast<Acc>(rows[0][i]);
    for (size_t m = 1; m < rows.size(); ++m) {
      if (op == ReduceOp::Product) {
        acc = acc * static_cast<Acc>(rows[m][i]);
      } else {
        acc = acc + static_cast<Acc>(rows[m][i]);
      }
    }
    if (op == ReduceOp::Avg) acc = acc / static_cast<Acc>(rows.size());
    out[i] = static_cast<double>(acc);
  }
  return out;
}

SPMD_TEST(Conformance, FloatingReductionsFollowRankOrderBitwise) {
  if (world.backend_name() == "nccl") GTEST_SKIP() << "NCCL chooses its own bracketing";
  const int n = world.size();
  DeviceMesh line = init_device_mesh(world, {n}, {"x"});
  const Shape odd{7, 5};            // 35 elements: uneven slices over 4 and 8 ranks
  const Shape rows_of_n{2 * n, 3};  // reduce_scatter: 2 rows per rank
  for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product}) {
      const std::string what = fmt::format("{}/{}", dtype, reduce_op_name(op));
      const uint64_t seed = 1000 + static_cast<uint64_t>(op) * 10 + static_cast<uint64_t>(dtype);
      auto input_of = [&](const Shape& shape, int r) {
        return randn(shape, seed + static_cast<uint64_t>(r), dtype);
      };
      // The rank-order fold of every rank's input, rounded once to the dtype by the conversion.
      auto expected_of = [&](const Shape& shape) {
        std::vector<std::vector<double>> rows;
        for (int r = 0; r < n; ++r) rows.push_back(input_of(shape, r).to_vector<double>());
        std::vector<double> folded = dtype == DType::F64 ? rank_order_fold<double>(rows, op)
                                                         : rank_order_fold<float>(rows, op);
        return from_vector(folded).to(dtype).to(DType::F64).to_vector<double>();
      };
      auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };

      const std::vector<double> expected = expected_of(odd);
      LocalTensor x = LocalTensor::from_fn(world, [&](int r) { return input_of(odd, r); });
      LocalTensor all = all_reduce(x, line, "x", op);
      LocalTensor to_root = reduce(x, line, "x", op, /*dst=*/n - 1);
      const std::vector<double> expected_rows = expected_of(rows_of_n);
      LocalTensor y = LocalTensor::from_fn(world, [&](int r) { return input_of(rows_of_n, r); });
      LocalTensor scattered = reduce_scatter(y, line, "x", op, 0);
      for (int r : world.held_ranks()) {
        EXPECT_EQ(values(all.shard(r)), expected) << "all_reduce " << what << " on rank " << r;
        if (r == n - 1) {
          EXPECT_EQ(values(to_root.shard(r)), expected) << "reduce " << what << " on rank " << r;
        }
        const std::vector<double> mine(expected_rows.begin() + 6 * r,
                                       expected_rows.begin() + 6 * (r + 1));
        EXPECT_EQ(values(scattered.shard(r)), mine) << "reduce_scatter " << what << " rank " << r;
      }
    }
  }
}

// ---- every collective kind through this backend's path ---------------------------------------

// One call of every collective, valid for groups of n ranks, on an input of shape [2n, 3]: the
// table's one row per collective (docs/design.md, "Adding a collective").
std::vector<CollectiveOptions> one_call_per_kind(int n) {
  std::vector<int> shift(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) shift[static_cast<size_t>(i)] = (i + 1) % n;
  return {AllReduceOptions{ReduceOp::Max},
          AllGatherOptions{1},
          ReduceScatterOptions{ReduceOp::Sum, 0},
          AllToAllOptions{0, 1},
          AllToAllSingleOptions{},
          BroadcastOptions{n - 1},
          ScatterOptions{n - 1, 0},
          GatherOptions{n - 1, 0},
          ReduceOptions{ReduceOp::Min, 0},
          PermuteOptions{shift},
          SendOptions{1, 7},
          RecvOptions{0, 7},
          BarrierOptions{}};
}

// Fails when a collective kind has no row above, when this backend does not run one through its
// issue() path, when its result differs from sim's (the same call on World::sim over every rank's
// input; under sim that is the call itself), or when the cost model has no entry for it.
SPMD_TEST(Conformance, EveryCollectiveKindRunsOnThisBackend) {
  const int n = world.size();
  DeviceMesh mesh = init_device_mesh(world, {n}, {"x"});
  World sim = World::sim(n);
  DeviceMesh sim_mesh = init_device_mesh(sim, {n}, {"x"});
  const std::vector<CollectiveOptions> calls = one_call_per_kind(n);
  std::vector<bool> covered(kNumCollectiveKinds, false);
  for (const CollectiveOptions& options : calls) covered[options.index()] = true;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    EXPECT_TRUE(covered[static_cast<size_t>(k)])
        << collective_name(static_cast<CollectiveKind>(k)) << " has no row in one_call_per_kind";
  }
  const uint64_t seed = g_seed++;
  LocalTensor x = inputs(world, seed, {2 * n, 3}, DType::F32);
  LocalTensor sim_x = inputs(sim, seed, {2 * n, 3}, DType::F32);
  const LinkParams link{87.7, 0.6};
  for (const CollectiveOptions& options : calls) {
    const CollectiveKind kind = kind_of(options);
    const std::string label = fmt::format("{} {}", kind, describe(options));
    EXPECT_EQ(parse_collective(collective_name(kind)), kind) << label;
    EXPECT_GT(collective_cost_us(kind, 1 << 20, 8, link, default_topology()),
              default_topology().base_latency_us)
        << label << ": the cost model (Note [Cost model]) has no entry for it";
    if (is_point_to_point(kind)) {
      // Note [Point-to-point]: the send row and the recv row are one transfer, group rank 0 to
      // group rank 1, checked against rank 0's input.
      if (kind == CollectiveKind::Recv || n < 2) continue;
      communicator(mesh, "x");
      try {
        for (int r : world.held_ranks()) {
          if (r != 0) continue;
          const LocalTensor token = collective(LocalTensor({0}, {x.shard(0)}), mesh, "x", options);
          EXPECT_EQ(token.shard(0).numel(), 0) << label;
        }
        for (int r : world.held_ranks()) {
          if (r != 1) continue;
          const LocalTensor got =
              collective(LocalTensor({1}, {x.shard(1)}), mesh, "x", RecvOptions{0, 7});
          EXPECT_TRUE(equal(got.shard(1).to(cpu()), sim_x.shard(0))) << label;
        }
      } catch (const Error& e) {
        ADD_FAILURE() << label << " failed on " << world.backend_name() << ": " << e.what();
      }
      continue;
    }
    LocalTensor got;
    try {
      got = collective(x, mesh, "x", options);
    } catch (const Error& e) {
      ADD_FAILURE() << label << " failed on " << world.backend_name() << ": " << e.what();
      continue;
    }
    const LocalTensor expected = collective(sim_x, sim_mesh, "x", options);
    ASSERT_EQ(got.ranks(), world.held_ranks()) << label;
    for (int r : world.held_ranks()) {
      const Tensor mine = got.shard(r).to(cpu());
      const Tensor want = expected.shard(r);
      EXPECT_TRUE(mine.shape() == want.shape() && equal(mine, want))
          << label << ": rank " << r << " got " << mine << ", sim gives " << want;
    }
  }
}

SPMD_TEST(Conformance, Barrier) {
  for (const Family& f : families(world.size())) {
    CaseMesh s = setup(world, f);
    barrier(s.mesh);
  }
}

}  // namespace
}  // namespace spmd
