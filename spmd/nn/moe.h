// spmd/nn/moe.h: a mixture-of-experts feed-forward layer (Mixtral, DeepSeek-MoE, torchtitan's
// MoE), on one device (Tensor) and expert-parallel over a mesh dim (DTensor).
//
//   MoEWeights<DTensor> w = ...;      // router [d, E] Replicate; experts [E, d, f] / [E, f, d]
//                                     // S(0) over ep, Replicate elsewhere
//   MoEOutput<DTensor> r = moe(x, w, {.top_k = 2, .ep = "ep"});
//   DTensor loss = task_loss + 0.01 * r.aux_loss;
//
// Per token: router probabilities softmax(x router), the top-k experts (ties: the lower expert),
// their probabilities as gates (renormalized to sum 1 when normalize_gates, as Mixtral), and the
// output sum_j gate_j * expert_j(x) with each expert a SwiGLU: (silu(x w1) * (x w3)) w2. The
// auxiliary load-balancing loss is Switch Transformer's E * sum_e f_e P_e over the whole batch:
// f_e the fraction of the batch's top-k choices that picked expert e, P_e the mean probability of
// e (f is counted, only P carries a gradient).
//
// Note [Expert parallelism]
// The DTensor layer takes tokens x [..., d] split over the ranks (any placements without Partial,
// the last dim whole, sharded over `ep`), and experts split by expert over ep: rank q of ep holds
// experts [q E/ep, (q+1) E/ep). Each rank, in local code:
//   1. routes its own tokens (router probabilities, top-k, capacity);
//   2. sorts its choices by expert and tells every ep peer how many rows it sends to each of the
//      peer's experts (all_to_all of the counts);
//   3. sends the rows (all_to_all_single: uneven splits, each rank its own), reorders what it
//      received by local expert and runs its experts in one grouped_mm per weight (uneven groups);
//   4. sends the results back (all_to_all_single with the splits reversed) and adds each token's
//      top-k results, weighted by their gates.
// The backward reverses both exchanges (their typed backward). Gradients: the router is used by
// every rank on its own tokens, so its gradient is claimed Partial over every mesh dim that
// splits the tokens (and Replicate over those that repeat them); an expert's weights are used by
// the tokens every ep peer sent, so theirs is Shard(0) over ep and Partial over the other
// token-splitting dims: DTensor's redistribution then reduces each over exactly its group (dp, cp,
// tp for the experts; every token dim for the router). Claiming Replicate instead is the classic
// silent bug: the ranks' copies of the router drift apart (docs/training.md, "Expert
// parallelism").
// Capacity (capacity_factor > 0): each rank keeps at most ceil(factor * tokens * top_k / E) of its
// own choices per expert (first choices before second ones, then token order) and drops the rest:
// a dropped choice adds nothing (the residual stream carries the token on). It is per rank, as in
// GShard and Megatron, so a run with dropping differs from one device unless both see the same
// tokens together.
// A shape-only run (--spmd-tensors=meta) has no probabilities to route by: every rank then routes
// token t's j-th choice to expert (t k + j) mod E (balanced), which gives the shapes and
// collectives of a balanced step.
#pragma once

#include <cstdint>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

struct MoEOptions {
  int64_t top_k = 2;
  // 0: no limit (no choice dropped); else at most ceil(factor * tokens * top_k / experts) choices
  // per expert per rank.
  double capacity_factor = 0.0;
  bool normalize_gates = true;
  // The mesh dim the experts are split over (DTensor layer).
  MeshDim ep = "ep";
};

template <class T>
struct MoEWeights {
  T router;  // [d, E]
  T w1, w3;  // [E, d, f]
  T w2;      // [E, f, d]
};

template <class T>
struct MoEOutput {
  T out;       // x's shape
  T aux_loss;  // a scalar: the load-balancing loss of the whole batch
  // Choices per expert over the whole batch (before capacity), and how many were dropped.
  std::vector<int64_t> load;
  int64_t dropped = 0;
};

MoEOutput<Tensor> moe(const Tensor& x, const MoEWeights<Tensor>& w, const MoEOptions& options,
                      SourceLocation loc = SourceLocation::current());
MoEOutput<DTensor> moe(const DTensor& x, const MoEWeights<DTensor>& w, const MoEOptions& options,
                       SourceLocation loc = SourceLocation::current());

}  // namespace spmd
