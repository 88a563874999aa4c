// The check modes of --spmd-debug (Note [Check modes]): each catches its planted bug, with a
// message naming the op, the ranks and the index, and stays silent on a correct program.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/debug/checks.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/ops/ops.h>
#include <spmd/runtime/launch.h>
#include <spmd/sim/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

// The sharding and plan caches keep the specs of past ops, so their meshes and worlds, alive.
void drop_cached_worlds() {
  clear_sharding_cache();
  clear_redistribute_cache();
}

World debug_world(int size, DebugOptions debug) {
  World world = World::sim(size);
  set_debug(world, debug);
  return world;
}

// ---- planted bugs ------------------------------------------------------------------------------

// Shape and dtype of the input: the meta of the one-input test ops below.
OpMeta same_meta(std::span<const InputMeta> in, const OpArgs&) {
  return OpMeta{*in[0].shape, in[0].dtype};
}

// Keeps the input's placements: the strategy of the test ops below.
std::vector<OpStrategy> keep_placements(ShardingInputs in, const OpArgs&, const OpMeta&) {
  return std::vector<OpStrategy>{{{in[0]->placements()}, in[0]->placements()}};
}

// x + (global row index), written for even shards: a piece's first row is taken as coordinate *
// its own row count, which is wrong once the trailing pieces are short.
const OpDef kAddRowIndex{
    "add_row_index", same_meta,
    [](std::span<const Tensor> in, const OpArgs&, const OpMeta&) {
      const int64_t rows = in[0].size(0);
      return in[0] + arange(rows).reshape({rows, 1});
    },
    keep_placements,
    [](std::span<const Tensor> pieces, const OpArgs&, const PieceContext& where) {
      const Tensor& piece = pieces[0];
      const int64_t rows = piece.size(0);
      const double first = static_cast<double>(where.coordinate[0] * rows);
      return piece + (arange(rows) + first).reshape({rows, 1});
    }};

// The mean of a row-sharded vector as the mean of the local means (P(avg)): right only when every
// piece has the same length (pytorch/pytorch#162692).
const OpDef kNaiveMean{
    "naive_mean",
    [](std::span<const InputMeta> in, const OpArgs&) {
      return OpMeta{{}, in[0].dtype};
    },
    [](std::span<const Tensor> in, const OpArgs&, const OpMeta&) { return mean(in[0]); },
    [](ShardingInputs, const OpArgs&, const OpMeta&) {
      return std::vector<OpStrategy>{{{{Shard{0}}}, {Partial{ReduceOp::Avg}}}};
    },
    [](std::span<const Tensor> pieces, const OpArgs&, const PieceContext&) {
      return pieces[0].numel() == 0 ? zeros({}) : mean(pieces[0]);
    }};

// A user op that writes the rank into a value it claims is replicated.
const OpDef kRankStamp{
    "rank_stamp", same_meta,
    [](std::span<const Tensor> in, const OpArgs&, const OpMeta&) { return in[0]; }, keep_placements,
    [](std::span<const Tensor> pieces, const OpArgs&, const PieceContext& where) {
      Tensor out = pieces[0].clone();
      if (where.rank == 3) out.narrow(0, 1, 1).fill_(7.0);
      return out;
    }};

// sqrt computed on the pieces without a LocalTensor op, so only the DTensor observer sees its
// NaN.
const OpDef kMapSqrt{
    "map_sqrt", same_meta,
    [](std::span<const Tensor> in, const OpArgs&, const OpMeta&) { return sqrt(in[0]); },
    keep_placements};

Tensor rows_of(int64_t rows, int64_t cols) {
  return (arange(rows * cols) + 1.0).reshape({rows, cols});
}

// A correct program with uneven shards, Partials and redistributions.
Tensor correct_program(const World& world) {
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  DTensor x = distribute_tensor(rows_of(5, 3), mesh, {Shard{0}, Replicate{}});
  DTensor w = distribute_tensor(rows_of(3, 5) / 10.0, mesh, {Replicate{}, Shard{1}});
  DTensor y = matmul(x, w);
  DTensor z = softmax(relu(y) - 1.0, 1);
  DTensor s = sum(z * 2.0, {0});
  DTensor m = mean(x);
  DTensor t = transpose(y, 0, 1).redistribute({Shard{1}, Shard{0}});
  return s.full_tensor() + m.full_tensor() + sum(t).full_tensor();
}

// ---- check
// ----------------------------------------------------------------------------------------

TEST(CheckMode, CatchesAnOpThatAssumesEvenShards) {
  World world = debug_world(4, {.check = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor even = distribute_tensor(rows_of(8, 2), mesh, {Shard{0}});
  EXPECT_NO_THROW(dispatch(kAddRowIndex, {even}));  // correct on even shards
  DTensor uneven = distribute_tensor(rows_of(5, 2), mesh, {Shard{0}});
  const std::string message = expect_throws<DivergenceError>(
      [&] { dispatch(kAddRowIndex, {uneven}); },
      {"--spmd-debug=check: DTensor op 'add_row_index' differs from the same op on the full "
       "tensors: max error 2 at index [4, 0] (sharded 11, single-device 13; 2 of 10 elements off, "
       "tolerance 1e-05 + 0.0001 * |expected|); that element is held by rank(s) 2",
       "input 0: S(0) [5, 2] f32; output: S(0) [5, 2] f32"});
  EXPECT_NE(message.find("mesh DeviceMesh((tp=4)"), std::string::npos) << message;
}

TEST(CheckMode, CatchesAMeanOfUnevenShards) {
  World world = debug_world(4, {.check = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor even = distribute_tensor(arange(8), mesh, {Shard{0}});
  EXPECT_NO_THROW(dispatch(kNaiveMean, {even}));
  DTensor uneven = distribute_tensor(arange(10), mesh, {Shard{0}});  // 3, 3, 3, 1
  expect_throws<DivergenceError>([&] { dispatch(kNaiveMean, {uneven}); },
                                 {"DTensor op 'naive_mean'", "at index []", "single-device 4.5",
                                  "output: P(avg) [] f32", "held by rank(s) 0-3"});
}

TEST(CheckMode, SilentOnACorrectProgramAndLeavesTheTraceAlone) {
  auto run = [](DebugOptions debug) {
    World world = debug_world(4, debug);
    trace().clear();
    Tensor result = correct_program(world);
    std::vector<std::pair<std::string, uint64_t>> calls;
    for (const TraceRecord& r : trace().records()) calls.emplace_back(r.op, r.sequence);
    return std::make_pair(result, calls);
  };
  auto plain = run({});
  auto checked = run({.check = true, .replicate = true, .nan = true});
  EXPECT_TRUE(equal(plain.first, checked.first));
  EXPECT_FALSE(plain.second.empty());
  EXPECT_EQ(plain.second, checked.second);  // no extra collective, same sequence numbers
}

TEST(CheckMode, AssemblesPartialAndNestedPlacements) {
  World world = World::sim(8);
  DeviceMesh mesh = init_device_mesh(world, {2, 2, 2});
  Tensor global = rows_of(7, 3);
  for (const Placements& p : {Placements{Shard{0}, Shard{0}, Replicate{}},
                              Placements{Partial{ReduceOp::Sum}, Shard{1}, Partial{ReduceOp::Max}},
                              Placements{Replicate{}, Partial{ReduceOp::Avg}, Shard{0}}}) {
    DTensor x = distribute_tensor(global, mesh, p);
    EXPECT_TRUE(equal(assemble_full_tensor(x), x.full_tensor())) << to_string(p);
  }
}

TEST(CheckMode, RefusedWhereTheProcessDoesNotHoldEveryRank) {
  auto state = std::make_shared<WorldState>(World::sim(4).state());
  state->held_ranks = {1};
  state->backend_name = "mpi";
  World world(state);
  expect_throws<ConfigError>([&] { set_debug(world, {.check = true}); },
                             {"--spmd-debug=check", "the sim backend", "holds rank(s) 1"});
  EXPECT_NO_THROW(set_debug(world, {.fingerprint = true, .nan = true}));
}

TEST(CheckMode, ObserversLeaveWithTheLastWorld) {
  drop_cached_worlds();
  {
    World world = debug_world(2, {.check = true});
    EXPECT_TRUE(has_op_observers());
  }
  EXPECT_FALSE(has_op_observers());
  World world = debug_world(2, {.nan = true});
  set_debug(world, {});
  EXPECT_FALSE(has_op_observers());
}

// ---- replicate
// --------------------------------------------------------------------------------------

TEST(ReplicateMode, CatchesAReplicaThatDiverged) {
  World world = debug_world(4, {.replicate = true});
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  DTensor r = distribute_tensor(rows_of(2, 2), mesh, {Shard{0}, Replicate{}});
  LocalTensor pieces = r.to_local();
  pieces.mutable_shard(3).fill_(0.0);
  DTensor bad(pieces, r.spec_ptr());
  expect_throws<DivergenceError>(
      [&] { (void)(bad + 1.0); },
      {"--spmd-debug=replicate: input 0 of DTensor op 'add' is Replicate on mesh dim 1 ('tp') but "
       "its replicas differ: rank 2 holds 3 and rank 3 holds 0 at index [0, 0] of the piece "
       "(group ranks [2, 3]; S(0),R [2, 2] f32;",
       "they diverged before this op"});
}

TEST(ReplicateMode, CatchesAnOpWhoseOutputReplicasDiffer) {
  World world = debug_world(4, {.replicate = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor r = distribute_tensor(rows_of(3, 2), mesh, {Replicate{}});
  expect_throws<DivergenceError>(
      [&] { dispatch(kRankStamp, {r}); },
      {"the output of DTensor op 'rank_stamp' is Replicate on mesh dim 0 ('tp') but its replicas "
       "differ: rank 0 holds 3 and rank 3 holds 7 at index [1, 0] of the piece (group ranks [0, "
       "1, 2, 3]"});
}

TEST(ReplicateMode, SilentOnACorrectProgram) {
  World world = debug_world(4, {.replicate = true});
  EXPECT_NO_THROW(correct_program(world));
}

// ---- nan
// ---------------------------------------------------------------------------------------------

TEST(NanMode, CatchesANanOnOneRankInALocalOp) {
  World world = debug_world(4, {.nan = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  Tensor values = rows_of(8, 2);
  values.narrow(0, 5, 1).fill_(-1.0);  // row 5: rank 2's second row
  DTensor x = distribute_tensor(values, mesh, {Shard{0}});
  expect_throws<NonFiniteError>(
      [&] { (void)log(x.to_local()); },
      {"--spmd-debug=nan: LocalTensor op 'log' produced NaN on rank 2 at index [1, 0] (shape "
       "[2, 2]); its inputs were finite on rank 2"});
}

TEST(NanMode, CatchesANanOnOneRankInADTensorOp) {
  World world = debug_world(4, {.nan = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  Tensor values = rows_of(8, 2);
  values.narrow(0, 5, 1).fill_(-1.0);
  DTensor x = distribute_tensor(values, mesh, {Shard{0}});
  expect_throws<NonFiniteError>(
      [&] { (void)log(x); },
      {"--spmd-debug=nan: DTensor op 'log' produced NaN on rank 2 at index [1, 0] of its piece "
       "(global index [5, 0]); its inputs were finite on rank 2; output S(0) [8, 2] f32"});
}

TEST(NanMode, CatchesANanInAUserOpThroughTheDTensorObserver) {
  World world = debug_world(4, {.nan = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  Tensor values = rows_of(8, 2);
  values.narrow(0, 5, 1).fill_(-1.0);
  DTensor x = distribute_tensor(values, mesh, {Shard{0}});
  expect_throws<NonFiniteError>(
      [&] { dispatch(kMapSqrt, {x}); },
      {"--spmd-debug=nan: DTensor op 'map_sqrt' produced NaN on rank 2 at index [1, 0] of its "
       "piece (global index [5, 0]); its inputs were finite on rank 2; output S(0) [8, 2] f32"});
}

TEST(NanMode, CatchesACollectiveThatProducesInf) {
  World world = debug_world(4, {.nan = true});
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  LocalTensor big = LocalTensor::from_fn(
      world, [](int r) { return full({3}, r == 3 ? 60000.0 : 1.0, DType::F16); });
  EXPECT_NO_THROW(all_reduce(big, mesh, "dp"));  // 60000 + 1 fits in f16
  LocalTensor twice =
      LocalTensor::from_fn(world, [](int) { return full({3}, 60000.0, DType::F16); });
  expect_throws<NonFiniteError>([&] { all_reduce(twice, mesh, "tp"); },
                                {"--spmd-debug=nan: all_reduce over mesh dim 'tp' at "
                                 "checks_test.cpp:",
                                 "produced Inf on rank 0 at index [0] (shape [3]); every input "
                                 "this process holds was finite (an overflow in the reduction"});
  LocalTensor inf = LocalTensor::from_fn(world, [](int r) {
    return full({2}, r == 1 ? std::numeric_limits<double>::infinity() : 1.0);
  });
  expect_throws<NonFiniteError>(
      [&] { all_gather(inf, mesh, "dp", 0); },
      {"all_gather over mesh dim 'dp'", "the input of rank 1 already held Inf at index [0]"});
}

TEST(NanMode, NamesAnInputThatAlreadyHeldNan) {
  World world = debug_world(2, {.nan = true});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return full({2}, r == 1 ? std::numeric_limits<double>::quiet_NaN() : 1.0);
  });
  expect_throws<NonFiniteError>([&] { (void)(x * 2.0); },
                                {"LocalTensor op 'mul' produced NaN on rank 1 at index [0]",
                                 "input 0 already held NaN on "
                                 "rank 1 at index [0]"});
}

TEST(NanMode, SilentOnACorrectProgramAndOffByDefault) {
  World checked = debug_world(4, {.nan = true});
  EXPECT_NO_THROW(correct_program(checked));
  World plain = World::sim(4);
  LocalTensor x = LocalTensor::from_fn(plain, [](int r) { return full({2}, r - 1.0); });
  // A world with nan on turns on the LocalTensor hook for the process: drop every one first.
  checked = World();
  drop_cached_worlds();
  EXPECT_NO_THROW(log(x));
}

}  // namespace
}  // namespace spmd
