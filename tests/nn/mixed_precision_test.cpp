// The mixed-precision policy of the parallel styles (Note [Mixed precision] in spmd/nn/parallel.h):
// F32 master weights under FSDP + TP computing in BF16, their gradients against an F64 reference
// of the same BF16 values (closer with reduce_dtype F32 than with the reductions in BF16), the
// gradient reductions in reduce_dtype in the trace (the FSDP reduce_scatter and the tp all_reduce
// PyTorch's policy leaves in the compute dtype), a default policy bit for bit the plain styles,
// and bad policies; under sim, threads and mpirun.
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

struct Run {
  std::vector<Tensor> grads;  // full, in their stored dtype
  std::vector<DType> grad_dtypes;
  std::vector<std::string> collectives;  // "op dim dtype" of the backward, rank 0's (sim only)
  std::vector<std::string> forward;      // the same for the forward
};

Tensor weight(int64_t rows, int64_t cols, uint64_t seed) {
  return randn({rows, cols}, seed, DType::F32) * (1.0 / std::sqrt(static_cast<double>(rows)));
}

// Two blocks of colwise -> tanh -> rowwise on (dp=2, tp=4) with FSDP over dp, weights stored in
// F32, input in BF16. `policy` null: the styles without a policy (weights and input in F32).
Run two_blocks(const World& world, const MixedPrecisionPolicy* policy) {
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  std::vector<DTensor> w;
  for (int b = 0; b < 2; ++b) {
    const Tensor w1 = weight(16, 32, 10 + 2 * static_cast<uint64_t>(b));
    const Tensor w2 = weight(32, 16, 11 + 2 * static_cast<uint64_t>(b));
    w.push_back(distribute_tensor(
        w1, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w1.shape(), mesh, "dp")));
    w.push_back(distribute_tensor(
        w2, mesh, fsdp_placements(rowwise_placements(mesh, "tp"), w2.shape(), mesh, "dp")));
  }
  for (DTensor& p : w) p.requires_grad_();
  const Tensor x = randn({8, 16}, 3, DType::F32);
  DTensor h =
      distribute_tensor(policy != nullptr ? x.to(DType::BF16) : x, mesh, {Shard{0}, Replicate{}});
  Trace& t = trace();
  const bool sim = world.held_ranks().size() == 8;
  const bool was_enabled = t.enabled();
  if (sim) {
    t.set_enabled(true);
    t.clear();
  }
  const size_t start = t.num_events();
  for (int b = 0; b < 2; ++b) {
    const DTensor& w1 = w[2 * static_cast<size_t>(b)];
    const DTensor& w2 = w[2 * static_cast<size_t>(b) + 1];
    if (policy != nullptr) {
      const DTensor a = tanh(colwise_linear(h, fsdp_unshard(w1, "dp", *policy), {}, "tp", *policy));
      h = rowwise_linear(a, fsdp_unshard(w2, "dp", *policy), {}, "tp", Replicate{}, *policy);
    } else {
      const DTensor a = tanh(colwise_linear(h, fsdp_unshard(w1, "dp"), {}, "tp"));
      h = rowwise_linear(a, fsdp_unshard(w2, "dp"), {}, "tp", Replicate{});
    }
  }
  const DTensor y = to(h, DType::F32);
  const size_t middle = t.num_events();
  backward(sum(y * y));
  Run run;
  const std::vector<TraceRecord> records = t.records();
  // Rank 0's records come first, in issue order: the first (middle - start) after `start` are the
  // forward's.
  size_t seen = 0;
  for (size_t i = 0; i < records.size() && sim; ++i) {
    if (records[i].rank != 0 || seen++ < start) continue;
    (seen <= middle ? run.forward : run.collectives)
        .push_back(records[i].op + " " + records[i].dim_name + " " + records[i].dtype);
  }
  t.set_enabled(was_enabled);
  for (const DTensor& p : w) {
    run.grads.push_back(p.grad().full_tensor());
    run.grad_dtypes.push_back(p.grad().dtype());
  }
  return run;
}

// The gradients on one device in F64 of the same BF16 weights and input.
std::vector<Tensor> reference_grads() {
  std::vector<Tensor> w;
  for (int b = 0; b < 2; ++b) {
    w.push_back(weight(16, 32, 10 + 2 * static_cast<uint64_t>(b)).to(DType::BF16).to(DType::F64));
    w.push_back(weight(32, 16, 11 + 2 * static_cast<uint64_t>(b)).to(DType::BF16).to(DType::F64));
  }
  for (Tensor& p : w) p.requires_grad_();
  Tensor h = randn({8, 16}, 3, DType::F32).to(DType::BF16).to(DType::F64);
  for (size_t b = 0; b < 2; ++b) h = matmul(tanh(matmul(h, w[2 * b])), w[2 * b + 1]);
  backward(sum(h * h));
  std::vector<Tensor> out;
  for (const Tensor& p : w) out.push_back(p.grad());
  return out;
}

// The largest |got - want| over the largest |want|, over every weight.
double relative_error(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  double err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const Tensor diff = got[i].to(DType::F64) - want[i];
    const double scale = amax(abs(want[i])).item<double>();
    err = std::max(err, amax(abs(diff)).item<double>() / scale);
  }
  return err;
}

SPMD_TEST(MixedPrecision, MasterWeightsInF32GradientsReducedInReduceDtype) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const MixedPrecisionPolicy f32_reduce{DType::BF16, DType::F32, std::nullopt};
  const MixedPrecisionPolicy bf16_reduce{DType::BF16, std::nullopt, std::nullopt};
  const Run precise = two_blocks(world, &f32_reduce);
  const Run rounded = two_blocks(world, &bf16_reduce);
  const std::vector<Tensor> want = reference_grads();
  for (DType d : precise.grad_dtypes) EXPECT_EQ(d, DType::F32);  // the master weights' dtype
  const double e_precise = relative_error(precise.grads, want);
  const double e_rounded = relative_error(rounded.grads, want);
  // BF16 activations bound both; reducing in F32 removes the rounding of each partial sum.
  EXPECT_LT(e_precise, 2e-2);
  EXPECT_LT(e_precise, e_rounded);
  if (world.held_ranks().size() != 8) return;  // the trace's records: sim (one rank's view)
  // The forward gathers BF16 (param_dtype); the backward reduces in reduce_dtype.
  EXPECT_EQ(std::count(precise.forward.begin(), precise.forward.end(), "all_gather dp bf16"), 4);
  EXPECT_EQ(std::count_if(precise.forward.begin(), precise.forward.end(),
                          [](const std::string& c) { return c.starts_with("all_gather dp"); }),
            4);
  std::vector<std::string> reductions;
  for (const std::string& c : precise.collectives) {
    if (c.starts_with("reduce_scatter") || c.starts_with("all_reduce")) reductions.push_back(c);
  }
  EXPECT_EQ(reductions, (std::vector<std::string>{"reduce_scatter dp f32", "reduce_scatter dp f32",
                                                  "all_reduce tp f32", "reduce_scatter dp f32",
                                                  "reduce_scatter dp f32"}));
  std::vector<std::string> rounded_reductions;
  for (const std::string& c : rounded.collectives) {
    if (c.starts_with("reduce_scatter") || c.starts_with("all_reduce"))
      rounded_reductions.push_back(c);
  }
  EXPECT_EQ(rounded_reductions,
            (std::vector<std::string>{"reduce_scatter dp bf16", "reduce_scatter dp bf16",
                                      "all_reduce tp bf16", "reduce_scatter dp bf16",
                                      "reduce_scatter dp bf16"}));
}

SPMD_TEST(MixedPrecision, ADefaultPolicyIsThePlainStyleBitForBit) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const MixedPrecisionPolicy none;
  // With F32 input: the policy overloads with nothing set against the overloads without one.
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const Tensor w1 = weight(16, 32, 5);
  auto run = [&](bool with_policy) {
    DTensor w = distribute_tensor(
        w1, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w1.shape(), mesh, "dp"));
    w.requires_grad_();
    DTensor x = distribute_tensor(randn({8, 16}, 6, DType::F32), mesh, {Shard{0}, Replicate{}});
    x.requires_grad_();
    const DTensor y = with_policy ? colwise_linear(x, fsdp_unshard(w, "dp", none), {}, "tp", none)
                                  : colwise_linear(x, fsdp_unshard(w, "dp"), {}, "tp");
    backward(sum(y * y));
    return std::vector<Tensor>{y.full_tensor(), w.grad().full_tensor(), x.grad().full_tensor()};
  };
  const std::vector<Tensor> a = run(true);
  const std::vector<Tensor> b = run(false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], b[i], 0.0, 0.0)) << i;
  // output_dtype casts the output.
  const MixedPrecisionPolicy out_f64{std::nullopt, std::nullopt, DType::F64};
  const DTensor w = distribute_tensor(w1, mesh, colwise_placements(mesh, "tp"));
  const DTensor x = distribute_tensor(randn({8, 16}, 6, DType::F32), mesh, {Shard{0}, Replicate{}});
  EXPECT_EQ(colwise_linear(x, w, {}, "tp", out_f64).dtype(), DType::F64);
}

// Under no_sync (Note [No sync]) the policy's FSDP gradients wait unreduced; the synced backward
// reduces the total once: the same gradients as one backward of both losses.
SPMD_TEST(MixedPrecision, AccumulationWithoutSyncReducesOnce) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const MixedPrecisionPolicy mp{DType::BF16, DType::F32, std::nullopt};
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const Tensor w1 = weight(16, 32, 7);
  auto loss_of = [&](const DTensor& w, uint64_t seed) {
    const DTensor x =
        distribute_tensor(randn({8, 16}, seed, DType::BF16), mesh, {Shard{0}, Replicate{}});
    const DTensor y = to(colwise_linear(x, fsdp_unshard(w, "dp", mp), {}, "tp", mp), DType::F32);
    return sum(y * y);
  };
  auto param = [&] {
    DTensor w = distribute_tensor(
        w1, mesh, fsdp_placements(colwise_placements(mesh, "tp"), w1.shape(), mesh, "dp"));
    w.requires_grad_();
    return w;
  };
  DTensor together = param();
  backward(loss_of(together, 1) + loss_of(together, 2));
  DTensor apart = param();
  Trace& t = trace();
  const bool sim = world.held_ranks().size() == 8;
  const bool was_enabled = t.enabled();
  if (sim) {
    t.set_enabled(true);
    t.clear();
  }
  {
    const auto guard = no_sync();
    backward(loss_of(apart, 1));
  }
  const size_t unsynced = t.num_events();
  backward(loss_of(apart, 2));
  const std::vector<TraceEvent> events = t.events();
  t.set_enabled(was_enabled);
  EXPECT_TRUE(allclose(apart.grad().full_tensor(), together.grad().full_tensor(), 1e-5, 1e-6));
  EXPECT_EQ(apart.grad().dtype(), DType::F32);
  if (!sim) return;
  int scatters_unsynced = 0, scatters_synced = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind != CollectiveKind::ReduceScatter) continue;
    (i < unsynced ? scatters_unsynced : scatters_synced) += 1;
  }
  EXPECT_EQ(scatters_unsynced, 0);
  EXPECT_EQ(scatters_synced, 1);
}

SPMD_TEST(MixedPrecision, PoliciesWithoutFloatDtypesAreErrors) {
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  const DTensor w = distribute_tensor(randn({8, 4}, 1), mesh, {Shard{0}});
  expect_throws<Unsupported>(
      [&] {
        (void)fsdp_unshard(w, "dp", MixedPrecisionPolicy{DType::I64, {}, {}});
      },
      {"fsdp_unshard: MixedPrecisionPolicy.param_dtype must be a float dtype, got i64"});
  expect_throws<Unsupported>(
      [&] {
        (void)colwise_linear(w, w, {}, "dp", MixedPrecisionPolicy{{}, DType::Bool, {}});
      },
      {"colwise_linear: MixedPrecisionPolicy.reduce_dtype must be a float dtype, got bool"});
}

}  // namespace
}  // namespace spmd
