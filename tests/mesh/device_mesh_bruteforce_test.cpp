// A brute-force check of DeviceMesh: random root meshes (up to 4-D, size-1 dims, permuted and
// partial rank sets) and random sequences of slice, flatten, unflatten and concatenate, compared
// with an independent model that never uses a Layout.
//
// The model keeps, numpy-style, the materialized array of rank-map positions of the sibling mesh
// that holds position 0 (`offsets`, row-major over the mesh shape). Slicing keeps the entries
// with coordinate 0 on the dropped dims, flatten and unflatten reshape (row-major order does not
// change), concatenate adds the arrays as an outer sum. The other siblings are found by greedy
// tiling: the smallest position not yet covered starts the next sibling. A model mesh is valid
// when its array is injective, additive over its dims, each dim's offsets form some layout (found
// by trying every ordered factorization of the dim size), and the siblings tile the rank map;
// DeviceMesh must accept exactly the valid results and agree on groups, coordinates and tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include "tests/mesh/mesh_test_support.h"

namespace spmd {
namespace {

using testing::make_world;

struct Model {
  std::vector<int64_t> shape;
  std::vector<std::string> names;  // empty: unnamed
  std::vector<int64_t> offsets;    // positions of the sibling holding position 0
};

int64_t numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

std::vector<int64_t> unravel(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    c[k] = index % shape[k];
    index /= shape[k];
  }
  return c;
}

// The offsets along dim d from the origin.
std::vector<int64_t> dim_offsets(const Model& m, size_t d) {
  int64_t stride = row_major_strides(m.shape)[d];
  std::vector<int64_t> out;
  for (int64_t i = 0; i < m.shape[d]; ++i) out.push_back(m.offsets[i * stride]);
  return out;
}

void factorizations(int64_t n, std::vector<int64_t>& current,
                    std::vector<std::vector<int64_t>>& out) {
  if (n == 1) {
    out.push_back(current);
    return;
  }
  for (int64_t f = 2; f <= n; ++f) {
    if (n % f) continue;
    current.push_back(f);
    factorizations(n / f, current, out);
    current.pop_back();
  }
}

// Whether `seq` is L(0..n-1) for some flat layout L.
bool is_layout(const std::vector<int64_t>& seq) {
  if (seq[0] != 0) return false;
  std::vector<int64_t> current;
  std::vector<std::vector<int64_t>> all;
  factorizations(static_cast<int64_t>(seq.size()), current, all);
  for (const auto& f : all) {
    std::vector<int64_t> rs = row_major_strides(f);
    std::vector<int64_t> strides;
    for (int64_t r : rs) strides.push_back(seq[r]);
    bool ok = true;
    for (int64_t i = 0; ok && i < static_cast<int64_t>(seq.size()); ++i) {
      std::vector<int64_t> c = unravel(i, f);
      int64_t v = 0;
      for (size_t k = 0; k < c.size(); ++k) v += c[k] * strides[k];
      ok = v == seq[i];
    }
    if (ok) return true;
  }
  return seq.size() == 1;
}

// Sibling origins by greedy tiling of [0, n), or nullopt.
std::optional<std::vector<int64_t>> tile(const Model& m, int64_t n) {
  std::vector<char> covered(static_cast<size_t>(n), 0);
  std::vector<int64_t> origins;
  for (int64_t p = 0; p < n; ++p) {
    if (covered[p]) continue;
    for (int64_t o : m.offsets) {
      int64_t q = p + o;
      if (q >= n || covered[q]) return std::nullopt;
      covered[q] = 1;
    }
    origins.push_back(p);
  }
  return origins;
}

bool valid(const Model& m, int64_t n) {
  std::vector<std::vector<int64_t>> dims;
  for (size_t d = 0; d < m.shape.size(); ++d) {
    dims.push_back(dim_offsets(m, d));
    if (!is_layout(dims.back())) return false;
  }
  for (int64_t i = 0; i < numel(m.shape); ++i) {
    std::vector<int64_t> c = unravel(i, m.shape);
    int64_t v = 0;
    for (size_t d = 0; d < c.size(); ++d) v += dims[d][c[d]];
    if (v != m.offsets[i]) return false;
  }
  return tile(m, n).has_value();
}

Model slice(const Model& m, const std::vector<int>& keep) {
  Model out;
  for (int d : keep) {
    out.shape.push_back(m.shape[d]);
    if (!m.names.empty()) out.names.push_back(m.names[d]);
  }
  std::vector<int64_t> strides = row_major_strides(m.shape);
  for (int64_t i = 0; i < numel(out.shape); ++i) {
    std::vector<int64_t> c = unravel(i, out.shape);
    int64_t src = 0;
    for (size_t k = 0; k < keep.size(); ++k) src += c[k] * strides[keep[k]];
    out.offsets.push_back(m.offsets[src]);
  }
  return out;
}

Model unflatten(const Model& m, int d, const std::vector<int64_t>& sizes,
                const std::vector<std::string>& names) {
  Model out = m;
  out.shape.erase(out.shape.begin() + d);
  out.shape.insert(out.shape.begin() + d, sizes.begin(), sizes.end());
  if (!m.names.empty()) {
    out.names.erase(out.names.begin() + d);
    out.names.insert(out.names.begin() + d, names.begin(), names.end());
  }
  return out;
}

Model concat(const std::vector<Model>& ms) {
  Model out{{}, {}, {0}};
  for (const Model& m : ms) {
    std::vector<int64_t> next;
    for (int64_t a : out.offsets) {
      for (int64_t b : m.offsets) next.push_back(a + b);
    }
    out.offsets = std::move(next);
    out.shape.insert(out.shape.end(), m.shape.begin(), m.shape.end());
    out.names.insert(out.names.end(), m.names.begin(), m.names.end());
  }
  return out;
}

std::string describe(const Model& m) {
  return fmt::format("model shape [{}] names [{}] offsets [{}]", fmt::join(m.shape, ","),
                     fmt::join(m.names, ","), fmt::join(m.offsets, ","));
}

// Compares everything DeviceMesh reports with the model.
void expect_matches(const DeviceMesh& mesh, const Model& m, const std::vector<int64_t>& rank_map,
                    const std::string& history) {
  SCOPED_TRACE(history + "\n" + mesh.to_string() + "\n" + describe(m));
  const int64_t n = static_cast<int64_t>(rank_map.size());
  ASSERT_EQ(mesh.shape(), m.shape);
  ASSERT_EQ(mesh.dim_names(), m.names);
  auto origins = tile(m, n);
  ASSERT_TRUE(origins.has_value());
  ASSERT_EQ(mesh.num_siblings(), static_cast<int64_t>(origins->size()));

  RankTable table = mesh.rank_table_values();
  std::vector<int64_t> expected_shape{static_cast<int64_t>(origins->size())};
  expected_shape.insert(expected_shape.end(), m.shape.begin(), m.shape.end());
  ASSERT_EQ(table.shape, expected_shape);
  std::vector<int64_t> expected_values;
  std::map<int64_t, std::vector<int64_t>> coord_of_rank;
  for (int64_t p : *origins) {
    for (int64_t i = 0; i < numel(m.shape); ++i) {
      int64_t rank = rank_map[p + m.offsets[i]];
      expected_values.push_back(rank);
      coord_of_rank[rank] = unravel(i, m.shape);
    }
  }
  ASSERT_EQ(table.values, expected_values);

  std::vector<int64_t> strides = row_major_strides(m.shape);
  for (size_t d = 0; d < m.shape.size(); ++d) {
    std::vector<std::pair<int64_t, std::vector<int>>> groups;  // (origin, ranks)
    for (int64_t p : *origins) {
      for (int64_t i = 0; i < numel(m.shape); ++i) {
        if (unravel(i, m.shape)[d] != 0) continue;
        std::vector<int> g;
        for (int64_t k = 0; k < m.shape[d]; ++k) {
          g.push_back(static_cast<int>(rank_map[p + m.offsets[i + k * strides[d]]]));
        }
        groups.emplace_back(p + m.offsets[i], std::move(g));
      }
    }
    std::sort(groups.begin(), groups.end());
    std::vector<std::vector<int>> expected;
    for (auto& [origin, g] : groups) expected.push_back(std::move(g));
    ASSERT_EQ(mesh.groups(static_cast<int>(d)), expected) << "groups of dim " << d;
    GroupFamily family = mesh.group_family(static_cast<int>(d));
    ASSERT_EQ(family.groups(), expected) << "group family of dim " << d;
    for (int64_t g = 0; g < static_cast<int64_t>(expected.size()); ++g) {
      for (int64_t k = 0; k < static_cast<int64_t>(expected[g].size()); ++k) {
        auto loc = family.locate(expected[g][k]);
        ASSERT_TRUE(loc.has_value());
        ASSERT_EQ(loc->group, g);
        ASSERT_EQ(loc->index, k);
      }
    }
    PerRank<int64_t> local = mesh.local_rank(static_cast<int>(d));
    for (const auto& [rank, c] : coord_of_rank) ASSERT_EQ(local.at(static_cast<int>(rank)), c[d]);
  }

  PerRank<std::vector<int64_t>> coords = mesh.coordinate();
  for (int r = 0; r < mesh.world().size(); ++r) {
    auto it = coord_of_rank.find(r);
    ASSERT_EQ(mesh.contains(r), it != coord_of_rank.end()) << "rank " << r;
    if (it == coord_of_rank.end()) {
      ASSERT_EQ(mesh.coordinate_of(r), std::nullopt);
      continue;
    }
    ASSERT_EQ(mesh.coordinate_of(r), it->second) << "rank " << r;
    ASSERT_EQ(coords.at(r), it->second) << "rank " << r;
  }
}

TEST(DeviceMeshBruteForce, RandomOperationSequences) {
  std::mt19937_64 rng(2024);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int64_t accepted = 0, rejected = 0;
  for (int sequence = 0; sequence < 1000 && !::testing::Test::HasFailure(); ++sequence) {
    // The root: up to 4 dims of size 1..4 and at most 64 ranks.
    std::vector<int64_t> shape;
    int ndim = static_cast<int>(uniform(1, 4));
    for (int d = 0; d < ndim; ++d) shape.push_back(uniform(1, 4));
    while (numel(shape) > 64) shape.back() = 1;
    const int64_t n = numel(shape);
    const int world_size = static_cast<int>(n + uniform(0, 3));
    World world = make_world(world_size);
    bool named = uniform(0, 3) != 0;
    std::vector<std::string> names;
    if (named) {
      for (int d = 0; d < ndim; ++d) names.push_back(fmt::format("r{}", d));
    }
    std::vector<int64_t> rank_map(static_cast<size_t>(world_size));
    std::iota(rank_map.begin(), rank_map.end(), 0);
    DeviceMesh root;
    int how = static_cast<int>(uniform(0, 2));
    if (how == 0) {
      rank_map.resize(static_cast<size_t>(n));
      root = init_device_mesh(world, shape, names);
    } else {
      std::shuffle(rank_map.begin(), rank_map.end(), rng);
      rank_map.resize(static_cast<size_t>(n));
      root = how == 1 ? DeviceMesh::from_ranks(world, shape, rank_map, names)
                      : DeviceMesh::from_ranks(world, from_vector<int64_t>(rank_map, shape), names);
    }
    std::vector<int64_t> positions(static_cast<size_t>(n));
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<std::pair<DeviceMesh, Model>> pool{{root, Model{shape, names, positions}}};
    std::map<std::string, Model> flattened;
    std::string history = fmt::format("root {}", root.to_string());
    expect_matches(root, pool[0].second, rank_map, history);
    int fresh = 0;

    for (int step = 0; step < 12 && !::testing::Test::HasFailure(); ++step) {
      auto [mesh, model] = pool[static_cast<size_t>(uniform(0, pool.size() - 1))];
      int op = static_cast<int>(uniform(0, 4));
      std::optional<Model> result;
      std::optional<DeviceMesh> got;
      std::string what;
      bool expect_valid = true;
      try {
        if (op == 0) {  // slice an ascending subset
          std::vector<int> keep;
          for (int d = 0; d < mesh.ndim(); ++d) {
            if (uniform(0, 1)) keep.push_back(d);
          }
          if (keep.empty()) keep.push_back(static_cast<int>(uniform(0, mesh.ndim() - 1)));
          std::vector<MeshDim> dims;
          for (int d : keep) {
            dims.push_back(mesh.has_dim_names() ? MeshDim(mesh.dim_names()[d]) : MeshDim(d));
          }
          what = fmt::format("slice [{}]", fmt::join(keep, ","));
          result = slice(model, keep);
          got = mesh.slice(dims);
        } else if (op == 1) {  // flatten under a fresh name
          std::string name = fmt::format("f{}", fresh++);
          what = "flatten " + name;
          result = Model{{numel(model.shape)}, {name}, model.offsets};
          got = mesh.flatten(name);
          flattened[name] = *result;
        } else if (op == 2) {  // unflatten a dim into a random factorization
          int d = static_cast<int>(uniform(0, mesh.ndim() - 1));
          int64_t s = model.shape[d];
          std::vector<int64_t> sizes;
          int64_t left = s;
          int pieces = static_cast<int>(uniform(1, 3));
          for (int k = 0; k + 1 < pieces; ++k) {
            std::vector<int64_t> divisors;
            for (int64_t f = 1; f <= left; ++f) {
              if (left % f == 0) divisors.push_back(f);
            }
            int64_t f = divisors[static_cast<size_t>(uniform(0, divisors.size() - 1))];
            sizes.push_back(f);
            left /= f;
          }
          sizes.push_back(left);
          std::shuffle(sizes.begin(), sizes.end(), rng);
          std::vector<std::string> new_names;
          if (mesh.has_dim_names()) {
            for (size_t k = 0; k < sizes.size(); ++k)
              new_names.push_back(fmt::format("u{}", fresh++));
          }
          what = fmt::format("unflatten dim {} into ({})", d, fmt::join(sizes, ","));
          result = unflatten(model, d, sizes, new_names);
          expect_valid = valid(*result, n);
          got = mesh.unflatten(d, sizes, new_names);
        } else if (op == 3) {  // concatenate with another mesh of the pool
          auto [other, other_model] = pool[static_cast<size_t>(uniform(0, pool.size() - 1))];
          if (other.has_dim_names() != mesh.has_dim_names()) continue;
          bool clash = false;
          for (const auto& a : mesh.dim_names()) {
            clash |= std::count(other.dim_names().begin(), other.dim_names().end(), a) > 0;
          }
          if (clash) continue;
          what = fmt::format("concatenate with {}", other.to_string());
          result = concat({model, other_model});
          expect_valid = valid(*result, n);
          got = concatenate({mesh, other});
        } else {  // the root reaches flattened dims by name
          if (flattened.empty() || !root.has_dim_names()) continue;
          auto it = flattened.begin();
          std::advance(it, uniform(0, flattened.size() - 1));
          what = "root[" + it->first + "]";
          result = it->second;
          got = root[it->first];
          mesh = root;
        }
      } catch (const MeshError& e) {
        ++rejected;
        ASSERT_FALSE(expect_valid)
            << history << "\nthen " << what << " on " << mesh
            << " was refused but the model says it is valid: " << e.what() << "\n"
            << describe(*result);
        continue;
      }
      ASSERT_TRUE(expect_valid) << history << "\nthen " << what << " on " << mesh
                                << " was accepted but the model says it is invalid: "
                                << describe(*result) << "\ngot " << *got;
      ++accepted;
      ASSERT_TRUE(valid(*result, n)) << describe(*result);
      std::string h = history + "\nthen " + what + " on " + mesh.to_string();
      expect_matches(*got, *result, rank_map, h);
      if (step % 4 == 0) {
        ASSERT_EQ(DeviceMesh::from_json(world, got->to_json()), *got) << h;
        Tensor t = got->rank_table();
        ASSERT_EQ(t.numel(), numel(result->shape) * got->num_siblings());
      }
      pool.emplace_back(*got, *result);
    }
  }
  EXPECT_GT(accepted, 7000);
  EXPECT_GT(rejected, 300);
}

}  // namespace
}  // namespace spmd
