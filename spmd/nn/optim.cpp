// spmd/nn/optim.cpp: SGD, AdamW and clip_grad_norm (nn/optim.h).
#include <spmd/nn/optim.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include <spmd/core/error.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

template <class P>
void check_params(const std::vector<P*>& params, const char* op) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr || !params[i]->defined()) {
      throw_error<Error>("{}: parameter {} is null or undefined", op, i);
    }
  }
}

// An optimizer's parameters: at least one (torch.optim's "optimizer got an empty parameter list"),
// none null or undefined.
template <class P>
void check_optimizer_params(const std::vector<P*>& params, const char* op) {
  if (params.empty()) {
    throw_error<ConfigError>("{}: the optimizer got an empty parameter list", op);
  }
  check_params(params, op);
}

// Replaces *p by `value` as a new leaf (no gradient).
template <class P>
void assign_leaf(P* p, const P& value) {
  P leaf = value.detach();
  leaf.requires_grad_();
  *p = leaf;
}

template <class P>
void drop_grads(const std::vector<P*>& params) {
  for (P* p : params) {
    if (p->requires_grad()) assign_leaf(p, *p);
  }
}

// A DTensor parameter's gradient and new value, for the debug tools (notify_value in
// dtensor/hooks.h: parity compares both at the step's line).
void notify_step(const Tensor&, const Tensor&, const SourceLocation&) {}
void notify_step(const DTensor& grad, const DTensor& value, const SourceLocation& loc) {
  notify_value("grad", grad, loc);
  notify_value("step", value, loc);
}

// The gradient of a leaf, replaced (clip_grad_norm).
void set_grad(Tensor* p, const Tensor& g) {
  p->autograd()->grad = g;
}
void set_grad(DTensor* p, const DTensor& g) {
  static_cast<DTensorAutogradMeta&>(*p->autograd()).dtensor_grad = g;
}

// Whether two ranks' squared norms are one answer: equal, or NaN on both (non-finite gradients,
// which the caller finds in the returned total, as a loss scaler does).
bool same_total(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

}  // namespace

Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.dtype(), t.device());
}

DTensor zeros_like(const DTensor& t) {
  const DType dtype = t.dtype();
  return dtensor_from_blocks("zeros_like", t.spec_ptr(), [dtype](const Shape&, const Shape& size) {
    return zeros(size, dtype);
  });
}

// ---- SGD --------------------------------------------------------------------------------------

template <class P>
SGD<P>::SGD(std::vector<P*> params, SGDOptions options, SourceLocation loc)
    : params_(std::move(params)), options_(options), momentum_(params_.size()) {
  const UserCallSite site(loc);
  check_optimizer_params(params_, "SGD");
  // The checks of Note [Optimizer hyperparameters].
  check_hyperparameter("SGD", "lr", options_.lr, 0.0);
  check_hyperparameter("SGD", "momentum", options_.momentum, 0.0);
  check_hyperparameter("SGD", "weight_decay", options_.weight_decay, 0.0);
}

template <class P>
void SGD<P>::step(SourceLocation loc) {
  const UserCallSite site(loc);
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    P* p = params_[i];
    const P raw = p->grad();
    if (!raw.defined()) continue;
    P g = raw;
    if (options_.weight_decay != 0.0) g = g + *p * options_.weight_decay;
    if (options_.momentum != 0.0) {
      P& b = momentum_[i];
      b = b.defined() ? b * options_.momentum + g : g;
      g = b;
    }
    assign_leaf(p, *p - g * options_.lr);
    notify_step(raw, *p, loc);
  }
}

template <class P>
void SGD<P>::zero_grad() {
  drop_grads(params_);
}

// ---- AdamW ------------------------------------------------------------------------------------

template <class P>
AdamW<P>::AdamW(std::vector<P*> params, AdamWOptions options, SourceLocation loc)
    : params_(std::move(params)), options_(options), m_(params_.size()), v_(params_.size()) {
  const UserCallSite site(loc);
  check_optimizer_params(params_, "AdamW");
  // The checks of Note [Optimizer hyperparameters].
  check_hyperparameter("AdamW", "lr", options_.lr, 0.0);
  check_hyperparameter("AdamW", "beta1", options_.beta1, 0.0, 1.0, /*hi_open=*/true);
  check_hyperparameter("AdamW", "beta2", options_.beta2, 0.0, 1.0, /*hi_open=*/true);
  check_hyperparameter("AdamW", "eps", options_.eps, 0.0);
  check_hyperparameter("AdamW", "weight_decay", options_.weight_decay, 0.0);
}

template <class P>
int64_t AdamW<P>::steps() const {
  return step_count_.defined() ? step_count_.to_vector<int64_t>().at(0) : steps_;
}

template <class P>
checkpoint::StateDict AdamW<P>::state_dict(const std::string& prefix) {
  checkpoint::StateDict out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!m_[i].defined()) {
      m_[i] = zeros_like(*params_[i]);
      v_[i] = zeros_like(*params_[i]);
    }
    out[fmt::format("{}m.{}", prefix, i)] = &m_[i];
    out[fmt::format("{}v.{}", prefix, i)] = &v_[i];
  }
  step_count_ = from_vector(std::vector<int64_t>{steps()}, {1});
  out[prefix + "step"] = &step_count_;
  return out;
}

template <class P>
void AdamW<P>::step(SourceLocation loc) {
  const UserCallSite site(loc);
  NoGradGuard no_grad;
  steps_ = steps() + 1;
  if (step_count_.defined()) step_count_ = from_vector(std::vector<int64_t>{steps_}, {1});
  const AdamWOptions& o = options_;
  const AdamWStep hyper{.lr = o.lr,
                        .beta1 = o.beta1,
                        .beta2 = o.beta2,
                        .eps = o.eps,
                        .weight_decay = o.weight_decay,
                        .step = steps_};
  for (size_t i = 0; i < params_.size(); ++i) {
    P* p = params_[i];
    const P g = p->grad();
    if (!g.defined()) continue;
    if (!m_[i].defined()) {
      m_[i] = zeros_like(*p);
      v_[i] = zeros_like(*p);
    }
    // One op for the whole update (Note [Fused AdamW] in ops/optim.cpp): [3, ...] of p, m, v.
    const P updated = adamw_step(*p, g, m_[i], v_[i], hyper);
    m_[i] = select(updated, 0, 1);
    v_[i] = select(updated, 0, 2);
    assign_leaf(p, select(updated, 0, 0));
    notify_step(g, *p, loc);
  }
}

template <class P>
void AdamW<P>::zero_grad() {
  drop_grads(params_);
}

template class SGD<Tensor>;
template class SGD<DTensor>;
template class AdamW<Tensor>;
template class AdamW<DTensor>;

// ---- clip_grad_norm ---------------------------------------------------------------------------

namespace {

// A max_norm below 0 would flip every gradient's sign, and NaN would make every gradient NaN while
// the returned norm stays finite; +inf means no clipping.
void check_max_norm(double max_norm) {
  if (max_norm >= 0.0) return;
  throw_error<ConfigError>("clip_grad_norm: max_norm must be >= 0 (or +inf: no clipping), got {}",
                           max_norm);
}

template <class P>
void scale_grads(const std::vector<P*>& params, double total, double max_norm) {
  // A non-finite norm leaves the gradients as they are (scaling by 0 would turn inf into NaN): a
  // GradScaler then sees them and skips the step (Note [Expected overflow]).
  if (!std::isfinite(total)) return;
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient >= 1.0) return;
  NoGradGuard no_grad;
  for (P* p : params) {
    const P g = p->grad();
    if (g.defined()) set_grad(p, g * coefficient);
  }
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm, SourceLocation loc) {
  const UserCallSite site(loc);
  check_max_norm(max_norm);
  check_params(params, "clip_grad_norm");
  NoGradGuard no_grad;
  double squares = 0.0;
  for (Tensor* p : params) {
    const Tensor g = p->grad();
    if (!g.defined()) continue;
    const Tensor total = sum(g.to(DType::F64) * g.to(DType::F64));
    // A shape-only run has no norm (Note [Shape-only tensors]); scaling issues no collective.
    if (total.is_meta()) return std::numeric_limits<double>::quiet_NaN();
    squares += total.item<double>();
  }
  const double total = std::sqrt(squares);
  scale_grads(params, total, max_norm);
  return total;
}

double clip_grad_norm(const std::vector<DTensor*>& params, double max_norm, SourceLocation loc) {
  const UserCallSite site(loc);
  check_max_norm(max_norm);
  check_params(params, "clip_grad_norm");
  NoGradGuard no_grad;
  // Per mesh: every gradient's sum of squares made P(sum) on every mesh dim (a Replicate value is
  // partitioned, locally), added up, then reduced once.
  std::vector<DeviceMesh> meshes;
  std::vector<DTensor> partial;
  for (DTensor* p : params) {
    const DTensor g = p->grad();
    if (!g.defined()) continue;
    const DTensor g64 = to(g, DType::F64);
    const DTensor squares = sum(g64 * g64);
    const DTensor as_partial =
        squares.redistribute(Placements(squares.placements().size(), Partial{}));
    auto it = std::find(meshes.begin(), meshes.end(), g.mesh());
    if (it == meshes.end()) {
      meshes.push_back(g.mesh());
      partial.push_back(as_partial);
    } else {
      DTensor& acc = partial[static_cast<size_t>(it - meshes.begin())];
      acc = acc + as_partial;
    }
  }
  if (meshes.empty()) return 0.0;
  // Every rank adds the totals of the meshes (its sibling of each) it belongs to.
  std::vector<LocalTensor> per_mesh;
  for (const DTensor& p : partial) {
    per_mesh.push_back(p.redistribute(Placements(p.placements().size(), Replicate{})).to_local());
  }
  // A shape-only run has no norm (Note [Shape-only tensors]): the collectives above ran, and
  // scaling the gradients is local.
  if (per_mesh[0].shard_at(0).is_meta()) return std::numeric_limits<double>::quiet_NaN();
  double squares = 0.0;
  int first_rank = -1;
  for (int rank : per_mesh[0].ranks()) {
    double rank_squares = 0.0;
    for (const LocalTensor& t : per_mesh) {
      if (t.holds(rank)) rank_squares += t.shard(rank).item<double>();
    }
    if (first_rank < 0) {
      first_rank = rank;
      squares = rank_squares;
    } else if (!same_total(rank_squares, squares)) {
      throw_error<DivergenceError>(
          "clip_grad_norm: the gradients' squared norm differs between ranks {} ({}) and {} ({}): "
          "sibling meshes hold different parameters (pipeline stages?); reduce the stages' totals "
          "over their mesh dim and scale the gradients yourself",
          first_rank, squares, rank, rank_squares);
    }
  }
  const double total = std::sqrt(squares);
  scale_grads(params, total, max_norm);
  return total;
}

}  // namespace spmd
