// spmd/ops/selective.cpp: the selective recompute's scopes (Note [Selective recompute]).
#include <spmd/ops/selective.h>

#include <algorithm>

#include <spmd/core/error.h>

namespace spmd {
namespace {

thread_local SelectiveScope* t_scope = nullptr;

}  // namespace

RecomputePolicy save_matmuls() {
  return RecomputePolicy{
      {"matmul", "bmm", "addmm", "grouped_mm", "float8_mm", "scaled_dot_product_attention"}, {}};
}

RecomputePolicy save_alternate_matmuls() {
  RecomputePolicy p = save_matmuls();
  p.alternate_ops = {"matmul", "float8_mm"};
  return p;
}

SelectiveScope::SelectiveScope(Mode mode, std::string_view kind, const RecomputePolicy& policy,
                               std::shared_ptr<SelectiveCache> cache)
    : mode_(mode), kind_(kind), policy_(policy), cache_(std::move(cache)), previous_(t_scope) {
  t_scope = this;
}

SelectiveScope::~SelectiveScope() {
  t_scope = previous_;
}

void SelectiveScope::save(std::string_view op, const Var& out) {
  cache_->ops.emplace_back(op);
  cache_->outputs.push_back(out.detach());
}

Var SelectiveScope::take(std::string_view op) {
  if (next_ >= cache_->outputs.size()) {
    throw_error<Error>(
        "checkpoint_activations: the recompute in backward calls '{}' more often than the first "
        "forward did ({} kept outputs): the function must compute the same values twice",
        op, cache_->outputs.size());
  }
  if (cache_->ops[next_] != op) {
    throw_error<Error>(
        "checkpoint_activations: the recompute in backward calls '{}' where the first forward "
        "called '{}' (kept output {} of {}): the function must compute the same values twice",
        op, cache_->ops[next_], next_ + 1, cache_->outputs.size());
  }
  return cache_->outputs[next_++];
}

void SelectiveScope::check_consumed() const {
  if (next_ != cache_->outputs.size()) {
    throw_error<Error>(
        "checkpoint_activations: the recompute in backward used {} of the {} outputs the first "
        "forward kept: the function must compute the same values twice",
        next_, cache_->outputs.size());
  }
}

SelectiveScope* selective_scope(std::string_view kind, std::string_view op) {
  SelectiveScope* s = t_scope;
  if (s == nullptr || s->kind_ != kind || s->inside_ > 0) return nullptr;
  const auto& ops = s->policy_.save_ops;
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) return nullptr;
  const auto& alternate = s->policy_.alternate_ops;
  if (std::find(alternate.begin(), alternate.end(), op) != alternate.end()) {
    // Counted in both forwards alike: the same calls are kept and taken.
    return s->alternate_calls_++ % 2 == 0 ? s : nullptr;
  }
  return s;
}

}  // namespace spmd
