// The check modes of --spmd-debug (Note [Check modes]): each catches its planted bug, with a
// message naming the op, the ranks and the index, and stays silent on a correct program.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/debug/checks.h>
#include <spmd/debug/value_dump.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/ops/ops.h>
#include <spmd/runtime/launch.h>
#include <spmd/tensor/random.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/spmd_types.h>
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
      {"--spmd-debug=check: DTensor op 'add_row_index' at checks_test.cpp:",
       "differs from the same op on the full "
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

// FP8 training with rank-local scales (Note [Float8 training]) computes each dp rank's rows with
// that rank's own amax: no full-tensor op equals it, so its entry says split_dependent and the
// check leaves it alone; the same entry without that flag is reported.
TEST(CheckMode, SkipsAnOpWhoseResultDependsOnTheSplit) {
  World world = debug_world(4, {.check = true});
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"dp"});
  Tensor x = randn({8, 16}, 1, DType::F64);
  x.narrow(0, 0, 2).copy_(x.narrow(0, 0, 2) * 0.01);  // rank 0's amax is far below the batch's
  const DTensor dx = distribute_tensor(x, mesh, {Shard{0}});
  const DTensor dw = distribute_tensor(randn({16, 4}, 2, DType::F64), mesh, {Replicate{}});
  EXPECT_NO_THROW(float8_matmul(dx, dw, Float8Options{.rank_local_dims = {"dp"}}));
  EXPECT_NO_THROW(float8_matmul(dx, dw));  // global scales: checked, and equal
  OpDef unflagged = op::float8_mm;
  unflagged.split_dependent = nullptr;
  const DTensor amax_x = float8_amax(to_var(dx)).value<DTensor>();
  const DTensor amax_w = float8_amax(to_var(dw)).value<DTensor>();
  const int64_t e4m3 = static_cast<int64_t>(DType::F8E4M3FN);
  expect_throws<DivergenceError>(
      [&] {
        dispatch(unflagged, {dx, dw, amax_x, amax_w}, {{e4m3, e4m3, 1}, {}});
      },
      {"DTensor op 'float8_mm'", "differs from the same op on the full tensors",
       "input 2: P(max) [] f32"});
}

// A BF16 sum pending over dp cast to F32 (a master weight's gradient under a mixed-precision
// policy) sums its pieces in F32, the full tensor in BF16 first: the check compares at BF16's
// tolerance, the loosest dtype the value went through. F32 all the way keeps F32's.
TEST(CheckMode, ACastOfAPendingSumIsCheckedAtItsNarrowestDtype) {
  World world = debug_world(8, {.check = true});
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  const LocalTensor pieces = LocalTensor::from_fn(world, [](int r) {
    return randn({64, 64}, 100 + static_cast<uint64_t>(r), DType::BF16);
  });
  const DTensor pending = DTensor::from_local(pieces, mesh, {Partial{}});
  const DTensor wide = to(pending, DType::F32);  // no report
  EXPECT_EQ(wide.dtype(), DType::F32);
  EXPECT_EQ(wide.placements(), (Placements{Partial{}}));
  // What the check accepts: the two sums differ beyond F32's tolerance (1e-5 + 1e-4 |x|).
  Tensor in_bf16 = pieces.shard(0);
  Tensor in_f32 = pieces.shard(0).to(DType::F32);
  for (int r = 1; r < 8; ++r) {
    in_bf16 = in_bf16 + pieces.shard(r);
    in_f32 = in_f32 + pieces.shard(r).to(DType::F32);
  }
  EXPECT_FALSE(allclose(in_f32, in_bf16.to(DType::F32), 1e-4, 1e-5));
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

TEST(CheckMode, RefusedWhereItWouldGatherEveryPieceOntoEveryGpu) {
  auto state = std::make_shared<WorldState>(World::sim(4).state());
  state->held_ranks = {1};
  state->backend_name = "nccl";
  state->device_type = "cuda";
  World world(state);
  expect_throws<ConfigError>([&] { set_debug(world, {.check = true}); },
                             {"--spmd-debug=check", "every GPU", "fingerprint,nan"});
  EXPECT_NO_THROW(set_debug(world, {.fingerprint = true, .nan = true}));
  // A CPU process holding one rank gathers (threads, mpi); one holding several does not.
  state->device_type = "cpu";
  state->backend_name = "mpi";
  EXPECT_NO_THROW(set_debug(world, {.check = true}));
  set_debug(world, {});
  state->held_ranks = {1, 2};
  expect_throws<ConfigError>([&] { set_debug(world, {.replicate = true}); },
                             {"--spmd-debug=replicate", "one rank per process", "rank(s) 1,2"});
  expect_throws<ConfigError>([&] { set_debug(world, {.all = true}); }, {"resolved"});
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
      {"--spmd-debug=replicate: input 0 of DTensor op 'add' at checks_test.cpp:",
       "is Replicate on mesh dim 1 ('tp') but its replicas differ: rank 2 holds 3 and rank 3 holds "
       "0 at index [0, 0] of the piece "
       "(group ranks [2, 3]; S(0),R [2, 2] f32;",
       "they diverged before this op"});
}

TEST(ReplicateMode, CatchesAnOpWhoseOutputReplicasDiffer) {
  World world = debug_world(4, {.replicate = true});
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor r = distribute_tensor(rows_of(3, 2), mesh, {Replicate{}});
  expect_throws<DivergenceError>(
      [&] { dispatch(kRankStamp, {r}); },
      {"the output of DTensor op 'rank_stamp' at checks_test.cpp:",
       "is Replicate on mesh dim 0 ('tp') but its replicas "
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
  expect_throws<NonFiniteError>([&] { (void)log(x.to_local()); },
                                {"--spmd-debug=nan: LocalTensor op 'log' at checks_test.cpp:",
                                 "produced NaN on rank 2 at index [1, 0] (shape "
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
      {"--spmd-debug=nan: DTensor op 'log' at checks_test.cpp:",
       "produced NaN on rank 2 at index [1, 0] of its piece "
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
      {"--spmd-debug=nan: DTensor op 'map_sqrt' at checks_test.cpp:",
       "produced NaN on rank 2 at index [1, 0] of its "
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
  expect_throws<NonFiniteError>(
      [&] { (void)(x * 2.0); },
      {"LocalTensor op 'mul' at checks_test.cpp:", "produced NaN on rank 1 at index [0]",
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

// ---- root causes first (Note [Check modes])
// ------------------------------------------------------

TEST(CheckMode, NamesTheInputWhoseReplicasDifferBeforeTheOp) {
  World world = debug_world(4, {.check = true});
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  DTensor w = distribute_tensor(rows_of(4, 4), mesh, {Replicate{}, Shard{1}});
  LocalTensor pieces = w.to_local();
  pieces.mutable_shard(2).fill_(0.0);  // rank 2's replica of dp coordinate 1
  w = DTensor(pieces, w.spec_ptr());
  DTensor x = distribute_tensor(rows_of(2, 4), mesh, {Shard{0}, Replicate{}});
  const int line = __LINE__ + 1;
  const std::string message = expect_throws<DivergenceError>([&] { (void)matmul(x, w); });
  EXPECT_NE(message.find(fmt::format("--spmd-debug=check: input 1 of DTensor op 'matmul' at "
                                     "checks_test.cpp:{} is Replicate on mesh dim 0 ('dp')",
                                     line)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 0 holds 1 and rank 2 holds 0"), std::string::npos) << message;
}

TEST(ReplicateMode, FromLocalChecksAReplicateClaimAtItsLine) {
  World world = debug_world(4, {.replicate = true});
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  // Each tp rank's partial sum (its own number) claimed Replicate over tp. Made from the rank list:
  // untyped, like data read in, so only the data check can see the claim (a typed LocalTensor is a
  // TypeError at from_local whatever the flags, below).
  LocalTensor partial =
      LocalTensor::from_fn(world.held_ranks(), [](int r) { return full({3}, r % 2 + 1.0); });
  const int line = __LINE__ + 2;
  const std::string message = expect_throws<DivergenceError>([&] {
    (void)DTensor::from_local(partial, mesh, {Replicate{}, Replicate{}});
  });
  EXPECT_NE(message.find(fmt::format("--spmd-debug=replicate: DTensor::from_local at "
                                     "checks_test.cpp:{} claims Replicate on mesh dim 1 ('tp')",
                                     line)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("say Partial()"), std::string::npos) << message;
  // The true claims pass: Partial over tp, Shard over tp, Replicate over dp (equal there).
  DTensor p = DTensor::from_local(partial, mesh, {Replicate{}, Partial{}});
  EXPECT_TRUE(equal(p.full_tensor(), full({3}, 3.0)));
  EXPECT_NO_THROW((void)DTensor::from_local(partial, mesh, {Replicate{}, Shard{0}}));
  // Without the mode the false claim goes through (the bug the mode exists for).
  World plain = World::sim(4);
  DeviceMesh plain_mesh = init_device_mesh(plain, {2, 2}, {"dp", "tp"});
  LocalTensor plain_partial =
      LocalTensor::from_fn(plain.held_ranks(), [](int r) { return full({3}, r % 2 + 1.0); });
  EXPECT_NO_THROW((void)DTensor::from_local(plain_partial, plain_mesh, {Replicate{}, Replicate{}}));
  // Typed (from_fn over the world: V), the same claim is certain to be wrong, and always reported.
  LocalTensor typed = LocalTensor::from_fn(plain, [](int r) { return full({3}, r % 2 + 1.0); });
  expect_throws<TypeError>(
      [&] {
        (void)DTensor::from_local(typed, plain_mesh, {Replicate{}, Replicate{}});
      },
      {"DTensor::from_local", "along mesh axis 'dp' the LocalTensor is V (from_fn at",
       "placement R claims identical pieces"});
}

// ---- nan:allow-inf ---------------------------------------------------------------------------

TEST(NanMode, AllowInfAcceptsACausalMaskButNotNan) {
  drop_cached_worlds();
  World world = debug_world(2, {.nan = true, .allow_inf = true});
  DeviceMesh mesh = init_device_mesh(world, {2}, {"tp"});
  // scores + mask, mask = -inf above the diagonal: softmax of each row is finite.
  Tensor mask = zeros({4, 4});
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = i + 1; j < 4; ++j) mask.narrow(0, i, 1).narrow(1, j, 1).fill_(-INFINITY);
  }
  DTensor scores = distribute_tensor(rows_of(4, 4), mesh, {Shard{0}});
  DTensor masked = scores + distribute_tensor(mask, mesh, {Shard{0}});
  DTensor probs = softmax(masked, 1);
  EXPECT_TRUE(allclose(sum(probs, {1}).full_tensor(), ones({4})));
  LocalTensor local = masked.to_local();
  EXPECT_NO_THROW((void)(local * 2.0));
  // NaN is still reported, at its line.
  const int line = __LINE__ + 1;
  const std::string message = expect_throws<NonFiniteError>([&] { (void)(masked - masked); });
  EXPECT_NE(message.find(fmt::format("DTensor op 'sub' at checks_test.cpp:{} produced NaN", line)),
            std::string::npos)
      << message;
  // Strict nan names the -inf, with the flag that accepts it.
  World strict = debug_world(2, {.nan = true});
  DeviceMesh strict_mesh = init_device_mesh(strict, {2}, {"tp"});
  DTensor s = distribute_tensor(rows_of(4, 4), strict_mesh, {Shard{0}});
  const DTensor strict_mask = distribute_tensor(mask, strict_mesh, {Shard{0}});
  expect_throws<NonFiniteError>([&] { (void)(s + strict_mask); },
                                {"produced -Inf", "--spmd-debug=nan:allow-inf"});
  // While a strict world lives, the LocalTensor hook (which has no world) reports infinities.
  expect_throws<NonFiniteError>([&] { (void)(local * 2.0); }, {"LocalTensor op 'mul' at"});
}

// ---- check and replicate under threads (pieces gathered by internal collectives) --------------

std::vector<RankOutcome> run_threads(int size, DebugOptions debug,
                                     const std::function<int(World&)>& program) {
  LaunchOptions options;
  options.backend = "threads";
  options.world_size = size;
  options.debug = debug;
  return run_rank_threads(options, program);
}

std::string error_of(const RankOutcome& o) {
  return o.error ? error_text(o.error) : std::string("no error");
}

TEST(ThreadsChecks, CorrectProgramPassesAndLeavesTheTraceAlone) {
  trace().clear();
  for (const RankOutcome& o : run_threads(4, {}, [](World& w) {
         correct_program(w);
         return 0;
       })) {
    ASSERT_FALSE(o.error) << error_of(o);
  }
  const size_t plain = trace().records().size();
  trace().clear();
  std::vector<Tensor> results(4);
  for (const RankOutcome& o :
       run_threads(4, {.check = true, .replicate = true, .nan = true}, [&](World& w) {
         results[static_cast<size_t>(w.held_ranks()[0])] = correct_program(w);
         return 0;
       })) {
    ASSERT_FALSE(o.error) << error_of(o);
  }
  EXPECT_EQ(trace().records().size(), plain);  // the gathers are not traced
  World sim = World::sim(4);
  for (const Tensor& r : results) EXPECT_TRUE(equal(r, correct_program(sim)));
  drop_cached_worlds();
}

TEST(ThreadsChecks, CheckCatchesAnUnevenShardBugOnEveryRank) {
  const int line = __LINE__ + 4;
  std::vector<RankOutcome> outcomes = run_threads(4, {.check = true}, [](World& w) {
    DeviceMesh mesh = init_device_mesh(w, {4}, {"tp"});
    DTensor uneven = distribute_tensor(rows_of(5, 2), mesh, {Shard{0}});
    (void)dispatch(kAddRowIndex, {uneven});
    return 0;
  });
  for (const RankOutcome& o : outcomes) {
    const std::string text = error_of(o);
    EXPECT_NE(text.find(fmt::format("DivergenceError: --spmd-debug=check: DTensor op "
                                    "'add_row_index' at checks_test.cpp:{} differs",
                                    line)),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("max error 2 at index [4, 0]"), std::string::npos) << text;
  }
  drop_cached_worlds();
}

TEST(ThreadsChecks, ReplicateCatchesAClaimAndADivergedReplica) {
  std::atomic<int> line{0};
  std::vector<RankOutcome> outcomes = run_threads(4, {.replicate = true}, [&line](World& w) {
    DeviceMesh mesh = init_device_mesh(w, {2, 2}, {"dp", "tp"});
    LocalTensor partial =
        LocalTensor::from_fn(w.held_ranks(), [](int r) { return full({3}, r % 2 + 1.0); });
    line.store(__LINE__ + 1);  // the same value on every rank thread
    (void)DTensor::from_local(partial, mesh, {Replicate{}, Replicate{}});
    return 0;
  });
  for (const RankOutcome& o : outcomes) {
    const std::string text = error_of(o);
    EXPECT_NE(text.find(fmt::format("DTensor::from_local at checks_test.cpp:{} claims Replicate "
                                    "on mesh dim 1 ('tp') but the pieces differ: rank 0 holds 1 "
                                    "and rank 1 holds 2",
                                    line.load())),
              std::string::npos)
        << text;
  }
  outcomes = run_threads(4, {.replicate = true}, [](World& w) {
    DeviceMesh mesh = init_device_mesh(w, {2, 2}, {"dp", "tp"});
    DTensor r = distribute_tensor(rows_of(2, 2), mesh, {Replicate{}, Replicate{}});
    if (w.held_ranks()[0] == 3) {
      LocalTensor pieces = r.to_local();
      pieces.mutable_shard(3).fill_(7.0);
      r = DTensor(pieces, r.spec_ptr());
    }
    (void)(r * 2.0);
    return 0;
  });
  for (const RankOutcome& o : outcomes) {
    EXPECT_NE(error_of(o).find("input 0 of DTensor op 'mul' at checks_test.cpp:"),
              std::string::npos)
        << error_of(o);
  }
  drop_cached_worlds();
}

TEST(ThreadsChecks, DivergenceIsRefusedOutsideSim) {
  expect_throws<ConfigError>(
      [] { run_threads(2, {.divergence = true}, [](World&) { return 0; }); },
      {"--spmd-debug=divergence", "sim backend's check", "DeadlockError under threads"});
}

// ---- divergence: the shadow run (Note [Shadow run]) -------------------------------------------

struct Launched {
  int code;
  std::string out;
  std::string err;
};

Launched launch_with(std::vector<std::string> flags, const std::function<void(World&)>& program) {
  std::vector<std::string> args{"checks_test"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = launch(argc, argv.data(), program);
  Launched out{code, ::testing::internal::GetCapturedStdout(),
               ::testing::internal::GetCapturedStderr()};
  drop_cached_worlds();
  return out;
}

TEST(ShadowRun, CoordinatorOnlyCollectiveIsReportedAtItsLine) {
  static int line = 0;
  auto program = [](World& w) {
    DeviceMesh mesh = init_device_mesh(w, {w.size()}, {"dp"});
    LocalTensor x = LocalTensor::from_fn(w, [](int r) { return full({2}, r); });
    x = all_reduce(x, mesh, "dp");
    if (w.is_coordinator()) {
      line = __LINE__ + 1;
      (void)all_gather(x, mesh, "dp");
      fmt::print("coordinator\n");
    }
    x = all_reduce(reinterpret(x, {{"dp", SpmdType::V}}), mesh, "dp");
  };
  Launched plain = launch_with({"--spmd-world-size=4"}, program);
  EXPECT_EQ(plain.code, 0) << plain.err;  // the bug sim cannot see by itself
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=divergence"}, program);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(fmt::format("DivergenceError: --spmd-debug=divergence: all_gather over "
                                   "mesh dim 'dp' at checks_test.cpp:{} is collective #1 of the "
                                   "coordinator (rank 0), but the other ranks issue all_reduce "
                                   "over mesh dim 'dp' at checks_test.cpp:",
                                   line)),
            std::string::npos)
      << r.err;
  // The shadow pass printed nothing; the real pass stopped at the collective, before its print.
  EXPECT_EQ(r.out.find("coordinator"), std::string::npos) << r.out;
}

TEST(ShadowRun, CollectivesOnlyOtherRanksIssueAndTheirFailures) {
  static int line = 0;
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=all"}, [](World& w) {
    DeviceMesh mesh = init_device_mesh(w, {w.size()}, {"dp"});
    LocalTensor x = LocalTensor::from_fn(w, [](int r) { return full({2}, r); });
    line = __LINE__ + 1;
    if (!w.is_coordinator()) x = all_reduce(x, mesh, "dp");
  });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(fmt::format("all_reduce over mesh dim 'dp' at checks_test.cpp:{} is "
                                   "collective #0 of the ranks other than the coordinator, but "
                                   "the coordinator (rank 0) issues no more collectives",
                                   line)),
            std::string::npos)
      << r.err;
  r = launch_with({"--spmd-world-size=4", "--spmd-debug=divergence"}, [](World& w) {
    if (!w.is_coordinator()) throw_error<ConfigError>("no config file on this rank");
  });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("run as a rank other than the coordinator, the program fails where the "
                       "coordinator does not (on a cluster every rank but 0 would): ConfigError: "
                       "no config file on this rank"),
            std::string::npos)
      << r.err;
}

TEST(ShadowRun, CorrectProgramPassesWithItsOutputOnce) {
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=all"}, [](World& w) {
    const Tensor t = correct_program(w);
    if (w.is_coordinator()) fmt::print("result {}\n", sum(t).item<double>());
    fmt::print("every rank\n");
  });
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("result"), r.out.rfind("result")) << r.out;
  EXPECT_EQ(r.out.find("every rank"), r.out.rfind("every rank")) << r.out;
  EXPECT_NE(r.out.find("result"), std::string::npos) << r.out;
}

TEST(DebugAll, ResolvesToTheChecksOfTheBackend) {
  DebugOptions seen;
  Launched r =
      launch_with({"--spmd-world-size=2", "--spmd-debug=all"}, [&](World& w) { seen = w.debug(); });
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(seen.to_string(), "check,replicate,nan:allow-inf,divergence,types,parity");
  r = launch_with({"--spmd-world-size=2", "--spmd-debug=all,nan", "--spmd-backend=threads"},
                  [&](World& w) {
                    if (w.is_coordinator()) seen = w.debug();
                  });
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(seen.to_string(), "check,replicate,nan,types");
  EXPECT_EQ(parse_debug_options("nan:allow-inf").to_string(), "nan:allow-inf");
  EXPECT_EQ(parse_debug_options("types").to_string(), "types");
  EXPECT_EQ(parse_debug_options("parity,nan").to_string(), "nan,parity");
  expect_throws<ConfigError>([] { parse_debug_options("nan:allow-nan"); },
                             {"unknown debug check 'nan:allow-nan'", "all,"});
}

// ---- parity (Note [Parity run] in debug/parity.h) -----------------------------------------------

// A data-parallel step whose loss is a Partial of per-rank sums over the global row count: right on
// every mesh. With `bug`, each rank's piece is its local mean (dp times too large).
void dp_loss(World& world, bool bug, std::vector<bool>* reference_seen = nullptr) {
  if (reference_seen != nullptr) reference_seen->push_back(world.state().parity_reference);
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  const DTensor x = distribute_tensor(randn({8, 4}, 1, DType::F64), mesh, {Shard{0}});
  const DTensor y = x * 3.0;
  const LocalTensor sq = y.to_local() * y.to_local();
  const LocalTensor piece = bug ? mean(sq) : sum(sq) * (1.0 / 32.0);
  const DTensor loss = DTensor::from_local(piece, mesh, {Partial{}});
  fmt::print("loss {}\n", loss.full_tensor().item<double>());
}

TEST(DebugParity, RunsTheProgramOnOneRankFirstAndAgrees) {
  std::vector<bool> seen;
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                           [&](World& w) { dp_loss(w, false, &seen); });
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));
  // Only the real run prints; the summary names what was compared.
  EXPECT_EQ(r.out.find("loss"), r.out.rfind("loss")) << r.out;
  EXPECT_NE(r.err.find("spmd: parity: 3 DTensors compared with the one-rank run at 3 call sites"),
            std::string::npos)
      << r.err;
}

TEST(DebugParity, NamesTheLineWhereTheValuesDepart) {
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                           [&](World& w) { dp_loss(w, true); });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ParityError: --spmd-debug=parity: 'from_local' at checks_test.cpp:"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("differ by 3 of the tensor's largest"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("The last site that still agreed: 'mul' at checks_test.cpp:"),
            std::string::npos)
      << r.err;
  // A looser tolerance accepts it (4 x the mean against the mean: a difference of 3).
  r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity", "--spmd-parity-tol=3.5"},
                  [&](World& w) { dp_loss(w, true); });
  EXPECT_EQ(r.code, 0) << r.err;
  expect_throws<ConfigError>(
      [] {
        int argc = 2;
        char name[] = "p";
        char flag[] = "--spmd-parity-tol=-1";
        char* argv[] = {name, flag, nullptr};
        (void)parse_launch_options(argc, argv);
      },
      {"--spmd-parity-tol=-1", "positive relative difference"});
}

// A program that cannot run on one rank: an error when parity is asked for, a note under `all`.
TEST(DebugParity, ProgramsThatNeedMoreThanOneRank) {
  auto stages = [](World& w) {
    const DeviceMesh mesh = init_device_mesh(w, {2, w.size() / 2}, {"dp", "tp"});
    const DTensor x = distribute_tensor(ones({4}), mesh, {Replicate{}, Shard{0}});
    (void)(x * 2.0);
    const Tensor second = mesh.rank_table().select(0, 1);  // the ranks of the second dp replica
    (void)second;
  };
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"}, stages);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ConfigError: --spmd-debug=parity: the program cannot run on one rank"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("select: index 1 is out of range for dim 0 of size 1 (shape [1, 1]) (after "
                       "its DTensor op 'mul' at checks_test.cpp:"),
            std::string::npos)
      << r.err;
  r = launch_with({"--spmd-world-size=4", "--spmd-debug=all"}, stages);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("the other checks of --spmd-debug=all go on"), std::string::npos) << r.err;
}

// A pipeline's stages: pp keeps its size in the one-rank run, one rank per stage (stage meshes made
// from the pp mesh's rank table), so every stage's DTensors are compared. The bug is stage 1's.
void two_stages(World& world, bool bug, std::vector<size_t>* held = nullptr) {
  if (held != nullptr) held->push_back(world.held_ranks().size());
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"pp", "dp"});
  const Tensor table = mesh.rank_table();
  for (int64_t p = 0; p < 2; ++p) {
    const DeviceMesh stage = DeviceMesh::from_ranks(world, table.select(0, p).contiguous(), {"dp"});
    const DTensor x = distribute_tensor(randn({8, 4}, 1 + static_cast<uint64_t>(p), DType::F64),
                                        stage, {Shard{0}});
    const LocalTensor sq = x.to_local() * x.to_local();
    const LocalTensor piece = bug && p == 1 ? mean(sq) : sum(sq) * (1.0 / 32.0);
    const DTensor loss = DTensor::from_local(piece, stage, {Partial{}});  // STAGE LOSS
    (void)loss.full_tensor();
  }
}

TEST(DebugParity, PipelineStagesKeepPpAndAreCompared) {
  std::vector<size_t> held;
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                           [&](World& w) { two_stages(w, false, &held); });
  ASSERT_EQ(r.code, 0) << r.err;
  // The reference starts on rank 0, learns that pp has 2 ranks and starts again on two.
  EXPECT_EQ(held, (std::vector<size_t>{1, 2, 4}));
  EXPECT_NE(r.err.find("spmd: parity: 4 DTensors compared with the one-rank run at 2 call sites"),
            std::string::npos)
      << r.err;
  r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                  [&](World& w) { two_stages(w, true); });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ParityError: --spmd-debug=parity: 'from_local' at checks_test.cpp:"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(occurrence 2)"), std::string::npos) << r.err;  // stage 1's
  EXPECT_NE(r.err.find("on DeviceMesh((dp=2)"), std::string::npos) << r.err;
}

// Local code whose collective needs its dim's real size (a permute with one entry per ep rank):
// the one-rank run keeps ep, and a bug along dp is still found.
void local_permute(World& world, bool bug) {
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "ep"});
  const DTensor x = distribute_tensor(randn({8, 4}, 1, DType::F64), mesh, {Shard{0}, Replicate{}});
  std::vector<int> swap(static_cast<size_t>(world.size() / 2));  // ep's size as local code knows it
  for (size_t i = 0; i < swap.size(); ++i) swap[i] = static_cast<int>(swap.size() - 1 - i);
  const LocalTensor swapped = permute(x.local(), mesh, "ep", swap);  // replicas over ep
  const LocalTensor sq = swapped * swapped;
  const LocalTensor piece = bug ? mean(sq) : sum(sq) * (1.0 / 32.0);
  (void)DTensor::from_local(piece, mesh, {Partial{}, Replicate{}}).full_tensor();
}

TEST(DebugParity, LocalCollectivesKeepTheirDim) {
  Launched r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                           [&](World& w) { local_permute(w, false); });
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("kept at their size in the one-rank run: 'ep' (permute at checks_test.cpp:"),
            std::string::npos)
      << r.err;
  r = launch_with({"--spmd-world-size=4", "--spmd-debug=parity"},
                  [&](World& w) { local_permute(w, true); });
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ParityError: --spmd-debug=parity: 'from_local' at checks_test.cpp:"),
            std::string::npos)
      << r.err;
}

TEST(DebugParity, SimOnlyAndNotInADryRun) {
  Launched r = launch_with({"--spmd-world-size=2", "--spmd-debug=parity", "--spmd-backend=threads"},
                           [](World&) {});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("parity: the run on one rank is the sim backend's check"), std::string::npos)
      << r.err;
  r = launch_with({"--spmd-world-size=2", "--spmd-debug=parity", "--spmd-tensors=meta"},
                  [](World&) {});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("compares values, and a dry run"), std::string::npos) << r.err;
}

// ---- value dumps (Note [Value dumps] in debug/value_dump.h) ------------------------------------

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "spmd_values_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// The same program dumped under sim on 4 ranks, under threads on 4 ranks and on 1 rank: the
// assembled values agree (Partial pieces summed, replicas written once); a planted bug departs at
// its line.
TEST(ValueDump, RunsOnEveryBackendAgreeAndABugDeparts) {
  const std::string sim = fresh_dir("sim");
  const std::string threads = fresh_dir("threads");
  const std::string one = fresh_dir("one");
  const std::string bad = fresh_dir("bad");
  auto program = [](bool bug) {
    return [bug](World& w) {
      const DeviceMesh mesh = init_device_mesh(w, {2, w.size() / 2}, {"dp", "tp"});
      const DTensor x = distribute_tensor(randn({8, 6}, 1, DType::F64), mesh, {Shard{0}, Shard{1}});
      const DTensor r = x.redistribute({Replicate{}, Shard{1}});
      const DTensor s = sum(r * 2.0, {1});  // Partial over tp
      DTensor::from_local(bug ? s.to_local() * 1.5 : s.to_local(), mesh, s.placements());
    };
  };
  ASSERT_EQ(launch_with({"--spmd-world-size=4", "--spmd-dump-values=" + sim}, program(false)).code,
            0);
  ASSERT_EQ(launch_with(
                {"--spmd-world-size=4", "--spmd-backend=threads", "--spmd-dump-values=" + threads},
                program(false))
                .code,
            0);
  ASSERT_EQ(launch_with({"--spmd-world-size=2", "--spmd-dump-values=" + one},
                        [&](World& w) {
                          const DeviceMesh mesh = init_device_mesh(w, {1, 1}, {"dp", "tp"});
                          (void)mesh;
                        })
                .code,
            0);
  ASSERT_EQ(launch_with({"--spmd-world-size=4", "--spmd-dump-values=" + bad}, program(true)).code,
            0);
  const std::vector<DumpedValue> a = read_value_dump(sim);
  const std::vector<DumpedValue> b = read_value_dump(threads);
  ASSERT_EQ(a.size(), 4u);  // redistribute, mul, sum, from_local
  EXPECT_EQ(a[0].op, "redistribute");
  EXPECT_EQ(a[2].op, "sum");
  EXPECT_EQ(a[2].value.placements, "R,P(sum)");
  // sum over the columns of 2x: the assembled Partial is the full row sum.
  const Tensor rows = sum(randn({8, 6}, 1, DType::F64) * 2.0, {1});
  EXPECT_TRUE(allclose(from_vector(a[2].value.values, {8}).to(DType::F64), rows, 1e-12, 1e-12));
  DumpComparison c = compare_value_dumps(b, a);
  EXPECT_TRUE(c.departure.empty()) << c.departure;
  EXPECT_EQ(c.compared, 4u);
  c = compare_value_dumps(read_value_dump(bad), a);
  EXPECT_NE(c.departure.find("'from_local' at checks_test.cpp:"), std::string::npos) << c.departure;
  EXPECT_NE(c.departure.find("The last site that still agreed: 'sum' at checks_test.cpp:"),
            std::string::npos)
      << c.departure;
  // A program without DTensors writes an empty dump (a file per rank).
  EXPECT_TRUE(read_value_dump(one).empty());
  EXPECT_TRUE(std::filesystem::exists(one + "/values.rank1.jsonl"));
  expect_throws<ConfigError>([&] { (void)read_value_dump(one + "/missing"); }, {"not a folder"});
  std::filesystem::create_directories(one + "/empty");
  expect_throws<ConfigError>([&] { (void)read_value_dump(one + "/empty"); },
                             {"holds no values.rank"});
  {
    std::ofstream broken(bad + "/values.rank9.jsonl");
    broken << "{\"seq\": 1}\n";
  }
  expect_throws<ConfigError>([&] { (void)read_value_dump(bad); },
                             {"values.rank9.jsonl:1: not a value record"});
}

}  // namespace
}  // namespace spmd
