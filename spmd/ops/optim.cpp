// spmd/ops/optim.cpp: the entry of adamw_step, one AdamW update of one parameter as one op.
#include <cmath>
#include <limits>

#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace {

// Note [Fused AdamW]
// AdamW (nn/optim.h) wrote its update as eleven elementwise ops per parameter, each reading its
// operands from memory, writing a new tensor and, for a scalar operand, making a 0-d tensor:
//   m' = m b1 + g (1 - b1)           v' = v b2 + g g (1 - b2)
//   d  = sqrt(v') / sqrt(1 - b2^t) + eps
//   p' = p (1 - lr wd) - m' / d * lr / (1 - b1^t)
// adamw_step is that update as one op, as PyTorch's fused AdamW (torch.optim.AdamW(fused=True)) is
// one kernel: inputs (p, g, m, v) of one shape and floating dtype, args.ints = [t] (the step
// count, >= 1), args.reals = [lr, beta1, beta2, eps, weight_decay]; the output [3, ...] holds p',
// m' and v' (select(0, i) of it: contiguous views), so the CPU kernel reads 4 and writes 3 values
// per element. It computes the composed ops' operations in their order, rounding after each to the
// parameter's dtype as they do (BF16 and F16 in float between roundings, their scalars in float),
// so it gives the same bits as the composed update and every digest stayed as it was. Devices
// without the kernel (CUDA) run the composed ops. Elementwise, it keeps its inputs' shards (a
// shard of dim d is the output's dim d + 1); a pending sum is reduced first, as the update is not
// linear. It has no gradient (an optimizer step runs outside the tape). examples/gpt's step at
// d_model 64 on full tensors spent 0.58 ms of its 4.6 in AdamW, and spends 0.12 to 0.16 ms now;
// tensor_bench BM_AdamWStep (1M F32 elements): 0.80 ms against the eleven ops' 2.08.

constexpr std::string_view kName = "adamw_step";

// The kernel's factors for step t, computed in double as the composed update computed them.
AdamWKernelArgs adamw_factors(const OpArgs& args) {
  const double t = static_cast<double>(args.ints.at(0));
  const double lr = args.reals.at(0), beta1 = args.reals.at(1), beta2 = args.reals.at(2);
  const double eps = args.reals.at(3), weight_decay = args.reals.at(4);
  AdamWKernelArgs k;
  k.beta1 = beta1;
  k.one_minus_beta1 = 1.0 - beta1;
  k.beta2 = beta2;
  k.one_minus_beta2 = 1.0 - beta2;
  k.inv_sqrt_correction = 1.0 / std::sqrt(1.0 - std::pow(beta2, t));
  k.eps = eps;
  k.decay = 1.0 - lr * weight_decay;
  k.step_size = lr / (1.0 - std::pow(beta1, t));
  return k;
}

OpMeta adamw_meta(std::span<const InputMeta> in, const OpArgs& args) {
  static constexpr const char* kInputs[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  if (in.size() != 4) {
    throw_error<ShapeError>("{}: expects 4 tensors (param, grad, exp_avg, exp_avg_sq), got {}",
                            kName, in.size());
  }
  if (!is_floating(in[0].dtype)) {
    throw_error<Unsupported>("{}: the param must be floating, got {} (shape {})", kName,
                             in[0].dtype, shape_str(*in[0].shape));
  }
  for (size_t i = 1; i < 4; ++i) {
    if (*in[i].shape != *in[0].shape || in[i].dtype != in[0].dtype) {
      throw_error<ShapeError>("{}: the {} is {} {} but the param is {} {}", kName, kInputs[i],
                              in[i].dtype, shape_str(*in[i].shape), in[0].dtype,
                              shape_str(*in[0].shape));
    }
  }
  if (args.ints.size() != 1 || args.reals.size() != 5) {
    throw_error<ConfigError>(
        "{}: expects ints [step] and reals [lr, beta1, beta2, eps, "
        "weight_decay], got {}",
        kName, args.to_string());
  }
  if (args.ints[0] < 1) {
    throw_error<ConfigError>("{}: step must be >= 1 (the count including this step), got {}", kName,
                             args.ints[0]);
  }
  // The checks AdamW's constructor makes (Note [Optimizer hyperparameters]).
  check_hyperparameter(kName, "lr", args.reals[0], 0.0);
  check_hyperparameter(kName, "beta1", args.reals[1], 0.0, 1.0, /*hi_open=*/true);
  check_hyperparameter(kName, "beta2", args.reals[2], 0.0, 1.0, /*hi_open=*/true);
  check_hyperparameter(kName, "eps", args.reals[3], 0.0);
  check_hyperparameter(kName, "weight_decay", args.reals[4], 0.0);
  Shape out{3};
  out.insert(out.end(), in[0].shape->begin(), in[0].shape->end());
  return OpMeta{out, in[0].dtype};
}

// The update as the composed ops: where the device has no kernel.
Tensor adamw_composed(std::span<const Tensor> in, const AdamWKernelArgs& k) {
  const Tensor& p = in[0];
  const Tensor& g = in[1];
  const Tensor m = in[2] * k.beta1 + g * k.one_minus_beta1;
  const Tensor v = in[3] * k.beta2 + g * g * k.one_minus_beta2;
  const Tensor denom = sqrt(v) * k.inv_sqrt_correction + k.eps;
  return stack({p * k.decay - m / denom * k.step_size, m, v}, 0);
}

Tensor adamw_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta& meta) {
  const AdamWKernelArgs k = adamw_factors(args);
  DeviceOps& kernels = kernels_for(kName, {&in[0], &in[1], &in[2], &in[3]});
  const Tensor out = empty_for(kName, meta.shape, meta.dtype, in[0].device());
  if (out.is_meta()) return out;
  if (kernels.adamw(out, in[0].contiguous(), in[1].contiguous(), in[2].contiguous(),
                    in[3].contiguous(), k)) {
    return out;
  }
  return adamw_composed(in, k);
}

// Every input sharded alike (dim d of the inputs is dim d + 1 of the output), or all Replicate.
std::vector<OpStrategy> adamw_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  const int nd = static_cast<int>(in[0]->ndim());
  std::vector<DimOption> options = {{std::vector<Placement>(in.size(), Replicate{}), Replicate{}}};
  for (int d = 0; d < nd; ++d) {
    options.push_back({std::vector<Placement>(in.size(), Shard{d}), Shard{d + 1}});
  }
  return expand_dim_options(in, options);
}

}  // namespace

// Note [Optimizer hyperparameters]
// Each optimizer checks its hyperparameters when it is built, as torch.optim does (lr >= 0,
// eps >= 0, 0 <= beta < 1, weight_decay >= 0, momentum >= 0), and also refuses NaN and infinities,
// which torch lets through and which turn every parameter into NaN at the first step: a
// ConfigError naming the optimizer, the hyperparameter, the rule and the value. adamw_step, which
// a user may call without the optimizer, checks its own the same way, naming itself.
void check_hyperparameter(std::string_view op, std::string_view name, double value, double lo,
                          double hi, bool hi_open) {
  const bool ok = std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (ok) return;
  if (hi_open) {
    throw_error<ConfigError>("{}: {} must lie in [{}, {}), got {}", op, name, lo, hi, value);
  }
  throw_error<ConfigError>("{}: {} must be a finite number >= {}, got {}", op, name, lo, value);
}

const OpDef op::adamw_step{
    .name = kName,
    .meta = adamw_meta,
    .compute = adamw_compute,
    .strategies = adamw_strategies,
    .follow_first_input = true,
    .saves = kSavesNone,
};

}  // namespace spmd
