// spmd/nn/recompute.cpp: activation checkpointing (Note [Recompute]).
#include <spmd/nn/recompute.h>

#include <memory>
#include <string_view>
#include <type_traits>

#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

template <class T>
struct Saved {
  std::function<T(const std::vector<T>&)> fn;
  SourceLocation loc;
  // A selective recompute's policy and kept outputs (Note [Selective recompute]); null: none.
  std::shared_ptr<const RecomputePolicy> policy;
  std::shared_ptr<SelectiveCache> kept;
};

template <class T>
constexpr std::string_view kind_name() {
  return std::is_same_v<T, DTensor> ? "DTensor" : "Tensor";
}

template <class T>
void recompute_backward(BackwardContext& c) {
  const Saved<T>& saved = c.payload<Saved<T>>();
  std::vector<T> leaves;
  std::vector<Var> only;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    T leaf = c.input(i).value<T>().detach();
    if (c.needs_grad(i)) leaf.requires_grad_();
    leaves.push_back(leaf);
  }
  T out;
  {
    // The forward again, recorded (backward runs with recording off).
    const bool previous = grad_enabled();
    set_grad_enabled(true);
    const RecomputingScope recomputing;
    try {
      if (saved.kept) {
        SelectiveScope replay(SelectiveScope::Mode::Replay, kind_name<T>(), *saved.policy,
                              saved.kept);
        out = saved.fn(leaves);
        replay.check_consumed();
      } else {
        out = saved.fn(leaves);
      }
    } catch (...) {
      set_grad_enabled(previous);
      throw;
    }
    set_grad_enabled(previous);
  }
  if (!out.defined() || !out.requires_grad()) {
    throw_error<Error>(
        "checkpoint_activations: recomputed in backward, the function's output no longer takes "
        "part in autograd (it must compute the same values, from its inputs, twice)");
  }
  run_backward(to_var(out), c.grad(), saved.loc);
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!c.needs_grad(i)) continue;
    T g;
    if constexpr (std::is_same_v<T, DTensor>) {
      // Under no_sync the input's gradient waits in the leaf's pending sum, unreduced (Note [No
      // sync]): it goes on as it is, an activation's gradient, whatever its placements.
      g = leaves[i].pending_grad();
    }
    if (!g.defined()) g = leaves[i].grad();
    if (g.defined()) c.set_grad(i, to_var(g));
  }
}

// checkpoint_activations with `policy` (null: recompute everything).
template <class T>
T checkpointed(const std::function<T(const std::vector<T>&)>& fn, const std::vector<T>& inputs,
               const RecomputePolicy* policy, SourceLocation loc) {
  const UserCallSite site(loc);
  if (!fn) throw_error<ConfigError>("checkpoint_activations: the function is empty");
  std::vector<Var> vars;
  for (const T& t : inputs) vars.push_back(to_var(t));
  if (!grad_enabled() || !any_requires_grad(vars)) return fn(inputs);
  std::vector<T> detached;
  for (const T& t : inputs) detached.push_back(t.detach());
  auto saved = std::make_shared<Saved<T>>(Saved<T>{fn, loc, nullptr, nullptr});
  T out;
  {
    NoGradGuard no_grad;
    if (policy != nullptr && !policy->save_ops.empty()) {
      saved->policy = std::make_shared<const RecomputePolicy>(*policy);
      saved->kept = std::make_shared<SelectiveCache>();
      const SelectiveScope save(SelectiveScope::Mode::Save, kind_name<T>(), *saved->policy,
                                saved->kept);
      out = fn(detached);
    } else {
      out = fn(detached);
    }
  }
  if (!out.defined())
    throw_error<ConfigError>("checkpoint_activations: the function returned nothing");
  return record("checkpoint_activations", nullptr, vars, {}, to_var(out), recompute_backward<T>,
                saved)
      .template value<T>();
}

}  // namespace

template <class T>
T checkpoint_activations(const std::function<T(const std::vector<T>&)>& fn,
                         const std::vector<T>& inputs, SourceLocation loc) {
  return checkpointed(fn, inputs, nullptr, loc);
}

template <class T>
T checkpoint_activations(const std::function<T(const std::vector<T>&)>& fn,
                         const std::vector<T>& inputs, const RecomputePolicy& policy,
                         SourceLocation loc) {
  if constexpr (std::is_same_v<T, LocalTensor>) {
    if (!policy.save_ops.empty()) {
      throw_error<Unsupported>(
          "checkpoint_activations: a selective policy keeps the outputs of Tensor and DTensor "
          "ops; a LocalTensor function's ops run per rank (recompute it whole, or write it with "
          "DTensors)");
    }
  }
  return checkpointed(fn, inputs, &policy, loc);
}

template Tensor checkpoint_activations(const std::function<Tensor(const std::vector<Tensor>&)>&,
                                       const std::vector<Tensor>&, SourceLocation);
template LocalTensor checkpoint_activations(
    const std::function<LocalTensor(const std::vector<LocalTensor>&)>&,
    const std::vector<LocalTensor>&, SourceLocation);
template DTensor checkpoint_activations(const std::function<DTensor(const std::vector<DTensor>&)>&,
                                        const std::vector<DTensor>&, SourceLocation);
template Tensor checkpoint_activations(const std::function<Tensor(const std::vector<Tensor>&)>&,
                                       const std::vector<Tensor>&, const RecomputePolicy&,
                                       SourceLocation);
template LocalTensor checkpoint_activations(
    const std::function<LocalTensor(const std::vector<LocalTensor>&)>&,
    const std::vector<LocalTensor>&, const RecomputePolicy&, SourceLocation);
template DTensor checkpoint_activations(const std::function<DTensor(const std::vector<DTensor>&)>&,
                                        const std::vector<DTensor>&, const RecomputePolicy&,
                                        SourceLocation);

}  // namespace spmd
