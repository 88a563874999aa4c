// Collectives beyond the conformance table: PyTorch's LocalTensor reference vectors
// (notes §1.6), error reports, trace records, async handles and communicator reuse. The sim
// backend's own behaviours (groups not fully held, shared replicated results) are in
// tests/backends/sim.
#include <gtest/gtest.h>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

Tensor mat(std::vector<double> v, Shape shape) {
  return from_vector(v, shape).to(DType::F32);
}

LocalTensor per_rank(const World& world, const std::vector<Tensor>& shards) {
  return LocalTensor(world.held_ranks(), shards);
}

// ---- reference vectors of notes §1.6 --------------------------------------------------------

TEST(LocalTensorVectors, AllReduceWorld3) {
  World world = World::sim(3);
  DeviceMesh mesh = init_device_mesh(world, {3});
  LocalTensor x = per_rank(
      world, {mat({1, 4, 2, 5}, {2, 2}), mat({2, 1, 3, 6}, {2, 2}), mat({3, 2, 1, 4}, {2, 2})});
  EXPECT_TRUE(equal(all_reduce(x, mesh, 0, ReduceOp::Sum).reconcile(), mat({6, 7, 6, 15}, {2, 2})));
  EXPECT_TRUE(equal(all_reduce(x, mesh, 0, ReduceOp::Max).reconcile(), mat({3, 4, 3, 6}, {2, 2})));
  EXPECT_TRUE(equal(all_reduce(x, mesh, 0, ReduceOp::Min).reconcile(), mat({1, 1, 1, 4}, {2, 2})));
}

TEST(LocalTensorVectors, ReduceScatterWorld3) {
  World world = World::sim(3);
  DeviceMesh mesh = init_device_mesh(world, {3});
  Tensor base = mat({1, 2, 3, 4, 5, 6}, {3, 2});
  LocalTensor x = per_rank(world, {base, base * 10.0, base * 100.0});
  LocalTensor y = reduce_scatter(x, mesh, 0);
  EXPECT_TRUE(equal(y.shard(0), mat({111, 222}, {1, 2})));
  EXPECT_TRUE(equal(y.shard(1), mat({333, 444}, {1, 2})));
  EXPECT_TRUE(equal(y.shard(2), mat({555, 666}, {1, 2})));
}

TEST(LocalTensorVectors, AllToAllSingleWorld3) {
  World world = World::sim(3);
  DeviceMesh mesh = init_device_mesh(world, {3});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({6}, r); });
  std::vector<int64_t> splits = {2, 2, 2};
  LocalTensor y = all_to_all_single(x, mesh, 0, splits, splits);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(equal(y.shard(r), mat({0, 0, 1, 1, 2, 2}, {6})));
}

TEST(LocalTensorVectors, BroadcastAndAllReduceWorld2) {
  World world = World::sim(2);
  DeviceMesh mesh = init_device_mesh(world, {2});
  LocalTensor x = per_rank(world, {mat({1, 2, 3, 4}, {2, 2}), mat({5, 6, 7, 8}, {2, 2})});
  LocalTensor b = broadcast(x, mesh, 0, 0);
  EXPECT_TRUE(equal(b.shard(1), mat({1, 2, 3, 4}, {2, 2})));
  EXPECT_TRUE(equal(all_reduce(x, mesh, 0).reconcile(), mat({6, 8, 10, 12}, {2, 2})));
}

// ---- errors ---------------------------------------------------------------------------------

TEST(CollectiveErrors, ShapesDifferWithinGroup) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return zeros({2, r == 3 ? 3 : 2}); });
  expect_throws<CommError>([&] { all_reduce(x, mesh, "tp"); },
                           {"all_reduce", "'tp'", "[2, 3]", "rank 3: [2, 3]", "rank 2: [2, 2]"});
  // The dp groups [0, 2] and [1, 3]: the second holds the odd shape.
  expect_throws<CommError>([&] { all_gather(x, mesh, "dp"); }, {"all_gather", "[1, 3]"});
}

// The inputs below vary per rank (from_fn: V), so the collectives' SPMD types allow every call and
// each argument check is what fails.
LocalTensor varying_zeros(const World& world, const Shape& shape) {
  return LocalTensor::from_fn(world, [&](int) { return zeros(shape); });
}

TEST(CollectiveErrors, LocalArgumentChecks) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  LocalTensor x = varying_zeros(world, {6, 2});
  expect_throws<CommError>([&] { all_gather(x, mesh, "tp", 2); }, {"gather_dim=2", "out of range"});
  expect_throws<CommError>([&] { reduce_scatter(x, mesh, "tp"); },
                           {"reduce_scatter", "not divisible by the group size 4", "[6, 2]"});
  expect_throws<CommError>([&] { all_to_all(x, mesh, "tp", 0, 1); }, {"split_dim"});
  expect_throws<CommError>([&] { broadcast(x, mesh, "tp", 4); }, {"src=4", "0..3"});
  expect_throws<CommError>([&] { gather(x, mesh, "tp", -1); }, {"dst=-1"});
  expect_throws<CommError>([&] { all_reduce(x, mesh, "tp", ReduceOp::BXor); },
                           {"bxor", "integer and bool"});
  expect_throws<CommError>(
      [&] {
        permute(x, mesh, "tp", {1, 1, 2, 3});
      },
      {"sends two shards to group rank 1"});
  expect_throws<CommError>([&] { permute(x, mesh, "tp", {1, 2}); }, {"2 entries", "4 ranks"});
  expect_throws<CommError>(
      [&] {
        all_to_all_single(x, mesh, "tp", std::vector<int64_t>{1, 1, 1, 3},
                          std::vector<int64_t>{1, 1, 1, 1});
      },
      {"in_splits", "add up to 4", "6 rows"});
  // Every rank sends all 8 rows to group rank 0, which expects an even 2 from each.
  expect_throws<CommError>(
      [&] {
        all_to_all_single(varying_zeros(world, {8, 2}), mesh, "tp", {},
                          std::vector<int64_t>{8, 0, 0, 0});
      },
      {"split sizes do not match", "sends 8 rows to rank 0", "expects 2"});
  expect_throws<CommError>([&] { all_reduce(LocalTensor(), mesh, "tp"); }, {"undefined"});
  expect_throws<CommError>([&] { reduce(varying_zeros(world, {}), mesh, "tp", ReduceOp::Sum); },
                           {"0-d", "reshape it to [1]"});
  expect_throws<MeshError>([&] { all_reduce(x, mesh, "nope"); }, {"nope"});
}

// ---- trace, async, communicators ------------------------------------------------------------

TEST(CollectiveTrace, RecordsEveryRankWithSequenceNumbers) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  trace().clear();
  LocalTensor x = varying_zeros(world, {4, 4});
  all_reduce(x, mesh, "tp");
  all_gather(x, mesh, "dp", 1);
  all_reduce(x, mesh, "tp", ReduceOp::Max);
  std::vector<TraceRecord> records = trace().records();
  ASSERT_EQ(records.size(), 12u);
  // Rank 2's view: tp group [2, 3] twice (sequence 0, 1), dp group [0, 2] once.
  std::vector<TraceRecord> mine;
  for (const auto& r : records) {
    if (r.rank == 2) mine.push_back(r);
  }
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_EQ(mine[0].op, "all_reduce");
  EXPECT_EQ(mine[0].dim_name, "tp");
  EXPECT_EQ(mine[0].group_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(mine[0].sequence, 0u);
  EXPECT_EQ(mine[1].op, "all_gather");
  EXPECT_EQ(mine[1].group_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(mine[1].detail, "gather_dim=1");
  EXPECT_EQ(mine[2].sequence, 1u);
  EXPECT_EQ(mine[2].detail, "op=max");
  EXPECT_EQ(mine[0].shape, (Shape{4, 4}));
  EXPECT_EQ(mine[0].bytes, 64);
  EXPECT_GT(mine[0].estimate_us, 0.0);
  EXPECT_NE(mine[0].file.find("collectives_test.cpp"), std::string::npos);
  EXPECT_GT(mine[0].line, 0u);
  auto rows = trace().summary();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].op, "all_reduce");
  EXPECT_EQ(rows[0].count, 2);
}

TEST(CollectiveAsync, WaitGivesTheSynchronousResult) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {4});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({3}, r + 1); });
  auto pending = all_reduce_async(x, mesh, 0, ReduceOp::Product);
  LocalTensor y = pending.wait();
  EXPECT_TRUE(pending.ready());
  EXPECT_TRUE(equal(y.reconcile(), full({3}, 24)));
  EXPECT_TRUE(equal(pending.wait().reconcile(), full({3}, 24)));
}

TEST(CollectiveCommunicators, UnflattensIntoTheSameLayoutShareOne) {
  World world = World::sim(8);
  DeviceMesh root = init_device_mesh(world, {8}, {"world"});
  DeviceMesh a = root.unflatten(0, {2, 2, 2}, {"dp", "cp", "tp"});
  DeviceMesh b = root.unflatten(0, {2, 2, 2}, {"dp", "ep", "ep_tp"});
  EXPECT_EQ(communicator(a, "cp").get(), communicator(b, "ep").get());
  EXPECT_EQ(communicator(a, "tp").get(), communicator(b, "ep_tp").get());
  EXPECT_NE(communicator(a, "dp").get(), communicator(a, "tp").get());
}

class NothingBackend final : public Backend {
 public:
  std::string name() const override { return "nothing"; }
};

TEST(CollectiveBackends, UnimplementedCallsAreUnsupported) {
  auto state = std::make_shared<WorldState>();
  state->size = 2;
  state->held_ranks = {0, 1};
  state->coordinator = true;
  state->backend_name = "nothing";
  state->backend = std::make_shared<NothingBackend>();
  World world(state);
  DeviceMesh mesh = init_device_mesh(world, {2});
  expect_throws<Unsupported>([&] { all_reduce(varying_zeros(world, {2}), mesh, 0); },
                             {"backend 'nothing' does not support all_reduce"});
}

}  // namespace
}  // namespace spmd

namespace spmd {
namespace {

TEST(CollectiveTrace, ChromeJsonAndSummaryTable) {
  World world = World::sim(2);
  DeviceMesh mesh = init_device_mesh(world, {2}, {"tp"});
  trace().clear();
  all_reduce(varying_zeros(world, {8}), mesh, "tp");
  std::string json = trace().to_chrome_json_string();
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("\"rank 1\""), std::string::npos);
  EXPECT_NE(json.find("\"ph\":\"X\""), std::string::npos);
  std::string table = trace().summary_table();
  EXPECT_NE(table.find("all_reduce"), std::string::npos);
  EXPECT_NE(table.find("tp"), std::string::npos);
}

}  // namespace
}  // namespace spmd
