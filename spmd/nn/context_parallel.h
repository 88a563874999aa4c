// spmd/nn/context_parallel.h: attention over a sequence split across a mesh dim (context
// parallelism: Ring Attention, torchtitan's context_parallel, Megatron's CP).
//
//   // q, k, v [B, H, S, D], the sequence (dim -2) split evenly over cp, in zigzag order:
//   std::vector<int64_t> order = zigzag_order(S, mesh.size("cp"));
//   DTensor o = context_attention(q, k, v, {.cp = "cp", .positions = order});
//
// Note [Context parallelism]
// Rank c of cp holds queries, keys and values of S/cp sequence indices. Two ways to attend:
//   Ring      (the default) each rank keeps its queries and passes its keys and values around the
//             ring of cp ranks with point-to-point sends (c -> c+1): cp steps, at each one the rank
//             attends to the block it holds and merges it into its running result by log-sum-exp
//             (online softmax: max m, denominator l, numerator o, rescaled by exp(m_old - m_new)).
//             The backward goes round the ring again: each block's key/value gradient travels with
//             the block and arrives home after cp steps; the queries' gradient stays local. The
//             forward saves only the output and its log-sum-exp per row (FlashAttention's
//             recomputation), and records one autograd node for the whole ring.
//   AllGather the keys and values gathered over cp (all_gather, whose backward reduce-scatters
//             their gradients) and one block of attention per rank: Llama 3's choice for its
//             long-context training; more memory, one collective.
// Causal masking is by position: key j is visible to query i when position(j) <= position(i).
// `positions` gives the position of each sequence index of the global tensors (empty: the index
// itself), so any order works. Causal attention over contiguous blocks leaves rank cp-1 with cp
// times rank 0's work; zigzag_order's head-tail split (rank c holds chunks c and 2cp-1-c of 2cp
// chunks) gives every rank the same number of visible pairs. The caller lays the sequence out in
// that order (tokens, targets and rotary positions alike) and the loss, a sum over positions, is
// unchanged. Both ways equal full attention to rounding (tests/nn/context_parallel_test.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/mesh/device_mesh.h>

namespace spmd {

enum class ContextMethod { Ring, AllGather };

struct ContextAttentionOptions {
  MeshDim cp = "cp";
  bool causal = true;
  std::optional<double> scale;  // default 1 / sqrt(D)
  // The position of each global sequence index (size S), e.g. zigzag_order(S, cp); empty: 0..S-1.
  std::vector<int64_t> positions;
  ContextMethod method = ContextMethod::Ring;
};

// softmax(q k^T scale [+ causal mask by position]) v for q, k, v [..., S, D] (equal shapes but
// the last dim of v) whose dim -2 is split evenly over `cp` (Shard(-2) there, no other mesh dim
// splitting it or the last dim; the other dims may be split alike on the other mesh dims, e.g.
// heads over tp). The result has q's placements.
DTensor context_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                          const ContextAttentionOptions& options = {},
                          SourceLocation loc = SourceLocation::current());

// The head-tail (zigzag) order of a sequence of `seq` positions for `cp` ranks: 2 cp chunks,
// rank c holding chunks c and 2 cp - 1 - c. order[i] is the original position of index i.
// ConfigError unless 2 cp divides seq.
std::vector<int64_t> zigzag_order(int64_t seq, int64_t cp);

}  // namespace spmd
