// Mesh-invariant random init: randn/rand DTensors equal distribute_tensor of the single-device
// tensor bit for bit, on several meshes and placements, uneven and empty shards included.
#include <gtest/gtest.h>

#include <spmd/dtensor/random.h>
#include "tests/dtensor/dtensor_test_support.h"

namespace spmd {
namespace {

using testing::pieces_match;

TEST(RandomInit, EqualsDistributedSingleDeviceTensorOnEveryMesh) {
  World world = testing::test_world(64);
  const std::vector<std::vector<int64_t>> meshes = {{1},    {3},    {4},       {2, 2},
                                                    {2, 3}, {4, 2}, {3, 1, 2}, {2, 2, 2}};
  const std::vector<Shape> shapes = {{7, 5}, {8, 4}, {3, 2}, {0, 3}, {2, 9, 3}};
  int checked = 0;
  for (const auto& mesh_shape : meshes) {
    auto mesh = testing::try_mesh(world, mesh_shape);
    if (!mesh) continue;
    for (const Shape& shape : shapes) {
      const Placements kinds = testing::all_placement_kinds(static_cast<int>(shape.size()));
      // Every kind on every mesh dim, cycling the others.
      for (size_t k = 0; k < kinds.size(); ++k) {
        Placements p;
        for (size_t i = 0; i < mesh_shape.size(); ++i)
          p.push_back(kinds[(k + 3 * i) % kinds.size()]);
        for (DType dtype : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(
              fmt::format("{} {} on {}", to_string(p), shape_str(shape), mesh->to_string()));
          const uint64_t seed = 1000 + k;
          DTensor n = randn(shape, *mesh, p, seed, dtype);
          DTensor expected = distribute_tensor(randn(shape, seed, dtype), *mesh, p);
          DTensor u = rand(shape, *mesh, p, seed, dtype);
          DTensor expected_u = distribute_tensor(rand(shape, seed, dtype), *mesh, p);
          for (int r : n.local().ranks()) {
            ASSERT_TRUE(equal(n.to_local().shard(r), expected.to_local().shard(r))) << "rank " << r;
            ASSERT_TRUE(equal(u.to_local().shard(r), expected_u.to_local().shard(r)))
                << "rank " << r;
          }
          if (!n.spec().has_partial()) EXPECT_TRUE(pieces_match(n, randn(shape, seed, dtype)));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(RandomInit, FullTensorIsTheSameOnEveryMesh) {
  World world = testing::test_world(64);
  const Tensor reference = randn({10, 6}, 77);
  for (const auto& mesh_shape : std::vector<std::vector<int64_t>>{{4}, {2, 3}, {3, 2, 2}}) {
    auto mesh = testing::try_mesh(world, mesh_shape);
    if (!mesh) continue;
    Placements p(mesh_shape.size(), Shard{0});
    p.back() = Shard{1};
    EXPECT_TRUE(equal(randn({10, 6}, *mesh, p, 77).full_tensor(), reference)) << mesh->to_string();
  }
}

}  // namespace
}  // namespace spmd
