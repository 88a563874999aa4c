// spmd/collectives/p2p.cpp: point-to-point envelopes and their reports (Note [Point-to-point]).
#include <spmd/collectives/p2p.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <spmd/collectives/trace.h>
#include <spmd/core/error.h>

namespace spmd {
namespace {

void copy_text(char* out, size_t size, std::string_view text) {
  const size_t n = std::min(size - 1, text.size());
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace

P2PEnvelope make_envelope(const EnvelopeInput& in) {
  P2PEnvelope e;
  std::memset(&e, 0, sizeof e);
  const Shape& shape = *in.shape;
  if (shape.size() > static_cast<size_t>(kEnvelopeDims)) {
    throw_error<CommError>(
        "{} over mesh dim '{}' from rank {} to rank {}: a point-to-point tensor has at most {} "
        "dims, this one has shape {}",
        in.gradient ? "the gradient's send" : "send", in.dim_name, in.src, in.dst, kEnvelopeDims,
        shape_str(shape));
  }
  e.src = in.src;
  e.dst = in.dst;
  e.tag = in.tag;
  e.dtype = static_cast<int32_t>(in.dtype);
  e.ndim = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) e.dims[d] = shape[d];
  e.requires_grad = in.requires_grad ? 1 : 0;
  e.gradient = in.gradient ? 1 : 0;
  const PipelineContext context = pipeline_context();
  e.stage = context.stage;
  e.microbatch = context.microbatch;
  copy_text(e.dim_name, sizeof e.dim_name, in.dim_name);
  copy_text(e.site, sizeof e.site, site_text(in.location));
  return e;
}

Shape envelope_shape(const P2PEnvelope& e) {
  return Shape(e.dims, e.dims + std::clamp(e.ndim, 0, kEnvelopeDims));
}

std::string envelope_text(const P2PEnvelope& e, bool is_send) {
  std::string context;
  if (e.stage >= 0 || e.microbatch >= 0) {
    context = fmt::format(" (stage {}, microbatch {})", e.stage, e.microbatch);
  }
  return fmt::format("{}{} over '{}' {} {} tag={} {} rank {} {} rank {}{} at {}",
                     e.gradient ? "the backward's " : "", is_send ? "send" : "recv", e.dim_name,
                     shape_str(envelope_shape(e)), static_cast<DType>(e.dtype), e.tag,
                     is_send ? "from" : "at", is_send ? e.src : e.dst, is_send ? "to" : "from",
                     is_send ? e.dst : e.src, context, e.site);
}

std::string envelope_differences(const P2PEnvelope& sent, const P2PEnvelope& expected) {
  std::string out;
  auto add = [&](std::string_view what) {
    if (!out.empty()) out += ", ";
    out += what;
  };
  if (sent.gradient != expected.gradient) add("gradient");
  if (sent.tag != expected.tag) add("tag");
  if (envelope_shape(sent) != envelope_shape(expected)) add("shape");
  if (sent.dtype != expected.dtype) add("dtype");
  if (sent.microbatch >= 0 && expected.microbatch >= 0 && sent.microbatch != expected.microbatch) {
    add("microbatch");
  }
  return out;
}

std::string p2p_mismatch_report(const P2PEnvelope& sent, const P2PEnvelope& expected,
                                std::string_view differences, std::span<const P2PEnvelope> later) {
  std::string report =
      fmt::format("point-to-point mismatch: {}\n  was paired with {}\n  they differ in {}",
                  envelope_text(expected, /*is_send=*/false), envelope_text(sent, /*is_send=*/true),
                  differences);
  for (size_t k = 0; k < later.size(); ++k) {
    if (!envelope_differences(later[k], expected).empty()) continue;
    report += fmt::format(
        "\nthe message rank {} sent {} after it fits this recv: {}\nsends and recvs between two "
        "ranks pair in the order they are made (FIFO, as NCCL pairs them; tags do not reorder "
        "them), so the two sides make these transfers in different orders: on GPUs the data would "
        "be received silently into the wrong buffers (Megatron-LM #5271)",
        sent.src, k == 0 ? "right" : fmt::format("{} messages", k + 1),
        envelope_text(later[k], /*is_send=*/true));
    break;
  }
  if (sent.microbatch >= 0 && expected.microbatch >= 0 && sent.microbatch != expected.microbatch) {
    report += fmt::format(
        "\nstage {} receives microbatch {} where microbatch {} was due: the pipeline's stages run "
        "their microbatches in different orders",
        expected.stage, sent.microbatch, expected.microbatch);
  }
  return report;
}

void check_envelope(const P2PEnvelope& sent, const P2PEnvelope& expected,
                    std::span<const P2PEnvelope> later) {
  const std::string differences = envelope_differences(sent, expected);
  if (differences.empty()) return;
  throw CollectiveMismatchError(p2p_mismatch_report(sent, expected, differences, later));
}

}  // namespace spmd
