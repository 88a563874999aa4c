// The parity run (Note [Parity run] in debug/parity.h): its comparison against closed-form
// differences, the one-rank world's meshes, the randomness both runs share, and the record and
// compare phases on a planted departure. The whole-program side (launch() running the program
// twice, the bug catalog's parity rows, every example with no report) is in bug_catalog_test and
// the examples' tests.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include <spmd/debug/checks.h>
#include <spmd/debug/parity.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

// The reference world of a parity run on `world`'s size: rank 0 alone, every mesh collapsed.
World reference_of(const World& world) {
  auto state = std::make_shared<WorldState>(World::sim(world.size()).state());
  state->parity_reference = true;
  state->held_ranks = {0};
  return World(std::move(state));
}

ParityValue value_of(std::vector<double> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return parity_value(from_vector(values, {n}).to(DType::F64), "");
}

TEST(ParityCompare, NormWiseRelativeDifferenceAtTheWorstIndex) {
  const ParityValue expected = value_of({1.0, -4.0, 2.0, 0.0});
  // 4e-4 off at index 1 (1e-4 of the largest |value|, 4), 2e-4 off at index 3 (an element of 0:
  // norm-wise, 5e-5 of the largest).
  const ParityValue got = value_of({1.0, -4.0004, 2.0, 2e-4});
  EXPECT_FALSE(parity_departure(got, expected, 2e-4).has_value());
  const auto d = parity_departure(got, expected, 5e-5);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->flat, 1);
  EXPECT_DOUBLE_EQ(d->got, -4.0004);
  EXPECT_DOUBLE_EQ(d->expected, -4.0);
  EXPECT_NEAR(d->relative, 1e-4, 1e-12);
  EXPECT_FALSE(parity_departure(expected, expected, 0.0).has_value());
}

TEST(ParityCompare, NonFiniteValuesAgreeOnlyWithThemselves) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(parity_departure(value_of({nan, -inf, 1.0}), value_of({nan, -inf, 1.0}), 0.0));
  const auto d = parity_departure(value_of({1.0, 1.0}), value_of({1.0, nan}), 1e3);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->flat, 1);
  EXPECT_TRUE(std::isinf(d->relative));
  EXPECT_TRUE(parity_departure(value_of({-inf}), value_of({inf}), 1e3).has_value());
}

TEST(ParityCompare, ToleranceByDtypeAndOverride) {
  EXPECT_DOUBLE_EQ(parity_tolerance(DType::F64), 1e-9);
  EXPECT_DOUBLE_EQ(parity_tolerance(DType::F32), 1e-3);
  EXPECT_DOUBLE_EQ(parity_tolerance(DType::BF16), 5e-2);
  EXPECT_DOUBLE_EQ(parity_tolerance(DType::F32, 1e-2), 1e-2);
  EXPECT_DOUBLE_EQ(parity_tolerance(DType::I64, 1e-2), 0.0);  // integers compare exactly
}

TEST(ParityCompare, BigTensorsKeepEveryKthElement) {
  const int64_t n = 3 * kParitySampleLimit + 5;
  const ParityValue v = parity_value(arange(n, DType::F64), "");
  EXPECT_EQ(v.stride, 4);
  ASSERT_EQ(static_cast<int64_t>(v.values.size()), (n + 3) / 4);
  EXPECT_DOUBLE_EQ(v.values[1], 4.0);
  EXPECT_DOUBLE_EQ(v.values.back(), static_cast<double>((n - 1) / 4 * 4));
}

TEST(ParityWorld, MeshesCollapseToOneRankWithTheSameNames) {
  const World world = testing::test_world();
  if (world.held_ranks().size() != static_cast<size_t>(world.size())) GTEST_SKIP() << "sim only";
  const World reference = reference_of(world);
  EXPECT_EQ(reference.size(), world.size());
  const DeviceMesh mesh = init_device_mesh(reference, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(mesh.shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(mesh.size("tp"), 1);
  EXPECT_EQ(mesh.rank_table().to_vector<int64_t>(), (std::vector<int64_t>{0}));
  const DeviceMesh stage = DeviceMesh::from_ranks(reference, {2, 2}, {4, 5, 6, 7}, {"dp", "tp"});
  EXPECT_EQ(stage.shape(), (std::vector<int64_t>{1, 1}));
  // A DTensor there is its full tensor; a collective is the identity.
  const DTensor x = distribute_tensor(randn({4, 6}, 1), mesh, {Shard{0}, Shard{1}});
  EXPECT_EQ(x.local().ranks(), (std::vector<int>{0}));
  EXPECT_TRUE(allclose(x.local().shard(0), randn({4, 6}, 1), 0.0, 0.0));
  EXPECT_TRUE(allclose(x.redistribute({Replicate{}, Replicate{}}).local().shard(0),
                       randn({4, 6}, 1), 0.0, 0.0));
}

// Init, dropout masks and data are the same in both runs: mesh-invariant randomness.
TEST(ParityWorld, RandomnessIsTheSameInBothWorlds) {
  const World world = testing::test_world();
  if (world.size() != 8 || world.held_ranks().size() != 8) GTEST_SKIP() << "sim, 8 ranks";
  const World reference = reference_of(world);
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const DeviceMesh one = init_device_mesh(reference, {2, 4}, {"dp", "tp"});
  const Placements layout = {Shard{0}, Shard{1}};
  const DTensor a = randn({6, 10}, mesh, layout, 11);
  const DTensor b = randn({6, 10}, one, layout, 11);
  EXPECT_TRUE(allclose(assemble_full_tensor(a), assemble_full_tensor(b), 0.0, 0.0));
  const DTensor da = dropout(a, 0.3, 5);
  const DTensor db = dropout(b, 0.3, 5);
  EXPECT_TRUE(allclose(assemble_full_tensor(da), assemble_full_tensor(db), 0.0, 0.0));
}

// The two phases by hand: a correct op agrees, a planted per-rank value departs at its line.
TEST(ParityRun, ReportsTheFirstDepartingLineAndTheLastThatAgreed) {
  const World world = testing::test_world();
  if (world.size() != 8 || world.held_ranks().size() != 8) GTEST_SKIP() << "sim, 8 ranks";
  const World reference = reference_of(world);
  // The program: y = x * 2 (right), then a per-rank offset added in local code (wrong: on one
  // rank the offset is 0 everywhere, here rank r adds r).
  auto program = [](const World& w) {
    const DeviceMesh mesh = init_device_mesh(w, {w.size()}, {"dp"});
    const DTensor x = distribute_tensor(arange(16, DType::F64), mesh, {Shard{0}});
    const DTensor y = x * 2.0;
    const LocalTensor offset =
        LocalTensor::from_fn(w, [&](int r) { return full({16 / mesh.size("dp")}, r, DType::F64); });
    return DTensor::from_local(y.to_local() + offset, mesh, {Shard{0}});
  };
  parity_record(reference);
  (void)program(reference);
  parity_compare(world);
  const std::string error = expect_throws<ParityError>([&] { (void)program(world); });
  parity_end();
  EXPECT_NE(error.find("'from_local' at parity_test.cpp:"), std::string::npos) << error;
  EXPECT_NE(error.find("(occurrence 1) departs from the same program on one rank"),
            std::string::npos)
      << error;
  // Rank 7's piece is rows 14 and 15: 28 + 7 here, 28 on one rank; the largest is 30.
  EXPECT_NE(error.find("most at index [14]: 35 here, 28 on one rank"), std::string::npos) << error;
  EXPECT_NE(error.find("differ by 0.233 of the tensor's largest (tolerance 1e-09 for f64)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("The last site that still agreed: 'mul' at parity_test.cpp:"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("(S(0)) on DeviceMesh((dp=8)"), std::string::npos) << error;
  EXPECT_NE(parity_summary().find("DTensors compared"), std::string::npos);
}

// Sites whose global shapes differ between the runs, or that only one run reaches, are skipped.
TEST(ParityRun, OtherShapesAndExtraOccurrencesAreNotCompared) {
  const World world = testing::test_world();
  if (world.size() != 8 || world.held_ranks().size() != 8) GTEST_SKIP() << "sim, 8 ranks";
  const World reference = reference_of(world);
  auto program = [](const World& w) {
    const DeviceMesh mesh = init_device_mesh(w, {w.size()}, {"dp"});
    // Rows per rank from the mesh: the same global [8] in both runs, except that the loop runs
    // once per dp rank and the data is sized by the mesh.
    for (int64_t i = 0; i < mesh.size("dp"); ++i) {
      const DTensor x = distribute_tensor(ones({8 * mesh.size("dp")}), mesh, {Shard{0}});
      (void)(x * 3.0);
    }
  };
  parity_record(reference);
  program(reference);
  parity_compare(world);
  program(world);
  parity_end();
  const std::string summary = parity_summary();
  EXPECT_NE(summary.find("0 DTensors compared"), std::string::npos) << summary;
  EXPECT_NE(summary.find("1 of another shape"), std::string::npos) << summary;
  EXPECT_NE(summary.find("7 the one-rank run never made"), std::string::npos) << summary;
}

}  // namespace
}  // namespace spmd
