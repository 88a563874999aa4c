// spmd/ops/selective.h: the ops a selective recompute keeps from the first forward.
//
// Note [Selective recompute]
// checkpoint_activations with a RecomputePolicy (nn/recompute.h) runs its function's first forward
// inside a SelectiveScope in Save mode: every op whose name the policy lists (by default the
// matmuls and attention: what costs FLOPs to recompute, PyTorch's selective activation
// checkpointing and torchtitan's "op" policy) keeps its output, in call order, in the scope's
// cache. The recompute in backward runs inside a scope in Replay mode over the same cache: each
// such op takes the next kept output instead of computing it (a DTensor op also skips the
// redistribution of its inputs, on every rank alike) and is recorded for autograd as usual, so
// its backward has its inputs and output. Everything else is recomputed. The cache lives with the
// tape node until backward has passed it: kept outputs are what the policy trades back for
// compute (a dry run's memory counts them). The scope applies to one kind of value, the
// function's: the ops of a DTensor function are caught at DTensor dispatch (dtensor/dispatch.cpp),
// not in the per-rank Tensor calls under them; a Tensor function's at Tensor call (ops/op.cpp).
// The two forwards must call the kept ops in the same order with the same shapes (the function
// computes the same values twice, Note [Recompute]); otherwise the replay is an Error naming the
// op.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/ops/autograd.h>

namespace spmd {

// What a selective recompute keeps: the outputs of the ops named here. Empty: nothing (every op
// is recomputed).
struct RecomputePolicy {
  std::vector<std::string> save_ops;
  // Of these ops (listed in save_ops too), only the odd calls in one function call (the 1st,
  // 3rd, ...) are kept and the others recomputed: torchtitan's "op" policy does so for aten.mm,
  // halving what the linear layers keep.
  std::vector<std::string> alternate_ops;
};

// The ops whose outputs are kept by default: matmul, bmm, addmm, grouped_mm, float8_mm (an FP8
// linear) and scaled_dot_product_attention.
RecomputePolicy save_matmuls();
// torchtitan's selective "op" policy (activation_checkpoint.selective_ac_option = "op"): as
// save_matmuls, but every second matmul is recomputed (matmul and float8_mm calls counted
// together: an FP8 linear replaces a matmul).
RecomputePolicy save_alternate_matmuls();

// The outputs a Save scope kept, in call order.
struct SelectiveCache {
  std::vector<std::string> ops;
  std::vector<Var> outputs;
};

// While alive, the ops of value kind `kind` ("Tensor", "DTensor") named in `policy` save their
// outputs into `cache` (Save) or take them from it (Replay) on this thread.
class SelectiveScope {
 public:
  enum class Mode { Save, Replay };
  SelectiveScope(Mode mode, std::string_view kind, const RecomputePolicy& policy,
                 std::shared_ptr<SelectiveCache> cache);
  ~SelectiveScope();
  SelectiveScope(const SelectiveScope&) = delete;
  SelectiveScope& operator=(const SelectiveScope&) = delete;

  // Error when a Replay scope did not take every kept output.
  void check_consumed() const;

  Mode mode() const { return mode_; }
  // While alive, ops inside a kept op's computation are not caught (they are part of it: a
  // replay takes the outer op's output without running them).
  class Inside {
   public:
    explicit Inside(SelectiveScope& scope) : scope_(scope) { ++scope_.inside_; }
    ~Inside() { --scope_.inside_; }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

   private:
    SelectiveScope& scope_;
  };
  // Save: keeps `out`, the output of `op`.
  void save(std::string_view op, const Var& out);
  // Replay: the next kept output, which must be `op`'s; Error naming both ops when not.
  Var take(std::string_view op);

 private:
  Mode mode_;
  std::string_view kind_;
  RecomputePolicy policy_;
  std::shared_ptr<SelectiveCache> cache_;
  size_t next_ = 0;
  int inside_ = 0;
  int64_t alternate_calls_ = 0;
  SelectiveScope* previous_;
  friend SelectiveScope* selective_scope(std::string_view kind, std::string_view op);
};

// The scope that catches op `op` on values of kind `kind` on this thread, or null (the fast path:
// one thread-local load when none is active).
SelectiveScope* selective_scope(std::string_view kind, std::string_view op);

}  // namespace spmd
