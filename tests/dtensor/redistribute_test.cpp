// Redistribution: every ordered pair of placements on 1-D meshes, sampled pairs covering every
// pair of placement kinds on 2-D and 3-D meshes (each dim 1..4), uneven and empty shards, both
// planners; plan printing, the plan cache, the min-cost planner beating the greedy one, and
// from_local's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/trace.h>
#include <spmd/debug/visualize.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/redistribute.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::make_dtensor;
using testing::pieces_match;

// Tolerance: Partial(sum) partitions divide by the group size, Partial(avg) divides the sum.
double tolerance(const Placements& a, const Placements& b) {
  for (const Placements* ps : {&a, &b}) {
    for (const Placement& p : *ps) {
      if (is_partial(p)) return 1e-5;
    }
  }
  return 0.0;
}

// Redistributes a DTensor of `src` over `global` to `dst` and checks every piece (or the full
// tensor for a Partial target), and that the source's full_tensor is the global tensor.
void check_pair(const DeviceMesh& mesh, const Tensor& global, const Placements& src,
                const Placements& dst, RedistributePlanner planner, uint64_t seed) {
  SCOPED_TRACE(fmt::format("{} -> {} shape {} on {} ({})", to_string(src), to_string(dst),
                           shape_str(global.shape()), mesh.to_string(), planner_name(planner)));
  const double tol = tolerance(src, dst);
  DTensor a = make_dtensor(global, mesh, src, seed);
  DTensor b = a.redistribute(dst, planner);
  EXPECT_EQ(b.placements(), dst);
  EXPECT_EQ(b.shape(), global.shape());
  EXPECT_TRUE(pieces_match(b, global, tol));
  EXPECT_TRUE(
      pieces_match(a.redistribute(Placements(src.size(), Replicate{}), planner), global, tol));
}

const std::vector<Shape> kShapes = {{5, 3}, {8, 4}, {3, 2}, {0, 4}};

TEST(Redistribute, EveryPairOn1DMeshes) {
  World world = testing::test_world(64);
  for (int64_t n = 1; n <= 4; ++n) {
    auto mesh = testing::try_mesh(world, {n});
    if (!mesh) continue;
    for (size_t s = 0; s < kShapes.size(); ++s) {
      Tensor global = testing::int_valued(kShapes[s], 100 + s);
      const Placements kinds = testing::all_placement_kinds(2);
      for (const Placement& from : kinds) {
        for (const Placement& to : kinds) {
          for (RedistributePlanner planner :
               {RedistributePlanner::Greedy, RedistributePlanner::MinCost}) {
            check_pair(*mesh, global, {from}, {to}, planner, 7 * s + 1);
          }
        }
      }
    }
  }
}

// Kinds of a placement for coverage bookkeeping: S, R, P.
char kind_of(const Placement& p) {
  return is_shard(p) ? 'S' : is_replicate(p) ? 'R' : 'P';
}

// Random pairs on every mesh of `ndim` dims with sizes 1..4, plus, per mesh, pairs chosen so
// that every (source kind, target kind) combination per mesh dim appears.
void sampled_pairs(int mesh_ndim, int pairs_per_mesh, const std::vector<Shape>& shapes) {
  World world = testing::test_world(64);
  std::mt19937_64 rng(1234 + mesh_ndim);
  std::set<std::string> covered;
  int meshes = 0;
  std::vector<int64_t> mesh_shape(static_cast<size_t>(mesh_ndim), 1);
  while (true) {
    if (auto mesh = testing::try_mesh(world, mesh_shape)) {
      ++meshes;
      for (int k = 0; k < pairs_per_mesh; ++k) {
        const Shape& shape = shapes[rng() % shapes.size()];
        const Placements kinds = testing::all_placement_kinds(static_cast<int>(shape.size()));
        Placements src, dst;
        for (int i = 0; i < mesh_ndim; ++i) {
          src.push_back(kinds[rng() % kinds.size()]);
          dst.push_back(kinds[rng() % kinds.size()]);
          covered.insert(std::string{kind_of(src.back()), kind_of(dst.back())});
        }
        Tensor global = testing::int_valued(shape, rng() % 1000);
        const RedistributePlanner planner =
            k % 2 ? RedistributePlanner::MinCost : RedistributePlanner::Greedy;
        check_pair(*mesh, global, src, dst, planner, rng());
      }
    }
    int i = mesh_ndim - 1;
    while (i >= 0 && ++mesh_shape[static_cast<size_t>(i)] > 4)
      mesh_shape[static_cast<size_t>(i--)] = 1;
    if (i < 0) break;
  }
  if (meshes > 0) EXPECT_EQ(covered.size(), 9u) << "placement kind pairs not all covered";
}

TEST(Redistribute, SampledPairsOn2DMeshes) {
  sampled_pairs(2, 40, {{5, 3}, {7, 6}, {2, 9}, {0, 3}});
}

TEST(Redistribute, SampledPairsOn3DMeshes) {
  sampled_pairs(3, 8, {{5, 3}, {7, 6, 2}, {3, 9}});
}

// Every pair over {S(0), S(1), R, P(sum), P(max)} on a (2, 3) mesh: nested and misaligned
// sharding, uneven rows, Partial to Shard.
TEST(Redistribute, ExhaustiveKindsOn2x3Mesh) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 3});
  if (!mesh) GTEST_SKIP() << "world too small";
  const Placements kinds = {Shard{0}, Shard{1}, Replicate{}, Partial{ReduceOp::Sum},
                            Partial{ReduceOp::Max}};
  Tensor global = testing::int_valued({7, 5}, 11);
  uint64_t seed = 0;
  for (const Placement& a0 : kinds) {
    for (const Placement& a1 : kinds) {
      for (const Placement& b0 : kinds) {
        for (const Placement& b1 : kinds) {
          check_pair(*mesh, global, {a0, a1}, {b0, b1},
                     ++seed % 2 ? RedistributePlanner::Greedy : RedistributePlanner::MinCost, seed);
        }
      }
    }
  }
}

// Integer data stays exact: the R -> P(sum) partition zeroes the other ranks instead of
// dividing (Note [Redistribute steps]).
TEST(Redistribute, IntegerPartialsAreExact) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 3});
  if (!mesh) GTEST_SKIP() << "world too small";
  const Placements kinds = {Shard{0},
                            Shard{1},
                            Replicate{},
                            Partial{ReduceOp::Sum},
                            Partial{ReduceOp::Avg},
                            Partial{ReduceOp::Max},
                            Partial{ReduceOp::Min}};
  Tensor global = testing::int_valued({5, 4}, 21, DType::I64);
  std::mt19937_64 rng(5);
  for (int k = 0; k < 150; ++k) {
    const Placements src = {kinds[rng() % kinds.size()], kinds[rng() % kinds.size()]};
    const Placements dst = {kinds[rng() % kinds.size()], kinds[rng() % kinds.size()]};
    SCOPED_TRACE(fmt::format("{} -> {}", to_string(src), to_string(dst)));
    DTensor b = make_dtensor(global, *mesh, src, rng()).redistribute(dst);
    EXPECT_EQ(b.dtype(), DType::I64);
    EXPECT_TRUE(pieces_match(b, global));
  }
}

// Bit for bit: same shape, dtype and bytes (equal() calls -0.0 and 0.0 equal).
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& expected) {
  const Tensor a = got.contiguous();
  const Tensor b = expected.contiguous();
  if (a.shape() == b.shape() && a.dtype() == b.dtype() &&
      std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << "\nexpected " << expected;
}

// Floating values whose k-th parts do not add back exactly (so a divide-by-k partition would show),
// with -0.0 at every seventh element; small integers for the other dtypes.
Tensor zero_fill_data(const Shape& shape, DType dtype, uint64_t seed) {
  if (!is_floating(dtype)) return testing::int_valued(shape, seed, dtype);
  std::vector<double> v = randn(shape, seed, DType::F64).to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 7) v[i] = -0.0;
  return from_vector(v, shape).to(dtype);
}

// S(d) -> P(sum) places each rank's chunk at its offset in a piece of the dim's full length whose
// other elements are the additive identity (Note [Redistribute steps]): no collective, and the sum
// over the mesh dim is the global tensor bit for bit, for uneven and empty chunks and nested
// sharding, under both planners. (S(0),S(0)) -> (P(sum),S(0)) does communicate: the inner chunks
// it needs are cut from the outer piece's full length, not from the rank's own rows.
TEST(Redistribute, ShardToPartialSumIsAnExactZeroFill) {
  World world = testing::test_world(64);
  struct Case {
    std::vector<int64_t> mesh;
    Placements from, to;
    bool local = true;  // no collective
  };
  const std::vector<Case> cases = {
      {{3}, {Shard{0}}, {Partial{}}},
      {{4}, {Shard{1}}, {Partial{}}},
      {{2, 3}, {Shard{0}, Shard{1}}, {Partial{}, Partial{}}},
      {{2, 3}, {Shard{0}, Shard{0}}, {Partial{}, Partial{}}},
      {{2, 3}, {Shard{0}, Shard{0}}, {Shard{0}, Partial{}}},
      {{2, 3}, {Shard{0}, Shard{0}}, {Partial{}, Shard{0}}, false},
      {{2, 3}, {Shard{1}, Replicate{}}, {Partial{}, Shard{1}}},
      {{2, 3}, {Shard{1}, Partial{ReduceOp::Max}}, {Partial{}, Partial{ReduceOp::Max}}},
      {{2, 2, 2}, {Shard{0}, Shard{1}, Shard{0}}, {Partial{}, Shard{1}, Partial{}}},
  };
  const std::vector<Shape> shapes = {{5, 3}, {7, 6}, {2, 9}, {0, 4}, {1, 1}};
  uint64_t seed = 0;
  for (const Case& c : cases) {
    auto mesh = testing::try_mesh(world, c.mesh);
    if (!mesh) continue;
    for (const Shape& shape : shapes) {
      for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        for (RedistributePlanner planner :
             {RedistributePlanner::Greedy, RedistributePlanner::MinCost}) {
          SCOPED_TRACE(fmt::format("{} -> {} {} {} on {} ({})", to_string(c.from), to_string(c.to),
                                   shape_str(shape), dtype, mesh->to_string(),
                                   planner_name(planner)));
          const Tensor global = zero_fill_data(shape, dtype, ++seed);
          const DTensor a = testing::make_dtensor(global, *mesh, c.from, seed);
          const RedistributePlan plan =
              plan_redistribute(a.spec(), a.spec().with_placements(c.to), planner);
          EXPECT_TRUE(std::any_of(plan.steps.begin(), plan.steps.end(), [](const auto& step) {
            return step.kind == StepKind::LocalZeroFill;
          })) << plan;
          if (c.local) {
            for (const RedistributeStep& step : plan.steps) {
              EXPECT_TRUE(step.kind == StepKind::LocalZeroFill || step.kind == StepKind::LocalChunk)
                  << plan;
            }
            EXPECT_EQ(plan.cost_us, 0.0) << plan;
          }
          const std::size_t calls = trace().num_events();
          const DTensor b = a.redistribute(c.to, planner);
          if (c.local) EXPECT_EQ(trace().num_events(), calls) << "a collective ran: " << plan;
          EXPECT_TRUE(same_bits(b.full_tensor(), global));
        }
      }
    }
  }
}

// The pieces themselves on a 1-D mesh: rank r holds chunk r at its offset, -0.0 (integers: 0)
// elsewhere; an empty chunk gives a piece of identities only.
TEST(Redistribute, ShardToPartialSumPiecesAreChunksInIdentities) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {4});
  if (!mesh) GTEST_SKIP() << "world too small";
  for (DType dtype : {DType::F32, DType::I32}) {
    const Tensor global = zero_fill_data({5, 2}, dtype, 3);  // rows 2 | 2 | 1 | 0
    const DTensor p = distribute_tensor(global, *mesh, {Shard{0}}).redistribute({Partial{}});
    for (int r : p.local().ranks()) {
      const int64_t size = shard_size(5, 4, r);
      const int64_t offset = shard_offset(5, 4, r);
      Tensor expected = full({5, 2}, is_floating(dtype) ? -0.0 : 0.0, dtype);
      expected.narrow(0, offset, size).copy_(global.narrow(0, offset, size));
      EXPECT_TRUE(same_bits(p.to_local().shard(r), expected)) << "rank " << r << " " << dtype;
    }
  }
}

// Sub-meshes and flattened meshes: every sibling group redistributes its own copy.
TEST(Redistribute, SubMeshesAndFlattenedMeshes) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  Tensor global = testing::int_valued({7, 3}, 8);
  for (const DeviceMesh& m : {mesh["tp"], mesh["dp"], mesh.flatten()}) {
    SCOPED_TRACE(m.to_string());
    DTensor x = distribute_tensor(global, m, {Shard{0}});
    EXPECT_TRUE(pieces_match(x, global));
    EXPECT_TRUE(pieces_match(x.redistribute({Shard{1}}), global));
    EXPECT_TRUE(pieces_match(x.redistribute({Partial{}}).redistribute({Shard{0}}), global, 1e-5));
    EXPECT_TRUE(equal(x.full_tensor(), global));
  }
}

// The cost model reads the world's topology: a mesh dim spanning hosts uses the inter-host
// link (from code or JSON).
TEST(RedistributePlan, CostsFollowTheWorldTopology) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  World w = world;
  DeviceMesh mesh = init_device_mesh(w, {2, 4}, {"dp", "tp"});
  DTensorSpec from(mesh, {Shard{0}, Replicate{}}, {1024, 1024}, DType::F32);
  DTensorSpec to = from.with_placements({Replicate{}, Replicate{}});
  const double one_host = plan_redistribute(from, to).cost_us;
  w.set_topology(std::make_shared<Topology>(Topology::from_json(R"({"devices_per_host": 4})")));
  const RedistributePlan two_hosts = plan_redistribute(from, to);
  w.set_topology(nullptr);
  ASSERT_EQ(two_hosts.steps.size(), 1u);
  // dp groups {0, 4}, ... span the two hosts: 0.22x the bandwidth, 2.7 us per hop.
  const double bytes = 1024.0 * 1024 * 4;
  const double expected = 6.6 + 2.7 + bytes / (1 << 30) * 0.5 / (87.7 * 0.22) * 1e6;
  EXPECT_NEAR(two_hosts.cost_us, expected, 1e-6);
  EXPECT_GT(two_hosts.cost_us, 3 * one_host);
}

// ---- shard sizes (notes §4.1) -------------------------------------------------------------

TEST(UnevenSharding, TorchChunkVectors) {
  struct Case {
    int64_t size, ranks;
    std::vector<std::pair<int64_t, int64_t>> expected;  // (size, offset) per rank
  };
  const std::vector<Case> cases = {
      {5, 4, {{2, 0}, {2, 2}, {1, 4}, {0, 5}}},
      {10, 4, {{3, 0}, {3, 3}, {3, 6}, {1, 9}}},
      {9, 4, {{3, 0}, {3, 3}, {3, 6}, {0, 9}}},
      {3, 4, {{1, 0}, {1, 1}, {1, 2}, {0, 3}}},
  };
  for (const Case& c : cases) {
    for (int64_t r = 0; r < c.ranks; ++r) {
      EXPECT_EQ(shard_size(c.size, c.ranks, r), c.expected[static_cast<size_t>(r)].first)
          << c.size << "/" << c.ranks << " rank " << r;
      EXPECT_EQ(shard_offset(c.size, c.ranks, r), c.expected[static_cast<size_t>(r)].second)
          << c.size << "/" << c.ranks << " rank " << r;
    }
  }
  // Agrees with Tensor::chunk (torch.chunk) wherever chunk returns a piece.
  for (int64_t n = 0; n <= 13; ++n) {
    for (int64_t k = 1; k <= 6; ++k) {
      std::vector<Tensor> chunks = arange(n).chunk(k);
      for (int64_t r = 0; r < k; ++r) {
        const int64_t want =
            r < static_cast<int64_t>(chunks.size()) ? chunks[static_cast<size_t>(r)].numel() : 0;
        EXPECT_EQ(shard_size(n, k, r), want) << n << "/" << k << " rank " << r;
      }
    }
  }
}

TEST(UnevenSharding, NestedOuterMeshDimFirst) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  DTensorSpec spec(*mesh, {Shard{0}, Shard{0}}, {5}, DType::F32);
  // 5 rows: 3 | 2 over the outer dim, then 2 | 1 and 1 | 1: rows [0,2), [2,3), [3,4), [4,5).
  EXPECT_EQ(spec.local_shape({0, 0}), Shape{2});
  EXPECT_EQ(spec.local_offset({0, 1}), Shape{2});
  EXPECT_EQ(spec.local_shape({0, 1}), Shape{1});
  EXPECT_EQ(spec.local_offset({1, 0}), Shape{3});
  EXPECT_EQ(spec.local_offset({1, 1}), Shape{4});
  EXPECT_FALSE(spec.is_even());
  EXPECT_EQ(spec.padded_local_shape(), Shape{2});
}

// ---- plans ----------------------------------------------------------------------------------

TEST(RedistributePlan, PrintsStepsWithCollectiveBytesAndCost) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  DTensorSpec from(mesh, {Shard{0}, Shard{1}}, {8, 8}, DType::F32);
  RedistributePlan plan = plan_redistribute(from, from.with_placements({Shard{1}, Shard{0}}),
                                            RedistributePlanner::Greedy);
  ASSERT_EQ(plan.steps.size(), 3u);
  // Greedy: un-shard the inner dim (tensor dim 1's nesting changes), all_to_all the outer,
  // chunk the inner again.
  EXPECT_EQ(plan.steps[0].mesh_dim, 1);
  EXPECT_EQ(plan.steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(plan.steps[0].bytes, 8 * 4 * 4);  // gathered [4, 8] f32
  EXPECT_EQ(plan.steps[1].kind, StepKind::AllToAll);
  EXPECT_EQ(plan.steps[1].bytes, 4 * 8 * 4);
  EXPECT_EQ(plan.steps[2].kind, StepKind::LocalChunk);
  EXPECT_GT(plan.steps[0].cost_us, 6.6);
  EXPECT_EQ(plan.steps[2].cost_us, 0.0);
  EXPECT_NEAR(plan.cost_us, plan.steps[0].cost_us + plan.steps[1].cost_us, 1e-9);
  const std::string text = plan.to_string();
  for (const char* fragment :
       {"S(0),S(1) -> S(1),S(0)", "[8, 8] f32", "greedy", "3 steps", "mesh dim 1 (tp)",
        "all_gather", "all_to_all", "local chunk", "128 B"}) {
    EXPECT_NE(text.find(fragment), std::string::npos) << fragment << " not in\n" << text;
  }
}

// S(0) -> P(sum) is one local step (0 B, 0 us) under both planners; S(0) -> P(avg) still
// all-gathers, since a zero-fill towards avg would need k times the chunk, which is not exact.
TEST(RedistributePlan, ShardToPartialSumHasNoCollective) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  DTensorSpec from(mesh, {Replicate{}, Shard{0}}, {4096, 4096}, DType::F32);
  for (RedistributePlanner planner : {RedistributePlanner::Greedy, RedistributePlanner::MinCost}) {
    const RedistributePlan plan =
        plan_redistribute(from, from.with_placements({Replicate{}, Partial{}}), planner);
    ASSERT_EQ(plan.steps.size(), 1u) << plan;
    EXPECT_EQ(plan.steps[0].mesh_dim, 1);
    EXPECT_EQ(plan.steps[0].kind, StepKind::LocalZeroFill);
    EXPECT_EQ(plan.steps[0].bytes, 0);
    EXPECT_EQ(plan.cost_us, 0.0);
    EXPECT_NE(plan.to_string().find("S(0) -> P(sum) local zero-fill"), std::string::npos) << plan;
  }
  const RedistributePlan avg =
      plan_redistribute(from, from.with_placements({Replicate{}, Partial{ReduceOp::Avg}}));
  ASSERT_EQ(avg.steps.size(), 2u) << avg;
  EXPECT_EQ(avg.steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(avg.steps[1].kind, StepKind::LocalPartition);
}

TEST(RedistributePlan, CacheCountsHitsAndMisses) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  clear_redistribute_cache();
  DTensorSpec from(*mesh, {Shard{0}}, {6, 3}, DType::F32);
  DTensorSpec to = from.with_placements({Replicate{}});
  plan_redistribute(from, to);
  CacheStats s = redistribute_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.size, 1);
  plan_redistribute(DTensorSpec(from), DTensorSpec(to));  // equal specs, other objects
  plan_redistribute(from, to);
  s = redistribute_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 2);
  plan_redistribute(from, to, RedistributePlanner::MinCost);  // another key
  EXPECT_EQ(redistribute_cache_stats().misses, 2);
  // A new topology is another key: costs (and min-cost choices) depend on it.
  World w = world;
  auto topology = std::make_shared<Topology>();
  topology->devices_per_host = 1;
  w.set_topology(topology);
  plan_redistribute(from, to);
  EXPECT_EQ(redistribute_cache_stats().misses, 3);
  w.set_topology(nullptr);
  plan_redistribute(from, to);
  EXPECT_EQ(redistribute_cache_stats().misses, 3);
}

// Note [Greedy and min-cost planners], notes §5 item 8: the multi-dim Shard -> Shard
// (S(0), S(1)) -> (S(1), S(0)) of a [4096, 4096] f32 tensor on a (dp=2, tp=4) mesh. Greedy
// un-shards tp first (all_gather of a [2048, 4096] block, 32 MiB gathered), all_to_alls dp and
// chunks tp again: 461.0 us under the default topology. Min-cost all-gathers dp on a quarter of
// the data (16 MiB gathered), all_to_alls tp and chunks dp: 238.3 us.
TEST(RedistributePlan, MinCostBeatsGreedyOnMultiDimShardToShard) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  DTensorSpec from(mesh, {Shard{0}, Shard{1}}, {4096, 4096}, DType::F32);
  DTensorSpec to = from.with_placements({Shard{1}, Shard{0}});
  RedistributePlan greedy = plan_redistribute(from, to, RedistributePlanner::Greedy);
  RedistributePlan best = plan_redistribute(from, to, RedistributePlanner::MinCost);
  ASSERT_EQ(greedy.steps.size(), 3u) << greedy;
  EXPECT_EQ(greedy.steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(greedy.steps[0].mesh_dim, 1);
  EXPECT_EQ(greedy.steps[0].bytes, int64_t{32} << 20);
  ASSERT_EQ(best.steps.size(), 3u) << best;
  EXPECT_EQ(best.steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(best.steps[0].mesh_dim, 0);
  EXPECT_EQ(best.steps[0].bytes, int64_t{16} << 20);
  EXPECT_EQ(best.steps[1].kind, StepKind::AllToAll);
  EXPECT_NEAR(greedy.cost_us, 461.0, 0.1) << greedy;
  EXPECT_NEAR(best.cost_us, 238.3, 0.1) << best;
  // Both plans are correct, uneven shards included.
  for (const Shape& shape : {Shape{9, 6}, Shape{8, 8}, Shape{3, 5}}) {
    Tensor global = testing::int_valued(shape, 3);
    for (RedistributePlanner p : {RedistributePlanner::Greedy, RedistributePlanner::MinCost}) {
      DTensor x = distribute_tensor(global, mesh, {Shard{0}, Shard{1}});
      EXPECT_TRUE(pieces_match(x.redistribute({Shard{1}, Shard{0}}, p), global));
    }
  }
}

TEST(RedistributePlan, DefaultPlannerIsSelectable) {
  World world = testing::test_world(64);
  if (world.size() < 8) GTEST_SKIP() << "needs 8 ranks";
  DeviceMesh mesh = init_device_mesh(world, {2, 4});
  DTensorSpec from(mesh, {Shard{0}, Replicate{}}, {4096, 4096}, DType::F32);
  DTensorSpec to = from.with_placements({Replicate{}, Shard{0}});
  const RedistributePlanner saved = default_redistribute_planner();
  set_default_redistribute_planner(RedistributePlanner::MinCost);
  EXPECT_EQ(plan_redistribute(from, to).planner, RedistributePlanner::MinCost);
  const double min_cost = redistribute_cost(from, to);
  set_default_redistribute_planner(RedistributePlanner::Greedy);
  EXPECT_LT(min_cost, redistribute_cost(from, to));
  set_default_redistribute_planner(saved);
}

TEST(RedistributePlan, PartialsWithDifferentOpsReduceInnermostFirst) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor global = testing::int_valued({3, 4}, 5);
  const Placements src = {Partial{ReduceOp::Sum}, Partial{ReduceOp::Max}};
  for (RedistributePlanner p : {RedistributePlanner::Greedy, RedistributePlanner::MinCost}) {
    DTensor x = make_dtensor(global, *mesh, src, 17);
    DTensor y = x.redistribute({Replicate{}, Partial{ReduceOp::Max}}, p);
    EXPECT_TRUE(pieces_match(y, global)) << plan_redistribute(x.spec(), y.spec(), p);
    EXPECT_TRUE(pieces_match(x.redistribute({Shard{1}, Partial{ReduceOp::Max}}, p), global));
  }
}

TEST(RedistributePlan, CrossMeshIsAnError) {
  World world = testing::test_world(64);
  if (world.size() < 4) GTEST_SKIP() << "needs 4 ranks";
  DeviceMesh a = init_device_mesh(world, {4});
  DeviceMesh b = init_device_mesh(world, {2});
  expect_throws<PlacementError>(
      [&] {
        plan_redistribute(DTensorSpec(a, {Shard{0}}, {4}, DType::F32),
                          DTensorSpec(b, {Replicate{}}, {4}, DType::F32));
      },
      {"redistribute", "S(0)", "cross-mesh"});
}

// ---- from_local ---------------------------------------------------------------------------

TEST(FromLocal, InfersUnevenGlobalShape) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 3});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor global = testing::int_valued({7, 5}, 9);
  for (const Placements& p : std::vector<Placements>{{Shard{0}, Shard{1}},
                                                     {Shard{0}, Shard{0}},
                                                     {Replicate{}, Shard{1}},
                                                     {Partial{}, Replicate{}}}) {
    DTensor x = make_dtensor(global, *mesh, p, 3);
    DTensor y = DTensor::from_local(x.to_local(), *mesh, p);
    EXPECT_EQ(y.shape(), global.shape()) << to_string(p);
    EXPECT_TRUE(pieces_match(y, global)) << to_string(p);
    DTensor z = DTensor::from_local(x.to_local(), *mesh, p, global.shape());
    EXPECT_EQ(z.shape(), global.shape());
  }
}

TEST(FromLocal, RejectsPiecesThatDoNotFollowTorchChunk) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2});
  if (!mesh) GTEST_SKIP() << "world too small";
  // 1 + 2 rows: torch.chunk splits 3 rows as 2 | 1 (pytorch/pytorch#144109).
  LocalTensor local = LocalTensor::from_fn(std::vector<int>{0, 1}, [](int r) {
    return zeros({r == 0 ? 1 : 2, 4});
  });
  expect_throws<PlacementError>(
      [&] { DTensor::from_local(local, *mesh, {Shard{0}}); },
      {"from_local", "torch.chunk", "[0, 1]", "[1, 2]", "[2, 1]", "rank 0: [1, 4]"});
  expect_throws<PlacementError>(
      [&] {
        DTensor::from_local(local, *mesh, {Shard{0}}, Shape{3, 4});
      },
      {"from_local", "rank 0", "[1, 4]", "[2, 4]"});
  // Replicated pieces must agree in shape.
  expect_throws<PlacementError>([&] { DTensor::from_local(local, *mesh, {Replicate{}}); },
                                {"from_local", "differs between ranks"});
  expect_throws<PlacementError>([&] { DTensor::from_local(local, *mesh, {Shard{2}}); },
                                {"DTensor::from_local", "S(2)", "2-d tensor"});
}

TEST(DistributeTensor, SharesBuffersOfReplicatedPieces) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 4});
  if (!mesh) GTEST_SKIP() << "world too small";
  Tensor global = testing::int_valued({6, 4}, 2);
  DTensor x = distribute_tensor(global, *mesh, {Shard{0}, Replicate{}});
  EXPECT_TRUE(pieces_match(x, global));
  const LocalTensor& local = x.to_local();
  if (local.num_shards() == 8) {
    EXPECT_EQ(local.bytes_held(), global.nbytes());  // two blocks, each held once
    EXPECT_TRUE(local.shard(0).is_same(local.shard(3)));
  }
  // The DTensor does not alias the caller's tensor.
  Tensor copy = global.clone();
  global.fill_(100.0);
  EXPECT_TRUE(equal(x.full_tensor(), copy));
}

TEST(DistributeTensor, VisualizeSharding) {
  World world = testing::test_world(64);
  auto mesh = testing::try_mesh(world, {2, 2});
  if (!mesh) GTEST_SKIP() << "world too small";
  DTensor x = distribute_tensor(zeros({5, 4}), *mesh, {Shard{0}, Partial{}});
  const std::string text = visualize_sharding(x);
  for (const char* fragment :
       {"[5, 4]", "S(0),P(sum)", "0,1 (P)", "2,3 (P)", "each block is the sum of its ranks'"}) {
    EXPECT_NE(text.find(fragment), std::string::npos) << fragment << " not in\n" << text;
  }
}

}  // namespace
}  // namespace spmd
