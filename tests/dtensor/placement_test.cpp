// Placements and DTensorSpec: printing, parsing, equality, hashing and validation errors.
#include <gtest/gtest.h>

#include <unordered_set>

#include <spmd/dtensor/spec.h>
#include <spmd/ops/placement.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(Placement, PrintsAndParses) {
  const Placements p = {Shard{0}, Replicate{}, Partial{ReduceOp::Avg}, Partial{}};
  EXPECT_EQ(to_string(p), "S(0),R,P(avg),P(sum)");
  EXPECT_EQ(fmt::format("{}", p), "S(0),R,P(avg),P(sum)");
  EXPECT_EQ(fmt::format("{}", Placement{Shard{2}}), "S(2)");
  EXPECT_EQ(parse_placements("S(0),R,P(avg),P(sum)"), p);
  EXPECT_EQ(parse_placements(" Shard(0), Replicate(), Partial(avg), P "), p);
  EXPECT_EQ(parse_placements("P(max),P(min),P(prod),S(-1)"),
            (Placements{Partial{ReduceOp::Max}, Partial{ReduceOp::Min}, Partial{ReduceOp::Product},
                        Shard{-1}}));
  EXPECT_TRUE(parse_placements("").empty());
  for (const auto& [text, fragment] :
       std::vector<std::pair<std::string, std::string>>{{"S(x)", "'S(x)'"},
                                                        {"Q", "'Q'"},
                                                        {"P(band)", "cannot be a Partial"},
                                                        {"S(0),,R", "empty item"},
                                                        {"P(foo)", "unknown reduce op 'foo'"}}) {
    expect_throws<PlacementError>([&] { parse_placements(text); },
                                  {"parse_placements", fragment, text});
  }
}

TEST(Placement, EqualityAndHashing) {
  EXPECT_EQ(Placement{Shard{1}}, Placement{Shard{1}});
  EXPECT_NE(Placement{Shard{1}}, Placement{Shard{0}});
  EXPECT_NE(Placement{Partial{ReduceOp::Sum}}, Placement{Partial{ReduceOp::Max}});
  std::unordered_set<size_t> hashes;
  for (const Placement& p : testing::all_placement_kinds(3)) hashes.insert(hash_value(p));
  EXPECT_EQ(hashes.size(), 9u);
  EXPECT_EQ(hash_value(Placements{Shard{0}, Replicate{}}),
            hash_value(Placements{Shard{0}, Replicate{}}));
  EXPECT_NE(hash_value(Placements{Shard{0}, Replicate{}}),
            hash_value(Placements{Replicate{}, Shard{0}}));
}

TEST(DTensorSpec, NormalizesComparesAndValidates) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  DTensorSpec a(*mesh, {Shard{-1}, Replicate{}}, {4, 6}, DType::F32);
  DTensorSpec b(*mesh, {Shard{1}, Replicate{}}, {4, 6}, DType::F32);
  EXPECT_EQ(a.placements(), (Placements{Shard{1}, Replicate{}}));
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_FALSE(a == b.with_placements({Shard{0}, Replicate{}}));
  EXPECT_FALSE(a == DTensorSpec(*mesh, {Shard{1}, Replicate{}}, {4, 6}, DType::F64));
  EXPECT_EQ(a.num_shards(), 2);
  EXPECT_TRUE(a.is_even());
  EXPECT_EQ(a.to_string(), "DTensorSpec(S(1),R, [4, 6] f32, " + mesh->to_string() + ")");
  expect_throws<PlacementError>(
      [&] {
        DTensorSpec(*mesh, {Shard{2}, Replicate{}}, {4, 6}, DType::F32);
      },
      {"S(2)", "mesh dim 0", "2-d tensor", "[4, 6]", "S(2),R", "DeviceMesh"});
  expect_throws<PlacementError>([&] { DTensorSpec(*mesh, {Replicate{}}, {4}, DType::F32); },
                                {"1 placements", "2-d mesh", "[4]"});
  expect_throws<PlacementError>(
      [&] {
        DTensorSpec(*mesh, {Shard{0}, Replicate{}}, {}, DType::F32);
      },
      {"S(0)", "0-d tensor", "[]"});
  expect_throws<PlacementError>([&] { DTensorSpec(DeviceMesh(), {Replicate{}}, {4}, DType::F32); },
                                {"undefined"});
}

}  // namespace
}  // namespace spmd
