// spmd/collectives/p2p.h: what a point-to-point send carries besides its data (the envelope), the
// comparison with what the receiver expects, and the reports (Note [Point-to-point] in
// collectives/types.h). One schema for every backend: sim and threads compare envelopes in the
// process, mpi and nccl send them as bytes ahead of the data.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <spmd/core/call_site.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

constexpr int kEnvelopeDims = 8;

// Fixed size and trivially copyable: `memset` first, the bytes travel as they are.
struct P2PEnvelope {
  int32_t src;  // global ranks
  int32_t dst;
  int64_t tag;
  int32_t dtype;
  int32_t ndim;
  int64_t dims[kEnvelopeDims];
  int32_t requires_grad;  // the data carries a gradient back (the receiver's result requires grad)
  int32_t gradient;       // this is the gradient a backward sends back to the forward's sender
  int32_t stage;          // the sender's (or receiver's) pipeline context, -1 outside one
  int32_t microbatch;
  char dim_name[24];
  char site[80];  // "train.cpp:42"
};
static_assert(std::is_trivially_copyable_v<P2PEnvelope>);

struct EnvelopeInput {
  int src = 0;
  int dst = 0;
  int64_t tag = 0;
  const Shape* shape = nullptr;
  DType dtype = DType::F32;
  bool requires_grad = false;
  bool gradient = false;
  std::string_view dim_name;
  SourceLocation location = {};
};
// The envelope of a send (or a recv's expectation), with this thread's pipeline context
// (Note [Pipeline context]). CommError for a tensor of more than kEnvelopeDims dims.
P2PEnvelope make_envelope(const EnvelopeInput& in);

// The shape an envelope describes.
Shape envelope_shape(const P2PEnvelope& e);

// "send over 'pp' [4, 8] f32 tag=1 from rank 0 to rank 2 (stage 0, microbatch 3) at a.cpp:10".
std::string envelope_text(const P2PEnvelope& e, bool is_send);

// What differs between a message and the recv it was paired with ("tag", "shape", "dtype",
// "microbatch", "gradient"), joined with ", "; empty when they fit. Microbatches are compared
// only when both sides run in a pipeline context.
std::string envelope_differences(const P2PEnvelope& sent, const P2PEnvelope& expected);

// The CollectiveMismatchError text for a recv paired with a message that does not fit it, naming
// both lines. `later`: messages the same sender queued behind the paired one; when one of them
// fits, the report says the messages were paired out of order (Megatron-LM #5271).
std::string p2p_mismatch_report(const P2PEnvelope& sent, const P2PEnvelope& expected,
                                std::string_view differences,
                                std::span<const P2PEnvelope> later = {});

// Throws the CollectiveMismatchError of p2p_mismatch_report when `sent` does not fit `expected`.
void check_envelope(const P2PEnvelope& sent, const P2PEnvelope& expected,
                    std::span<const P2PEnvelope> later = {});

}  // namespace spmd
