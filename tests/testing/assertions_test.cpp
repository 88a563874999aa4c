// spmd::testing's assertions (spmd/testing/assertions.h): each passes where it should and fails
// with a message that says what differs, where and on which ranks. SPMD_TESTs, so they also run
// under threads and mpirun (tests/testing/CMakeLists.txt), where the comparisons gather through
// collectives.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include <spmd/dtensor/ops.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/factory.h>
#include <spmd/testing.h>
#include "tests/support/run_command.h"
#include "tests/testing/capture.h"

namespace spmd {
namespace {

using testing::failures_of;

using testing::contains;

// Every fragment is in `message`. Outside sim only the lowest rank concerned gives the whole
// message; the others refer to it ("the same failure as rank 0: the full tensors of a and b
// differ"), and under threads every rank's message starts with "[rank r] ".
void expect_failure(const World& world, const std::string& message,
                    std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(message.empty()) << "the assertion did not fail";
  if (world.backend_name() == "threads") {
    const std::string rank = fmt::format("[rank {}] ", world.held_ranks().front());
    EXPECT_EQ(message.rfind(rank, 0), 0u) << message;
  }
  if (world.backend_name() != "sim" && contains(message, "the same failure as rank ")) return;
  for (const std::string& fragment : fragments) {
    EXPECT_TRUE(contains(message, fragment)) << "lacks \"" << fragment << "\":\n" << message;
  }
}

// [8, 4] f32 holding 0, 1, ..., 31.
Tensor table() {
  return arange(32).reshape({8, 4});
}

SPMD_TEST(DTensorEq, EqualFullTensorsPass) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const DTensor rows = distribute_tensor(table(), mesh, {Shard{0}});
  EXPECT_DTENSOR_EQ(rows, table());
  EXPECT_DTENSOR_EQ(table(), rows);
  EXPECT_DTENSOR_EQ(rows, rows.redistribute({Replicate{}}));
  EXPECT_DTENSOR_EQ(rows, distribute_tensor(table(), mesh, {Shard{1}}));
  EXPECT_DTENSOR_NEAR(rows, table() + 1e-4, 1e-3);
  EXPECT_DTENSOR_EQ(table(), table());
}

SPMD_TEST(DTensorEq, FailureNamesTheIndexValuesRanksAndPlacements) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const DTensor rows = distribute_tensor(table(), mesh, {Shard{0}});
  Tensor want = table().clone();
  want.narrow(0, 5, 1).narrow(1, 2, 1).fill_(22.5);
  // Row 5 lives on the rank whose chunk of ceil(8 / n) rows holds it.
  const int64_t chunk = (8 + world.size() - 1) / world.size();
  const std::string message = failures_of([&] { EXPECT_DTENSOR_EQ(rows, want); });
  expect_failure(world, message,
                 {"The full tensors of rows and want differ at 1 of 32 elements; the first is "
                  "index [5, 2]:",
                  "rows = 22  ", "want = 22.5", "DTensor [8, 4] f32, S(0) on DeviceMesh",
                  fmt::format("index [5, 2] is on rank {}", 5 / chunk), "Tensor [8, 4] f32"});
}

SPMD_TEST(DTensorEq, NearReportsTheFirstAndTheLargestDifference) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const DTensor cols = distribute_tensor(table(), mesh, {Shard{1}});
  Tensor want = table().clone();
  want.narrow(0, 1, 1).narrow(1, 0, 1).fill_(4.01);  // 4 -> 4.01: within 0.1
  want.narrow(0, 2, 1).narrow(1, 3, 1).fill_(11.5);  // 11 -> 11.5
  want.narrow(0, 6, 1).narrow(1, 1, 1).fill_(27);    // 25 -> 27
  const std::string message = failures_of([&] { EXPECT_DTENSOR_NEAR(cols, want, 0.1); });
  expect_failure(world, message,
                 {"differ by more than 0.1 at 2 of 32 elements; the first is index [2, 3] "
                  "(difference 0.5; the largest is 2 at index [6, 1])",
                  "cols = 11  ", "want = 11.5", "S(1)"});
}

SPMD_TEST(DTensorEq, ShapesAndDtypesMustMatch) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const DTensor rows = distribute_tensor(table(), mesh, {Shard{0}});
  expect_failure(world, failures_of([&] { EXPECT_DTENSOR_EQ(rows, table().transpose(0, 1)); }),
                 {"differ in shape: [8, 4] vs [4, 8]", "rows", "DTensor [8, 4] f32, S(0)",
                  "Tensor [4, 8] f32"});
  expect_failure(world, failures_of([&] { EXPECT_DTENSOR_EQ(rows, table().to(DType::F64)); }),
                 {"differ in dtype: f32 vs f64"});
}

SPMD_TEST(DTensorEq, PartialValuesAreComparedReduced) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  // Every rank holds table() / n: the sum is table() (n a power of two keeps it exact; for other
  // sizes the comparison allows rounding).
  const LocalTensor pieces =
      LocalTensor::from_fn(world, [&](int) { return table() / static_cast<double>(world.size()); });
  const DTensor partial = DTensor::from_local(pieces, mesh, {Partial{}}, Shape{8, 4});
  EXPECT_DTENSOR_NEAR(partial, table(), 1e-4);
  const std::string message = failures_of([&] { EXPECT_DTENSOR_NEAR(partial, table() + 1, 1e-4); });
  expect_failure(
      world, message,
      {"at 32 of 32 elements; the first is index [0, 0]", "P(sum)",
       world.size() == 1 ? "is a partial value on rank 0"
                         : fmt::format("is a partial value on ranks 0{}{}",
                                       world.size() == 2 ? "," : "-", world.size() - 1)});
}

SPMD_TEST(DTensorEq, NaNEqualsNaNAtTheSameIndex) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  Tensor with_nan = table().clone();
  with_nan.narrow(0, 3, 1).fill_(std::nan(""));
  const DTensor d = distribute_tensor(with_nan, mesh, {Shard{0}});
  EXPECT_DTENSOR_EQ(d, with_nan);
  expect_failure(world, failures_of([&] { EXPECT_DTENSOR_NEAR(d, table(), 1.0); }),
                 {"at 4 of 32 elements; the first is index [3, 0] (difference nan)"});
}

SPMD_TEST(Placements, MatchAsParsed) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const DTensor rows = distribute_tensor(table(), mesh, {Shard{0}});
  EXPECT_PLACEMENTS(rows, "S(0)");
  EXPECT_PLACEMENTS(rows, "S(-2)");
  const Placements replicated = {Replicate{}};
  EXPECT_PLACEMENTS(rows.redistribute(replicated), replicated);
  expect_failure(world, failures_of([&] { EXPECT_PLACEMENTS(rows, "R"); }),
                 {fmt::format("rows has placements S(0), expected R; rows is a DTensor [8, 4] f32 "
                              "on {}",
                              mesh.to_string())});
  EXPECT_TRUE(contains(failures_of([&] { EXPECT_PLACEMENTS(rows, "S(0"); }),
                       "EXPECT_PLACEMENTS(rows, \"S(0\"): the expected placements do not parse: "));
}

SPMD_TEST(Replicated, IdenticalShardsPassAndTheFirstDifferenceIsReported) {
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  const DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "tp"});
  // Each dp row holds its own values: replicated along "tp", not along "dp" (when dp > 1).
  const LocalTensor by_dp = LocalTensor::from_fn(world, [&](int rank) {
    return full({2, 3}, rank / 2);
  });
  EXPECT_REPLICATED(by_dp, mesh, "tp");
  EXPECT_REPLICATED(LocalTensor::replicate(world, table()), mesh, "dp");
  if (world.size() >= 4) {
    const std::string message = failures_of([&] { EXPECT_REPLICATED(by_dp, mesh, "dp"); });
    // Under sim the first group is reported; elsewhere each rank reports its own.
    const int column = world.backend_name() == "sim" ? 0 : world.held_ranks().front() % 2;
    expect_failure(world, message,
                   {"The shards of by_dp are not replicated along mesh dim 'dp' of DeviceMesh",
                    fmt::format("rank {} holds 0 and rank {} holds 1 at index [0, 0] (6 of 6 "
                                "elements differ; shape [2, 3] f32)",
                                column, column + 2)});
  }
  const LocalTensor ragged =
      LocalTensor::from_fn(world, [&](int rank) { return zeros({2 + rank % 2}); });
  expect_failure(world, failures_of([&] { EXPECT_REPLICATED(ragged, mesh, "tp"); }),
                 {"along mesh dim 'tp'", "holds a [2] f32 shard and rank", "a [3] f32 one"});
}

SPMD_TEST(Replicated, GradientsOfAReplicatedLeafAreReplicated) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  DTensor x = distribute_tensor(table(), mesh, {Replicate{}}).requires_grad_();
  const DTensor w = distribute_tensor(ones({4, 8}), mesh, {Shard{1}});
  backward(sum(matmul(x, w)));
  EXPECT_PLACEMENTS(x.grad(), "R");
  EXPECT_REPLICATED(x.grad().to_local(), mesh, "tp");
  EXPECT_DTENSOR_EQ(x.grad(), full({8, 4}, 8));
}

SPMD_TEST(ExpectThrows, PassesAndFailsWithTheTypeAndMessage) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
  const std::string message = testing::expect_throws<MeshError>([&] { mesh["ep"]; }, {"'ep'"});
  EXPECT_TRUE(contains(message, "ep")) << message;
  // A base class catches its subclasses.
  testing::expect_throws<Error>([&] { mesh["ep"]; });
  EXPECT_TRUE(contains(failures_of([&] { testing::expect_throws<CommError>([&] { mesh["ep"]; }); }),
                       "expected spmd::CommError, got MeshError: "));
  EXPECT_TRUE(contains(failures_of([&] { testing::expect_throws<MeshError>([] {}); }),
                       "expected spmd::MeshError, but nothing was thrown"));
  EXPECT_TRUE(contains(failures_of([&] {
                         testing::expect_throws<MeshError>([&] { mesh["ep"]; }, {"no such words"});
                       }),
                       "the spmd::MeshError's message lacks \"no such words\": "));
  EXPECT_TRUE(contains(failures_of([&] {
                         testing::expect_throws<MeshError>(
                             [] { throw std::out_of_range("index 9"); });
                       }),
                       "expected spmd::MeshError, got std::out_of_range: index 9"));
}

}  // namespace
}  // namespace spmd
