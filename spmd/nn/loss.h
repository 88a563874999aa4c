// spmd/nn/loss.h: a chunked cross-entropy of a linear output layer (the logits never exist whole).
//
//   DTensor loss = chunked_cross_entropy(h, w_out, targets, {.chunks = 4, .dim = 1});
//
// Note [Chunked cross-entropy]
// cross_entropy(h @ w, targets) over a vocabulary of 128K holds [tokens, V] logits and their
// gradient: at Llama 3's sizes the largest activation of the step. chunked_cross_entropy computes
// the same loss `chunks` slices of h at a time along `dim`: for each slice, the logits, the
// loss and, at once, the slice's gradients (a backward on a detached leaf of the slice and of w),
// so only one slice's logits live at a time (Liger's fused linear cross-entropy, torchtune's
// chunked loss). The forward keeps dh (h's size) and dw (w's) and records one autograd node whose
// backward scales them by the loss's gradient; under no_grad it computes the loss alone. Mean
// divides by the number of targets not ignored (as cross_entropy's mean), Sum does not; the
// options are cross_entropy's otherwise. On DTensors every slice runs the DTensor ops (a
// vocabulary-parallel w keeps Megatron's loss: the logits are never gathered); chunk along a dim
// that is not sharded (a sharded one is gathered by narrow). Equal to the unchunked loss and its
// gradients to rounding (tests/nn/loss_test.cpp).
#pragma once

#include <cstdint>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

struct ChunkedLossOptions {
  int64_t chunks = 4;
  int64_t dim = 0;                                // of h [..., d]; not its last
  LossReduction reduction = LossReduction::Mean;  // Mean or Sum
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

// The cross-entropy of h [..., d] @ w [d, V] against targets [...] (h's shape but the last dim).
Tensor chunked_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                             const ChunkedLossOptions& options = {},
                             SourceLocation loc = SourceLocation::current());
DTensor chunked_cross_entropy(const DTensor& h, const DTensor& w, const DTensor& targets,
                              const ChunkedLossOptions& options = {},
                              SourceLocation loc = SourceLocation::current());

}  // namespace spmd
