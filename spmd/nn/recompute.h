// spmd/nn/recompute.h: activation checkpointing, recompute in backward (torch.utils.checkpoint).
//
//   x = checkpoint_activations<DTensor>(
//       [&](const std::vector<DTensor>& in) { return block(c, par, m.blocks[l], l, in[0], step); },
//       {x});
//
// Note [Recompute]
// The forward runs `fn` with recording off: none of its intermediate values is kept, only the
// inputs and the output, as one node of the tape. When backward reaches that node it runs `fn`
// again on detached copies of the inputs with recording on, and differentiates the recomputed
// output with the gradient that arrived: the inputs' gradients go on to their own nodes, and the
// gradients of what `fn` uses besides its inputs (the parameters it captures) accumulate into
// those leaves as in an ordinary backward. The memory of a block's activations is traded for a
// second forward. `fn` must compute the same values twice: it may draw random numbers only from
// explicit seeds (spmdsim's dropout takes its seed; mesh-invariant random DTensors are functions
// of theirs), and its collectives run again in backward, in the same order on every rank. When
// grad mode is off, or no input takes part in autograd, `fn` just runs (nothing to recompute for;
// a parameter captured by `fn` then gets a gradient only through an input that takes part).
#pragma once

#include <functional>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/ops/selective.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

// fn(inputs), recomputed in backward (Note [Recompute]). T: Tensor, LocalTensor or DTensor.
template <class T>
T checkpoint_activations(const std::function<T(const std::vector<T>&)>& fn,
                         const std::vector<T>& inputs,
                         SourceLocation loc = SourceLocation::current());
// The same, keeping the outputs of the ops `policy` names from the first forward (Note [Selective
// recompute] in ops/selective.h; save_matmuls(): the matmuls and attention). T: Tensor or DTensor
// (Unsupported for LocalTensor).
template <class T>
T checkpoint_activations(const std::function<T(const std::vector<T>&)>& fn,
                         const std::vector<T>& inputs, const RecomputePolicy& policy,
                         SourceLocation loc = SourceLocation::current());

}  // namespace spmd
