// FSDP's float8 all-gather (Note [Float8 all-gather] in spmd/nn/parallel.h): weights cast on their
// shard with their global amax and gathered in float8 give float8_matmul's values and gradients of
// gathering the wider weights, to the bit; the gathers (forward and the backward's regathers) move
// f8e4m3fn, the gradients are reduced in the policy's reduce_dtype and never in float8, all the
// amaxes take as many collectives as one, no_sync accumulates, and bad inputs are errors. Under
// sim, threads and mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <spmd/collectives/trace.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/nn/parallel.h>
#include <spmd/ops/ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

Tensor weight(int64_t rows, int64_t cols, uint64_t seed) {
  return randn({rows, cols}, seed, DType::F32) * (1.0 / std::sqrt(static_cast<double>(rows)));
}

// Records the collectives while it lives, under sim (one process's trace has every rank's).
class SimTrace {
 public:
  explicit SimTrace(const World& world)
      : sim_(world.held_ranks().size() == 8), trace_(trace()), was_enabled_(trace_.enabled()) {
    if (sim_) {
      trace_.set_enabled(true);
      trace_.clear();
    }
  }
  ~SimTrace() { trace_.set_enabled(was_enabled_); }
  SimTrace(const SimTrace&) = delete;
  SimTrace& operator=(const SimTrace&) = delete;
  bool sim() const { return sim_; }
  size_t events() const { return trace_.num_events(); }
  const Trace& get() const { return trace_; }

 private:
  bool sim_;
  Trace& trace_;
  bool was_enabled_;
};

// "op dim dtype" of rank 0's collectives from event `start` on (sim: the trace has every rank).
std::vector<std::string> rank0_collectives(const Trace& t, size_t start) {
  std::vector<std::string> out;
  size_t seen = 0;
  for (const TraceRecord& r : t.records()) {
    if (r.rank != 0 || seen++ < start) continue;
    out.push_back(r.op + " " + r.dim_name + " " + r.dtype);
  }
  return out;
}

int count_of(const std::vector<std::string>& v, const std::string& s) {
  return static_cast<int>(std::count(v.begin(), v.end(), s));
}

int count_prefix(const std::vector<std::string>& v, const std::string& prefix) {
  return static_cast<int>(std::count_if(
      v.begin(), v.end(), [&](const std::string& c) { return c.starts_with(prefix); }));
}

struct Result {
  Tensor y, grad_x;
  std::vector<Tensor> grads;  // full, in the weights' dtype
  std::vector<DType> grad_dtypes;
  std::vector<std::string> forward, backward;  // rank 0's collectives (sim only)
};

// A colwise -> tanh -> rowwise block on (dp=2, tp=4), FSDP over dp, F32 master weights, x
// [8, 16] split over dp: the linears are float8_matmul of weights gathered wide (fsdp_unshard) or
// in float8 (fsdp_unshard_float8 with float8_amaxes).
Result block(const World& world, bool float8_gather, const MixedPrecisionPolicy& policy,
             DType x_dtype) {
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const Tensor w1_full = weight(16, 32, 21);
  const Tensor w2_full = weight(32, 16, 22);
  DTensor w1 = distribute_tensor(
      w1_full, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w1_full.shape(), mesh, "dp"));
  DTensor w2 = distribute_tensor(
      w2_full, mesh, fsdp_placements(rowwise_placements(mesh, "tp"), w2_full.shape(), mesh, "dp"));
  w1.requires_grad_();
  w2.requires_grad_();
  DTensor x =
      distribute_tensor(randn({8, 16}, 23, DType::F32).to(x_dtype), mesh, {Shard{0}, Replicate{}});
  x.requires_grad_();
  const SimTrace t(world);
  DTensor y;
  if (float8_gather) {
    const DTensor* params[] = {&w1, &w2};
    const std::vector<DTensor> amax = float8_amaxes(params);
    const Float8Weight g1 = fsdp_unshard_float8(w1, "dp", amax[0], policy);
    const DTensor a = tanh(float8_matmul(x, g1));
    const Float8Weight g2 = fsdp_unshard_float8(w2, "dp", amax[1], policy);
    y = float8_matmul(a, g2).redistribute({Shard{0}, Replicate{}});
  } else {
    const DTensor a = tanh(float8_matmul(x, fsdp_unshard(w1, "dp", policy)));
    y = float8_matmul(a, fsdp_unshard(w2, "dp", policy)).redistribute({Shard{0}, Replicate{}});
  }
  Result r;
  if (t.sim()) r.forward = rank0_collectives(t.get(), 0);
  backward(sum(to(y, DType::F32) * to(y, DType::F32)));
  if (t.sim()) {
    const std::vector<std::string> all = rank0_collectives(t.get(), 0);
    r.backward.assign(all.begin() + static_cast<std::ptrdiff_t>(r.forward.size()), all.end());
  }
  r.y = y.full_tensor();
  r.grad_x = x.grad().full_tensor();
  for (const DTensor* w : {&w1, &w2}) {
    r.grads.push_back(w->grad().full_tensor());
    r.grad_dtypes.push_back(w->grad().dtype());
  }
  return r;
}

SPMD_TEST(Float8AllGather, GivesTheValuesAndGradientsOfGatheringWideWeights) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const Result wide = block(world, false, {}, DType::F32);
  const Result narrow = block(world, true, {}, DType::F32);
  // The cast is elementwise with the whole weight's amax: the same float8 values either way.
  EXPECT_TRUE(allclose(narrow.y, wide.y, 0.0, 0.0));
  EXPECT_TRUE(allclose(narrow.grad_x, wide.grad_x, 0.0, 0.0));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(allclose(narrow.grads[i], wide.grads[i], 0.0, 0.0)) << i;
    EXPECT_EQ(narrow.grad_dtypes[i], DType::F32);
  }
  // And one device's FP8 training within the tp sums' reordering.
  Tensor w1 = weight(16, 32, 21);
  Tensor w2 = weight(32, 16, 22);
  Tensor x = randn({8, 16}, 23, DType::F32);
  for (Tensor* p : {&w1, &w2, &x}) p->requires_grad_();
  const Tensor y = float8_matmul(tanh(float8_matmul(x, w1)), w2);
  backward(sum(y * y));
  EXPECT_TRUE(allclose(narrow.y, y, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(narrow.grad_x, x.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(allclose(narrow.grads[0], w1.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(allclose(narrow.grads[1], w2.grad(), 1e-4, 1e-5));
  if (world.held_ranks().size() != 8) return;  // the trace: sim
  // The forward gathers float8, the wide run f32; each backward gathers again what float8_mm
  // saved (reshard_after_forward) in the same dtype, and reduce-scatters the f32 gradients.
  EXPECT_EQ(count_of(narrow.forward, "all_gather dp f8e4m3fn"), 2);
  EXPECT_EQ(count_prefix(narrow.forward, "all_gather dp"), 2);
  EXPECT_EQ(count_of(wide.forward, "all_gather dp f32"), 2);
  EXPECT_EQ(count_of(narrow.backward, "all_gather dp f8e4m3fn"), 2);
  EXPECT_EQ(count_prefix(narrow.backward, "all_gather dp"), 2);
  EXPECT_EQ(count_of(narrow.backward, "reduce_scatter dp f32"), 2);
  EXPECT_EQ(count_prefix(narrow.backward, "reduce_scatter dp"), 2);
}

SPMD_TEST(Float8AllGather, GradientsAreReducedInReduceDtypeNeverInFloat8) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const MixedPrecisionPolicy bf16{DType::BF16, std::nullopt, std::nullopt};
  const MixedPrecisionPolicy f32_reduce{DType::BF16, DType::F32, std::nullopt};
  const Result as_arrives = block(world, true, bf16, DType::BF16);
  const Result wider = block(world, true, f32_reduce, DType::BF16);
  for (const Result* r : {&as_arrives, &wider}) {
    for (DType d : r->grad_dtypes) EXPECT_EQ(d, DType::F32);  // the master weights'
    EXPECT_EQ(r->y.dtype(), DType::BF16);
  }
  // The same float8 forward; the reductions' rounding differs.
  EXPECT_TRUE(allclose(as_arrives.y, wider.y, 0.0, 0.0));
  if (world.held_ranks().size() != 8) return;
  for (const Result* r : {&as_arrives, &wider}) {
    for (const std::string& c : r->backward) {
      if (c.find("f8e") != std::string::npos) EXPECT_TRUE(c.starts_with("all_gather")) << c;
    }
  }
  EXPECT_EQ(count_of(as_arrives.backward, "reduce_scatter dp bf16"), 2);
  EXPECT_EQ(count_of(wider.backward, "reduce_scatter dp f32"), 2);
}

SPMD_TEST(Float8AllGather, AllTheAmaxesTakeTheCollectivesOfOne) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  std::vector<Tensor> full;
  std::vector<DTensor> params;
  for (uint64_t i = 0; i < 4; ++i) {
    full.push_back(weight(16, 32, 30 + i) * static_cast<double>(i + 1));
    params.push_back(distribute_tensor(
        full.back(), mesh,
        fsdp_placements(colwise_placements(mesh, "tp"), full.back().shape(), mesh, "dp")));
  }
  size_t after_one = 0, after_all = 0;
  std::vector<DTensor> single, amaxes;
  const bool sim = world.held_ranks().size() == 8;
  {
    const SimTrace t(world);
    const DTensor* one[] = {&params[0]};
    single = float8_amaxes(one);
    after_one = t.events();
    const DTensor* all[] = {&params[0], &params[1], &params[2], &params[3]};
    amaxes = float8_amaxes(all);
    after_all = t.events();
  }
  ASSERT_EQ(amaxes.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(amaxes[i].dtype(), DType::F32);
    EXPECT_TRUE(amaxes[i].shape().empty());
    for (const Placement& p : amaxes[i].placements()) EXPECT_TRUE(is_replicate(p));
    EXPECT_EQ(amaxes[i].full_tensor().item<float>(), amax(abs(full[i])).item<float>()) << i;
  }
  EXPECT_EQ(single[0].full_tensor().item<float>(), amaxes[0].full_tensor().item<float>());
  if (sim) {
    EXPECT_GT(after_one, 0u);
    EXPECT_EQ(after_all - after_one, after_one);
  }
}

SPMD_TEST(Float8AllGather, AccumulationWithoutSyncReducesOnce) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const Tensor w_full = weight(16, 32, 41);
  auto param = [&] {
    DTensor w = distribute_tensor(
        w_full, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w_full.shape(), mesh, "dp"));
    w.requires_grad_();
    return w;
  };
  auto loss_of = [&](const DTensor& w, const DTensor& amax, uint64_t seed) {
    const DTensor x =
        distribute_tensor(randn({8, 16}, seed, DType::F32), mesh, {Shard{0}, Replicate{}});
    const DTensor y = float8_matmul(x, fsdp_unshard_float8(w, "dp", amax));
    return sum(y * y);
  };
  DTensor together = param();
  const DTensor* tp[] = {&together};
  const DTensor amax = float8_amaxes(tp).front();
  backward(loss_of(together, amax, 1) + loss_of(together, amax, 2));
  DTensor apart = param();
  const SimTrace t(world);
  {
    const auto guard = no_sync();
    backward(loss_of(apart, amax, 1));
  }
  const std::vector<std::string> unsynced = rank0_collectives(t.get(), 0);
  // An undefined amax: fsdp_unshard_float8 reduces the parameter's own.
  backward(loss_of(apart, DTensor(), 2));
  const std::vector<std::string> all = rank0_collectives(t.get(), 0);
  EXPECT_TRUE(allclose(apart.grad().full_tensor(), together.grad().full_tensor(), 1e-5, 1e-6));
  EXPECT_EQ(apart.grad().dtype(), DType::F32);
  if (!t.sim()) return;
  // Rank 0's reduce_scatters: none under no_sync, one for both microbatches after.
  EXPECT_EQ(count_prefix(unsynced, "reduce_scatter"), 0);
  EXPECT_EQ(count_prefix(all, "reduce_scatter"), 1);
}

SPMD_TEST(Float8AllGather, BadInputsAreErrors) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  const DTensor w = distribute_tensor(randn({8, 4}, 1), mesh, {Shard{0}});
  const DTensor* params[] = {&w};
  const DTensor amax = float8_amaxes(params).front();
  const DTensor ints = distribute_tensor(arange(32, DType::I64).reshape({8, 4}), mesh, {Shard{0}});
  expect_throws<Unsupported>([&] { (void)fsdp_unshard_float8(ints, "dp", amax); },
                             {"fsdp_unshard_float8: the parameter is [8, 4] i64 on mesh",
                              "FP8 training casts f32, f64, bf16 or f16 weights"});
  const DTensor* int_params[] = {&w, &ints};
  expect_throws<Unsupported>([&] { (void)float8_amaxes(int_params); },
                             {"float8_amaxes: parameter 1 is [8, 4] i64 on mesh"});
  // The amax must be reduced (float8_amax's pending max is not), 0-d, f32.
  const DTensor pending = float8_amax(dtensor_var(w)).value<DTensor>();
  expect_throws<Unsupported>(
      [&] { (void)fsdp_unshard_float8(w, "dp", pending); },
      {"fsdp_unshard_float8: the amax must be a 0-d f32 DTensor replicated on the parameter's mesh",
       "(parameter [8, 4])"});
  expect_throws<Unsupported>([&] { (void)fsdp_unshard_float8(w, "dp", to(amax, DType::F64)); },
                             {"fsdp_unshard_float8: the amax must be", "f64"});
  const DTensor x = distribute_tensor(randn({2, 8}, 2), mesh, {Replicate{}});
  const Float8Weight gathered = fsdp_unshard_float8(w, "dp", amax);
  EXPECT_EQ(gathered.data.dtype(), DType::F8E4M3FN);
  expect_throws<PlacementError>(
      [&] {
        (void)float8_matmul(x, Float8Weight{gathered.data, DTensor()});
      },
      {"float8_matmul: the Float8Weight's amax is undefined (x [2, 8])"});
  // A wide weight where the float8 one goes.
  expect_throws<Unsupported>(
      [&] {
        (void)float8_matmul(x, Float8Weight{w, amax});
      },
      {"float8_matmul: takes x in f32, f64, bf16 or f16 and w already cast to float8"});
  // float8_mm's format for b must be b's dtype.
  const Var x_var = dtensor_var(x);
  expect_throws<Unsupported>(
      [&] {
        (void)apply(
            op::float8_mm,
            {x_var, dtensor_var(gathered.data), float8_amax(x_var), dtensor_var(amax)},
            {{static_cast<int64_t>(DType::F8E4M3FN), static_cast<int64_t>(DType::F8E5M2), 0}, {}});
      },
      {"float8_mm: b is already float8 ([8, 4] f8e4m3fn), but its format is given as DType("});
}

// On one device: float8_matmul of a weight cast already (float8_cast with its amax) is
// float8_matmul of the wide weight, forward and x's gradient, to the bit; the float8 weight's
// gradient is in x's dtype.
TEST(Float8Cast, APreCastWeightIsTheWideWeightsCast) {
  Tensor x = randn({6, 16}, 51, DType::F32);
  const Tensor w = weight(16, 8, 52);
  const Var amax = float8_amax(Var(w));
  const Tensor w8 = float8_cast(Var(w), amax).value<Tensor>();
  EXPECT_EQ(w8.dtype(), DType::F8E4M3FN);
  x.requires_grad_();
  const Tensor y_wide = float8_matmul(x, w);
  backward(sum(y_wide * y_wide));
  const Tensor gx_wide = x.grad();
  Tensor x2 = x.detach();
  x2.requires_grad_();
  const Tensor y8 = float8_matmul(Var(x2), Var(w8), amax).value<Tensor>();
  backward(sum(y8 * y8));
  EXPECT_TRUE(allclose(y8, y_wide, 0.0, 0.0));
  EXPECT_TRUE(allclose(x2.grad(), gx_wide, 0.0, 0.0));
  expect_throws<Unsupported>([&] { (void)float8_cast(Var(w8), amax); },
                             {"float8_cast: casts an f32, f64, bf16 or f16 tensor to f8e4m3fn or "
                              "f8e5m2, got [16, 8] f8e4m3fn to f8e4m3fn"});
  expect_throws<Unsupported>([&] { (void)float8_cast(Var(w), Var(w)); },
                             {"float8_cast: the amax must be a 0-d f32 tensor, got [16, 8] f32"});
}

}  // namespace
}  // namespace spmd
