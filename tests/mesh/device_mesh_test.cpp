// Tests for mesh/device_mesh.h, mesh/group_family.h and mesh/comm_cache.h: PyTorch's reference
// vectors (the team's research notes on PyTorch, prior_art_pytorch.md section 3.5) as group and
// coordinate tables, error messages, printing, save/load, and communicator sharing.
#include <spmd/mesh/device_mesh.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>

#include <spmd/ops/ops.h>
#include "tests/mesh/mesh_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::make_token;
using testing::make_world;
using Groups = std::vector<std::vector<int>>;
using Coord = std::vector<int64_t>;

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The group of `dim` holding `rank`.
std::vector<int> group_of(const DeviceMesh& mesh, MeshDim dim, int rank) {
  for (const auto& g : mesh.groups(dim)) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  return {};
}

// ---- notes section 3.5 ------------------------------------------------------------------------

TEST(DeviceMeshReference, TwoByTwoFromRanks) {  // 1
  World world = make_world(4);
  DeviceMesh mesh = DeviceMesh::from_ranks(world, arange(4, DType::I64).reshape({2, 2}));
  EXPECT_EQ(mesh.groups(0), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.groups(1), (Groups{{0, 1}, {2, 3}}));
}

TEST(DeviceMeshReference, TwoByTwoByTwoGroups) {  // 2
  World world = make_world(8);
  DeviceMesh mesh = DeviceMesh::from_ranks(world, arange(8, DType::I64).reshape({2, 2, 2}));
  // PyTorch's test lists dim 0 as swapdims order ([0,4],[2,6],[1,5],[3,7]); the groups are the
  // same, listed here in global_ranks (complement) order.
  EXPECT_EQ(mesh.groups(0), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.groups(1), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.groups(2), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

TEST(DeviceMeshReference, SliceTwoByFour) {  // 3, 4
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"DP", "TP"});
  DeviceMesh tp = mesh["TP"];
  EXPECT_EQ(tp.rank_table_values(), (RankTable{{2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}}));
  DeviceMesh dp = mesh["DP"];
  EXPECT_EQ(dp.rank_table_values(), (RankTable{{4, 2}, {0, 4, 1, 5, 2, 6, 3, 7}}));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(tp.coordinate().at(r), (Coord{r % 4})) << r;
    EXPECT_EQ(dp.coordinate().at(r), (Coord{r / 4})) << r;
    EXPECT_EQ(group_of(tp, 0, r),
              (std::vector<int>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3}));
    EXPECT_EQ(group_of(dp, 0, r), (std::vector<int>{r % 4, r % 4 + 4}));
  }
  expect_throws<MeshError>([&] { mesh[{"PP"}]; }, {"unknown dim 'PP'", "'DP', 'TP'"});
  DeviceMesh unnamed = init_device_mesh(world, {2, 4});
  expect_throws<MeshError>([&] { unnamed["DP"]; },
                           {"cannot slice a mesh without dim names", "DeviceMesh((2, 4)"});

  DeviceMesh one = init_device_mesh(world, {8}, {"dp"});
  EXPECT_EQ(one["dp"], one);
  expect_throws<MeshError>([&] { one["dim0"]; }, {"unknown dim 'dim0'"});
}

TEST(DeviceMeshReference, ThreeDimSlices) {  // 5
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"Replicate", "Shard", "TP"});
  EXPECT_EQ(mesh.groups("TP"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.groups("Shard"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.groups("Replicate"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  GroupFamily shard = mesh.group_family("Shard");
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.group_family("TP").locate(r)->group, r / 2);
    EXPECT_EQ(shard.locate(r)->group, r % 2 + (r / 4) * 2);
    EXPECT_EQ(mesh.group_family("Replicate").locate(r)->group, r % 4);
  }
  DeviceMesh rs = mesh[{"Replicate", "Shard"}];
  EXPECT_EQ(rs, (mesh[std::vector<std::string>{"Replicate", "Shard"}]));
  EXPECT_EQ(rs.rank_table_values(), (RankTable{{2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7}}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(rs.coordinate_of(r), (Coord{r / 4, (r / 2) % 2}));
  EXPECT_EQ(rs["Shard"], mesh["Shard"]);
  EXPECT_EQ(rs["Replicate"], mesh["Replicate"]);
}

TEST(DeviceMeshReference, NonContiguousSlice) {  // 6, 7
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"dp", "pp", "cp"});
  DeviceMesh dp_cp = mesh[{"dp", "cp"}];
  EXPECT_EQ(dp_cp.rank_table_values(), (RankTable{{2, 2, 2}, {0, 1, 4, 5, 2, 3, 6, 7}}));
  for (int r = 0; r < 8; ++r) {
    // dp_cp.mesh[dp local rank] == mesh["cp"].mesh, on every rank.
    std::vector<int> cp = group_of(mesh, "cp", r);
    auto table = dp_cp.rank_table_values();
    int64_t sibling = (r / 2) % 2;
    int64_t dp_rank = dp_cp.local_rank("dp").at(r);
    std::vector<int> row(table.values.begin() + sibling * 4 + dp_rank * 2,
                         table.values.begin() + sibling * 4 + dp_rank * 2 + 2);
    EXPECT_EQ(row, cp) << r;
  }
  expect_throws<MeshError>(
      [&] {
        mesh[{"cp", "dp"}];
      },
      {"ascending mesh order", "'dp' comes after 'cp'"});

  DeviceMesh m = init_device_mesh(world, {2, 2, 2}, {"dp", "pp", "tp"});
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(m.local_rank("tp").at(r), r % 2);
    EXPECT_EQ(m.local_rank("pp").at(r), r % 4 <= 1 ? 0 : 1);
    EXPECT_EQ(m.local_rank("dp").at(r), r / 4);
  }
}

TEST(DeviceMeshReference, Flatten) {  // 8
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"dp", "cp", "tp"});
  DeviceMesh dp_cp = mesh[{"dp", "cp"}].flatten();
  EXPECT_EQ(dp_cp.dim_names(), (std::vector<std::string>{"dp_cp"}));
  EXPECT_EQ(dp_cp.dim_layout(0), Layout(4, 2));
  EXPECT_EQ(dp_cp.groups(0), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(dp_cp.rank_table_values().values, (mesh[{"dp", "cp"}].rank_table_values()).values);
  EXPECT_EQ((mesh[{"dp", "cp"}].flatten()), dp_cp);  // the registry returns the same dim
  DeviceMesh dp_tp = mesh[{"dp", "tp"}].flatten();
  EXPECT_EQ(dp_tp.groups(0), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(dp_tp.to_string(), "DeviceMesh((dp_tp=4), stride=((4, 1),))");
  expect_throws<MeshError>(
      [&] {
        mesh[{"dp_tp", "cp"}];
      },
      {"flattened dim 'dp_tp'", "not contiguous"});
  expect_throws<MeshError>([&] { mesh.flatten("dp"); },
                           {"'dp' already exists as a dim of the root mesh"});
  expect_throws<MeshError>(
      [&] {
        mesh[{"cp", "tp"}].flatten("dp_tp");
      },
      {"'dp_tp' was already flattened with layout (2,2):(4,1)", "flattens to 4:1"});
  mesh[{"cp", "tp"}].flatten("dummy");
  EXPECT_EQ(mesh["dummy"].dim_names()[0], "dummy");
  EXPECT_EQ(mesh.groups("dummy"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.size("dummy"), 4);
  EXPECT_EQ(mesh.dim_layout("dp_cp"), Layout(4, 2));
  EXPECT_EQ(mesh.local_rank("dp_cp").at(6), 3);
  expect_throws<MeshError>([&] { mesh.resolve("dp_cp"); }, {"unknown dim 'dp_cp'"});
}

TEST(DeviceMeshReference, SliceWithFlattenedDims) {  // 9, 10
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"replicate", "shard", "cp"});
  DeviceMesh shard_cp = mesh[{"shard", "cp"}].flatten();
  DeviceMesh rs = mesh[{"replicate", "shard_cp"}];
  EXPECT_EQ(rs.rank_table_values(), (RankTable{{1, 2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(mesh["shard_cp"].group_family(0), mesh.group_family("shard_cp"));
  EXPECT_EQ(shard_cp.group_family(0), mesh.group_family("shard_cp"));

  DeviceMesh m2 = init_device_mesh(world, {2, 2, 2}, {"dp", "cp", "tp"});
  m2[{"dp", "cp"}].flatten();
  EXPECT_EQ((m2[{"dp_cp", "tp"}].rank_table_values()),
            (RankTable{{1, 4, 2}, {0, 1, 2, 3, 4, 5, 6, 7}}));
  expect_throws<MeshError>([&] { m2[{"tp", "dp_cp"}]; }, {"ascending mesh order"});

  // Size-1 dims never produce stride 0 (pytorch/pytorch#169381).
  DeviceMesh m4 = init_device_mesh(world, {2, 2, 2, 1}, {"dp_replicate", "dp_shard", "cp", "tp"});
  DeviceMesh flat = m4[{"dp_replicate", "dp_shard", "cp"}].flatten("dp_cp");
  EXPECT_EQ(m4["dp_cp"].rank_table_values().values, flat.rank_table_values().values);
  EXPECT_EQ(flat.dim_names(), (std::vector<std::string>{"dp_cp"}));
  EXPECT_EQ(flat.root(), m4);
  DeviceMesh cp_tp = m4[{"cp", "tp"}].flatten();
  EXPECT_EQ(cp_tp.dim_layout(0), Layout(2, 1));
  DeviceMesh tp_only = m4["tp"].flatten("tp_flat");
  EXPECT_EQ(tp_only.dim_layout(0), Layout(1, 1));
  EXPECT_EQ((m4[{"dp_replicate", "dp_shard", "cp_tp"}].shape()), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ((m4[{"dp_replicate", "tp_flat"}].shape()), (std::vector<int64_t>{2, 1}));
}

TEST(DeviceMeshReference, Unflatten) {  // 11, 12
  World world = make_world(8);
  DeviceMesh mesh_2d = init_device_mesh(world, {4, 2}, {"dp", "tp"});
  DeviceMesh un = mesh_2d.unflatten(0, {2, 2}, {"dp_shard", "dp_replicate"});
  EXPECT_EQ(un.dim_names(), (std::vector<std::string>{"dp_shard", "dp_replicate", "tp"}));
  EXPECT_EQ(un["tp"], mesh_2d["tp"]);
  EXPECT_EQ(un.groups("tp"), mesh_2d.groups("tp"));
  EXPECT_EQ(un.groups("dp_shard"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  expect_throws<MeshError>([&] { mesh_2d["dp_shard"]; }, {"unknown dim 'dp_shard'"});
  EXPECT_EQ(mesh_2d.unflatten("dp", {2, 2}, {"a", "b"}), mesh_2d.unflatten(0, {2, 2}, {"a", "b"}));

  DeviceMesh w = init_device_mesh(world, {8}, {"world"});
  DeviceMesh m1 = w.unflatten(0, {2, 2, 2}, {"dp", "cp", "tp"});
  DeviceMesh m2 = w.unflatten(0, {2, 2, 2}, {"dp", "ep", "ep_tp"});
  EXPECT_EQ(m1.groups("cp"), m2.groups("ep"));
  EXPECT_EQ(m1.groups("tp"), m2.groups("ep_tp"));
  EXPECT_EQ(m1.group_family("cp"), m2.group_family("ep"));
  DeviceMesh m3 = w.unflatten(0, {4, 2, 1}, {"dp", "cp", "tp"})
                      .unflatten(0, {2, 2}, {"dp_shard", "dp_replicate"});
  EXPECT_EQ(m3.dim_names(), (std::vector<std::string>{"dp_shard", "dp_replicate", "cp", "tp"}));
  EXPECT_EQ(m3.groups("cp"), w.unflatten(0, {4, 2, 1}, {"dp", "cp", "tp"}).groups("cp"));
}

TEST(DeviceMeshReference, Concatenate) {  // 13, 14
  World world = make_world(8);
  DeviceMesh m = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(concatenate({m["dp"], m["tp"]}), m);
  EXPECT_EQ(concatenate({m["dp"], m["tp"]}).rank_table_values(), m.rank_table_values());
  DeviceMesh m3 = init_device_mesh(world, {2, 2, 2}, {"pp", "dp", "tp"});
  EXPECT_EQ(concatenate({m3["dp"], m3["tp"]}), ((m3[{"dp", "tp"}])));
  EXPECT_EQ(concatenate({(m3[{"pp", "dp"}]), m3["tp"]}), m3);
  // A transposed mesh: allowed, its groups are the same per dim.
  DeviceMesh t = concatenate({m["tp"], m["dp"]});
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.groups("dp"), m.groups("dp"));
  EXPECT_EQ(t.rank_table_values(), (RankTable{{1, 4, 2}, {0, 4, 1, 5, 2, 6, 3, 7}}));

  DeviceMesh rs = init_device_mesh(world, {2, 4}, {"replicate", "shard"});
  EXPECT_EQ(rs.groups("replicate").size(), 4u);
  for (const auto& g : rs.groups("replicate")) EXPECT_EQ(g.size(), 2u);
}

TEST(DeviceMeshReference, PartialWorldAndHash) {  // 15, 16, 17
  World world = make_world(10, {5});
  DeviceMesh mesh = DeviceMesh::from_ranks(world, arange(10, DType::I64));
  EXPECT_EQ(mesh.coordinate().uniform(), Coord{5});
  EXPECT_EQ(mesh.coordinate().at(5), Coord{5});

  World w8 = make_world(8);
  DeviceMesh a = DeviceMesh::from_ranks(w8, arange(8, DType::I64).reshape({4, 2}));
  DeviceMesh b = DeviceMesh::from_ranks(w8, arange(8, DType::I64).reshape({4, 2}));
  DeviceMesh c = DeviceMesh::from_ranks(w8, arange(8, DType::I64).reshape({2, 2, 2}));
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::hash<DeviceMesh>{}(a), std::hash<DeviceMesh>{}(b));
  EXPECT_NE(a, c);
  EXPECT_NE(std::hash<DeviceMesh>{}(a), std::hash<DeviceMesh>{}(c));
  // A slice is not equal to an independently built 1-D mesh over the same ranks.
  EXPECT_NE(init_device_mesh(w8, {2, 4}, {"dp", "TP"})["TP"], init_device_mesh(w8, {4}, {"TP"}));

  DeviceMesh m = init_device_mesh(w8, {2, 4}, {"dp", "tp"});
  DeviceMesh flat = m[{"dp", "tp"}].flatten();
  for (int r = 0; r < 8; ++r) EXPECT_EQ(flat.local_rank(0).at(r), r);
  EXPECT_EQ(m.groups(0), m.groups("dp"));
  EXPECT_EQ(m.groups("dp"), m["dp"].groups(0));
}

// ---- more behaviour ---------------------------------------------------------------------------

TEST(DeviceMesh, PermutedRanksAndTables) {
  World world = make_world(12);
  std::vector<int64_t> ranks{11, 3, 7, 0, 5, 9};
  DeviceMesh mesh = DeviceMesh::from_ranks(world, {2, 3}, ranks, {"a", "b"});
  EXPECT_EQ(mesh.groups("a"), (Groups{{11, 0}, {3, 5}, {7, 9}}));
  EXPECT_EQ(mesh.groups("b"), (Groups{{11, 3, 7}, {0, 5, 9}}));
  EXPECT_FALSE(mesh.contains(1));
  EXPECT_TRUE(mesh.contains(9));
  EXPECT_EQ(mesh.coordinate_of(9), (Coord{1, 2}));
  EXPECT_EQ(mesh.coordinate_of(1), std::nullopt);
  PerRank<Coord> coords = mesh.coordinate();
  EXPECT_EQ(coords.ranks(), (std::vector<int>{0, 3, 5, 7, 9, 11}));
  EXPECT_EQ(coords.at(7), (Coord{0, 2}));
  Tensor table = mesh["b"].rank_table();
  EXPECT_EQ(table.shape(), (Shape{2, 3}));
  EXPECT_EQ(table.dtype(), DType::I64);
  EXPECT_EQ(table.to_vector<int64_t>(), (std::vector<int64_t>{11, 3, 7, 0, 5, 9}));
  EXPECT_EQ(mesh.rank_table().shape(), (Shape{2, 3}));
  EXPECT_EQ(mesh["b"].num_siblings(), 2);
  GroupFamily b = mesh.group_family("b");
  EXPECT_EQ(b.dim_name(), "b");
  EXPECT_EQ(b.group(1), (std::vector<int>{0, 5, 9}));
  EXPECT_EQ(b.locate(5), (GroupFamily::Location{1, 1}));
  EXPECT_EQ(b.locate(1), std::nullopt);
  EXPECT_EQ(b.num_groups(), 2);
  EXPECT_EQ(b.group_size(), 3);
  EXPECT_EQ(init_device_mesh(world, {2, 2}).group_family(1).dim_name(), "dim 1");
  EXPECT_EQ(DeviceMesh::from_ranks(world, from_vector<int32_t>({2, 1}, {2})).groups(0),
            (Groups{{2, 1}}));
}

TEST(DeviceMesh, SingleRankWorld) {
  World world = make_world(8, {6});
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  PerRank<Coord> coord = mesh.coordinate();
  ASSERT_TRUE(coord.uniform().has_value());
  EXPECT_EQ(*coord.uniform(), (Coord{1, 2}));
  EXPECT_EQ(mesh.local_rank("tp").value(), 2);
  EXPECT_EQ(mesh["tp"].coordinate().value(), Coord{2});
  DeviceMesh small = init_device_mesh(world, {2, 2});
  EXPECT_TRUE(small.coordinate().empty());
  EXPECT_FALSE(small.contains(6));
}

TEST(DeviceMesh, IndexSlicingOfUnnamedMeshes) {
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2});
  DeviceMesh s = mesh.slice({0, 2});
  EXPECT_FALSE(s.has_dim_names());
  EXPECT_EQ(s.groups(1), mesh.groups(2));
  EXPECT_EQ(mesh.slice({-1}).groups(0), mesh.groups(2));
  EXPECT_EQ(mesh.unflatten(1, {2, 1}).shape(), (std::vector<int64_t>{2, 2, 1, 2}));
  DeviceMesh f = mesh.flatten("all");
  EXPECT_EQ(f.dim_names(), (std::vector<std::string>{"all"}));
  EXPECT_EQ(mesh.slice({MeshDim("all")}), f);
}

TEST(DeviceMesh, Printing) {
  World world = make_world(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(mesh.to_string(), "DeviceMesh((dp=2, tp=4), stride=(4, 1))");
  EXPECT_EQ(fmt::format("{}", mesh), "DeviceMesh((dp=2, tp=4), stride=(4, 1))");
  std::ostringstream os;
  os << mesh["tp"];
  EXPECT_EQ(os.str(), "DeviceMesh((tp=4), stride=(1,))");
  EXPECT_EQ(init_device_mesh(world, {8}).to_string(), "DeviceMesh((8,), stride=(1,))");
  EXPECT_EQ(DeviceMesh().to_string(), "DeviceMesh(undefined)");
  EXPECT_EQ(mesh.to_grid(),
            "DeviceMesh((dp=2, tp=4), stride=(4, 1))\n"
            "      tp=0  tp=1  tp=2  tp=3\n"
            "dp=0     0     1     2     3\n"
            "dp=1     4     5     6     7\n");
  EXPECT_EQ(mesh["dp"].to_grid(),
            "DeviceMesh((dp=2), stride=(4,))\n"
            "sibling mesh 0 of 4:\n"
            "  dp=0  dp=1\n"
            "     0     4\n"
            "sibling mesh 1 of 4:\n"
            "  dp=0  dp=1\n"
            "     1     5\n"
            "sibling mesh 2 of 4:\n"
            "  dp=0  dp=1\n"
            "     2     6\n"
            "sibling mesh 3 of 4:\n"
            "  dp=0  dp=1\n"
            "     3     7\n");
  EXPECT_EQ(init_device_mesh(world, {2, 2, 2}).to_grid(),
            "DeviceMesh((2, 2, 2), stride=(4, 2, 1))\n"
            "[d0=0]\n"
            "      d2=0  d2=1\n"
            "d1=0     0     1\n"
            "d1=1     2     3\n"
            "[d0=1]\n"
            "      d2=0  d2=1\n"
            "d1=0     4     5\n"
            "d1=1     6     7\n");
}

TEST(DeviceMesh, JsonRoundTrip) {
  World world = make_world(8);
  DeviceMesh root = init_device_mesh(world, {2, 2, 2}, {"dp", "cp", "tp"});
  root[{"dp", "cp"}].flatten();
  DeviceMesh mesh = root.unflatten("tp", {2, 1}, {"tp0", "tp1"})[{"dp", "tp0"}];
  root.comm_cache().get_or_create(mesh.dim_layout(0), {}, [] { return make_token(1); });
  std::string text = mesh.to_json();
  DeviceMesh loaded = DeviceMesh::from_json(world, text);
  EXPECT_EQ(loaded, mesh);
  EXPECT_EQ(std::hash<DeviceMesh>{}(loaded), std::hash<DeviceMesh>{}(mesh));
  EXPECT_NE(loaded.universe(), mesh.universe());
  EXPECT_EQ(loaded.comm_cache().size(), 0u);
  EXPECT_EQ(loaded.groups("tp0"), mesh.groups("tp0"));
  EXPECT_EQ(loaded.root(), root);
  EXPECT_EQ(loaded.root().groups("dp_cp"), root.groups("dp_cp"));
  EXPECT_EQ(DeviceMesh::from_json(world, root.to_json()), root);

  DeviceMesh permuted = DeviceMesh::from_ranks(world, {2, 2}, {7, 1, 4, 2}, {"a", "b"});
  EXPECT_EQ(DeviceMesh::from_json(world, permuted.to_json()), permuted);
  expect_throws<MeshError>([&] { DeviceMesh::from_json(make_world(4), permuted.to_json()); },
                           {"from_json", "rank 7", "world of 4 ranks"});
  expect_throws<MeshError>([&] { DeviceMesh::from_json(world, "{"); }, {"invalid document"});
  expect_throws<MeshError>([&] { DeviceMesh::from_json(world, "{\"format\": \"x\"}"); },
                           {"not a version-1"});
}

TEST(DeviceMesh, Errors) {
  World world = make_world(8);
  expect_throws<MeshError>(
      [&] {
        init_device_mesh(world, {2, 8});
      },
      {"init_device_mesh", "(2, 8) has 16 ranks", "only 8"});
  expect_throws<MeshError>([&] { init_device_mesh(world, {2, 2}, {"dp", "dp"}); }, {"repeat 'dp'"});
  expect_throws<MeshError>(
      [&] {
        init_device_mesh(world, {2, 2}, {"dp"});
      },
      {"1 dim names", "for 2 dims"});
  expect_throws<MeshError>([&] { init_device_mesh(world, {}); }, {"at least one dim"});
  expect_throws<MeshError>([&] { init_device_mesh(world, {2, 0}); }, {"size 0"});
  expect_throws<MeshError>(
      [&] {
        DeviceMesh::from_ranks(world, {2, 2}, {0, 3, 3, 1});
      },
      {"from_ranks", "rank 3 appears twice", "positions 1 and 2"});
  expect_throws<MeshError>([&] { DeviceMesh::from_ranks(world, {2}, {0, -1}); }, {"negative"});
  expect_throws<MeshError>(
      [&] {
        DeviceMesh::from_ranks(world, {2}, {0, 8});
      },
      {"rank 8", "world of 8 ranks"});
  expect_throws<MeshError>(
      [&] {
        DeviceMesh::from_ranks(world, {3}, {0, 1});
      },
      {"needs 3 ranks, got 2"});
  expect_throws<MeshError>([&] { DeviceMesh::from_ranks(world, arange(4)); }, {"must be I64"});

  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const std::string name = "DeviceMesh((dp=2, tp=4), stride=(4, 1))";
  expect_throws<MeshError>([&] { mesh.resolve(2); }, {name, "dim 2 is out of range"});
  expect_throws<MeshError>([&] { mesh.size("pp"); }, {name, "unknown dim 'pp'"});
  expect_throws<MeshError>([&] { mesh.groups("pp"); }, {name, "unknown dim 'pp'"});
  expect_throws<MeshError>([&] { mesh[{"dp", "dp"}]; }, {name, "'dp' is selected twice"});
  expect_throws<MeshError>([&] { mesh.slice({}); }, {"at least one dim"});
  expect_throws<MeshError>([&] { init_device_mesh(world, {8}).flatten(); }, {"needs a name"});
  expect_throws<MeshError>([&] { mesh.flatten("tp"); }, {"'tp' already exists"});
  expect_throws<MeshError>(
      [&] {
        mesh.unflatten("tp", {2, 3}, {"a", "b"});
      },
      {"unflatten", name, "dim 'tp'", "(2, 3) multiply to 6", "has 4 ranks"});
  expect_throws<MeshError>(
      [&] {
        mesh.unflatten("tp", {2, 2}, {"a"});
      },
      {"1 names ['a'] for 2 sizes"});
  expect_throws<MeshError>([&] { mesh.unflatten("tp", {2, 2}, {"a", "dp"}); }, {"'dp' clashes"});
  expect_throws<MeshError>([&] { mesh.unflatten(5, {2, 2}, {"a", "b"}); }, {"out of range"});
  expect_throws<MeshError>(
      [&] {
        init_device_mesh(world, {8}).unflatten(0, {2, 4}, {"a", "b"});
      },
      {"unnamed"});
  expect_throws<MeshError>([&] { concatenate({}); }, {"no meshes"});
  expect_throws<MeshError>(
      [&] {
        concatenate({mesh["dp"], mesh["dp"]});
      },
      {"concatenate", "'dp' appears twice"});
  DeviceMesh flat = mesh.flatten();
  expect_throws<MeshError>([&] { concatenate({flat, mesh["tp"]}); }, {"concatenate", "overlap"});
  expect_throws<MeshError>(
      [&] {
        concatenate({mesh["dp"], init_device_mesh(world, {8}, {"x"})});
      },
      {"different root meshes"});
  // A flattened non-contiguous dim whose pieces are not layouts cannot be unflattened that way.
  DeviceMesh m3 = init_device_mesh(make_world(30), {3, 5, 2}, {"a", "b", "c"});
  DeviceMesh ac = m3[{"a", "c"}].flatten();
  expect_throws<MeshError>(
      [&] {
        ac.unflatten(0, {2, 3}, {"x", "y"});
      },
      {"unflatten", "dim 'a_c'", "(3,2):(10,1)", "cannot be split into (2, 3)"});
  EXPECT_EQ(ac.unflatten(0, {3, 2}, {"x", "y"}).groups("x"), m3.groups("a"));
  // Slicing flattened dims from a non-root mesh.
  expect_throws<MeshError>(
      [&] {
        m3[{"a", "b"}]["a_c"];
      },
      {"'a_c' is a flattened dim, reachable by name only from the root"});
  DeviceMesh undefined;
  expect_throws<MeshError>([&] { undefined.size(); }, {"undefined"});
}

// ---- communicator cache -----------------------------------------------------------------------

TEST(CommCache, UnflattensIntoTheSameLayoutShareCommunicators) {
  World world = make_world(8);
  DeviceMesh w = init_device_mesh(world, {8}, {"world"});
  DeviceMesh m1 = w.unflatten(0, {2, 2, 2}, {"dp", "cp", "tp"});
  DeviceMesh m2 = w.unflatten(0, {2, 2, 2}, {"dp", "ep", "ep_tp"});
  int built = 0;
  auto factory = [&] { return make_token(++built); };
  CommCache& cache = w.comm_cache();
  auto get = [&](const DeviceMesh& m, MeshDim d) {
    return cache.get_or_create(m.dim_layout(d), {}, factory);
  };
  auto dp1 = get(m1, "dp"), cp = get(m1, "cp"), tp = get(m1, "tp");
  auto dp2 = get(m2, "dp"), ep = get(m2, "ep"), ep_tp = get(m2, "ep_tp");
  EXPECT_EQ(built, 3);
  EXPECT_EQ(cp, ep);
  EXPECT_EQ(tp, ep_tp);
  EXPECT_EQ(dp1, dp2);
  EXPECT_NE(cp, tp);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(&m1.comm_cache(), &m2.comm_cache());
  // The canonical key: the flattened dp x cp (4:2) is the same dim as the nested (2,2):(4,2).
  auto dp_cp = cache.get_or_create(m1[{"dp", "cp"}].flatten().dim_layout(0), {}, factory);
  EXPECT_EQ(cache.get_or_create(nest((m1[{"dp", "cp"}].layout())), {}, factory), dp_cp);
  EXPECT_EQ(built, 4);
  // Other options are another communicator.
  CommOptions nccl{.backend = "nccl", .params = {{"blocking", "0"}}};
  EXPECT_NE(cache.get_or_create(m1.dim_layout("cp"), nccl, factory), cp);
  EXPECT_EQ(built, 5);
  EXPECT_EQ(cache.find(m2.dim_layout("ep"), nccl), cache.find(m1.dim_layout("cp"), nccl));
  EXPECT_EQ(cache.find(Layout(8, 1), nccl), nullptr);
  EXPECT_EQ(nccl.to_string(), "nccl{blocking=0}");
  EXPECT_EQ(CommOptions{}.to_string(), "default");
  EXPECT_NE(nccl.hash(), CommOptions{}.hash());
}

TEST(CommCache, BuildsOncePerKeyUnderContention) {
  CommCache cache;
  std::atomic<int> built{0};
  std::vector<std::shared_ptr<Communicator>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      got[t] = cache.get_or_create(Layout(4, 2), {}, [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return make_token(++built);
      });
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(built.load(), 1);
  for (const auto& c : got) EXPECT_EQ(c, got[0]);
  // A factory may use the cache for other keys; a throwing factory caches nothing.
  auto outer = cache.get_or_create(Layout(8, 1), {}, [&] {
    cache.get_or_create(Layout(2, 1), {}, [] { return make_token(100); });
    return make_token(101);
  });
  EXPECT_NE(outer, nullptr);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_THROW(
      cache.get_or_create(Layout(2, 4), {},
                          []() -> std::shared_ptr<Communicator> { throw CommError("no"); }),
      CommError);
  EXPECT_EQ(cache.find(Layout(2, 4), {}), nullptr);
  expect_throws<Error>([&] { cache.get_or_create(Layout(2, 4), {}, [] { return nullptr; }); },
                       {"returned null"});
}

}  // namespace
}  // namespace spmd
