// spmd/nn/grad_scaler.cpp: dynamic loss scaling (nn/grad_scaler.h).
#include <spmd/nn/grad_scaler.h>

#include <cmath>
#include <map>
#include <type_traits>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/nonfinite.h>

namespace spmd {
namespace {

// Elements of `t` that are inf or NaN (read on the host).
int64_t nonfinite_count(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return 0;
  int64_t n = 0;
  for (double v : t.detach()
                      .to(Device{})
                      .contiguous()
                      .reshape({t.numel()})
                      .to(DType::F64)
                      .to_vector<double>()) {
    n += std::isfinite(v) ? 0 : 1;
  }
  return n;
}

}  // namespace

template <class P>
GradScaler<P>::GradScaler(GradScalerOptions options, SourceLocation loc)
    : options_(options), scale_(options.init_scale) {
  const UserCallSite site(loc);
  auto bad = [](const char* name, double v, const char* want) {
    throw_error<ConfigError>("GradScaler: {} must be {}, got {}", name, want, v);
  };
  if (!(options_.init_scale > 0.0) || !std::isfinite(options_.init_scale))
    bad("init_scale", options_.init_scale, "a positive finite number");
  if (!(options_.growth_factor > 1.0) || !std::isfinite(options_.growth_factor))
    bad("growth_factor", options_.growth_factor, "above 1");
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0))
    bad("backoff_factor", options_.backoff_factor, "in (0, 1)");
  if (options_.growth_interval < 1)
    bad("growth_interval", static_cast<double>(options_.growth_interval), "at least 1");
}

template <class P>
GradScaler<P>::~GradScaler() {
  if (window_) close_expected_overflow();
}

template <class P>
P GradScaler<P>::scale(const P& loss, SourceLocation loc) {
  const UserCallSite site(loc);
  if (!options_.enabled) return loss;
  if (!window_) open_expected_overflow();
  window_ = true;
  unscaled_ = false;
  overflow_ = false;
  return loss * scale_;
}

template <class P>
bool GradScaler<P>::unscale(const std::vector<P*>& params, SourceLocation loc) {
  const UserCallSite site(loc);
  if (!options_.enabled || unscaled_) return overflow_;
  unscaled_ = true;
  const double inverse = 1.0 / scale_;
  NoGradGuard no_grad;
  int64_t found = 0;
  if constexpr (std::is_same_v<P, Tensor>) {
    for (P* p : params) {
      const Tensor g = p->grad();
      if (!g.defined()) continue;
      found += nonfinite_count(g);
      set_grad(*p, g * inverse);
    }
  } else {
    // Each rank counts in the pieces it holds; one all_reduce over the world gives every rank the
    // total, whatever meshes the parameters live on (pipeline stages included).
    const DTensor* first = nullptr;
    std::map<int, int64_t> per_rank;
    for (P* p : params) {
      const DTensor g = p->grad();
      if (!g.defined()) continue;
      first = first != nullptr ? first : p;
      for (int r : g.local().ranks()) per_rank[r] += nonfinite_count(g.local().shard(r));
      set_grad(*p, g * inverse);
    }
    if (first != nullptr) {
      const World& world = first->mesh().world();
      const DeviceMesh all = init_device_mesh(world, {world.size()}, {"grad_scaler"});
      const LocalTensor counts = LocalTensor::from_fn(world, [&](int r) {
        auto it = per_rank.find(r);
        return scalar_tensor(it == per_rank.end() ? 0.0 : static_cast<double>(it->second),
                             DType::F64);
      });
      const LocalTensor total = all_reduce(counts, all, 0);
      found = static_cast<int64_t>(total.shard(world.held_ranks().front()).item<double>());
    }
  }
  overflow_ = found > 0;
  return overflow_;
}

template <class P>
void GradScaler<P>::update() {
  if (window_) close_expected_overflow();
  window_ = false;
  if (!options_.enabled) return;
  if (overflow_) {
    scale_ *= options_.backoff_factor;
    good_ = 0;
    ++skipped_;
  } else if (unscaled_ && ++good_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    good_ = 0;
  }
  unscaled_ = false;
  overflow_ = false;
}

template class GradScaler<Tensor>;
template class GradScaler<DTensor>;

}  // namespace spmd
