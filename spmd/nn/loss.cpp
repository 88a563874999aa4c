// spmd/nn/loss.cpp: the chunked cross-entropy (nn/loss.h, Note [Chunked cross-entropy]).
#include <spmd/nn/loss.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/tensor/shape.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

template <class T>
struct Saved {
  T dh, dw;
};

template <class T>
void chunked_backward(BackwardContext& c) {
  const Saved<T>& s = c.payload<Saved<T>>();
  const Var& g = c.grad();
  if (c.needs_grad(0)) c.set_grad(0, apply(op::mul, {to_var(s.dh), g}));
  if (c.needs_grad(1)) c.set_grad(1, apply(op::mul, {to_var(s.dw), g}));
}

template <class T>
T chunked(const T& h, const T& w, const T& targets, const ChunkedLossOptions& o) {
  const Shape& hs = h.shape();
  const int64_t nd = static_cast<int64_t>(hs.size());
  const int64_t dim = o.dim < 0 ? o.dim + nd : o.dim;
  Shape expected(hs.begin(), hs.end() - (nd > 0 ? 1 : 0));
  if (nd < 2 || w.shape().size() != 2 || w.shape()[0] != hs.back() || targets.shape() != expected) {
    throw_error<ShapeError>(
        "chunked_cross_entropy: expects h [..., d], w [d, V] and targets of h's shape without its "
        "last dim, got h {}, w {}, targets {}",
        shape_str(hs), shape_str(w.shape()), shape_str(targets.shape()));
  }
  if (dim < 0 || dim >= nd - 1) {
    throw_error<ConfigError>(
        "chunked_cross_entropy: dim {} is not a dim of h {} other than its last (the features)",
        o.dim, shape_str(hs));
  }
  if (o.chunks < 1 || o.reduction == LossReduction::None) {
    throw_error<ConfigError>(
        "chunked_cross_entropy: chunks must be at least 1 (got {}) and the reduction Mean or Sum",
        o.chunks);
  }
  const int64_t V = w.shape()[1];
  const CrossEntropyOptions sum_options{.reduction = LossReduction::Sum,
                                        .ignore_index = o.ignore_index,
                                        .label_smoothing = o.label_smoothing};
  auto loss_of = [&](const T& hc, const T& wc, const T& tc) {
    return cross_entropy(reshape(matmul(hc, wc), {-1, V}), reshape(tc, {-1}), sum_options);
  };
  // The number of targets the mean divides by (a shape-only run has no values: all of them).
  auto count = [&]() -> double {
    Tensor all;
    if constexpr (std::is_same_v<T, Tensor>) {
      all = targets;
    } else {
      all = targets.full_tensor();
    }
    if (all.is_meta()) return static_cast<double>(all.numel());
    double n = 0;
    for (int64_t t : all.to(DType::I64).to(Device{}).template to_vector<int64_t>()) {
      n += t != o.ignore_index ? 1.0 : 0.0;
    }
    return n;
  };
  const bool recording = grad_enabled() && (h.requires_grad() || w.requires_grad());
  if (!recording) {
    T total;
    for (const auto& [start, length] : chunk_ranges(hs[static_cast<size_t>(dim)], o.chunks)) {
      const T lc = loss_of(narrow(h, dim, start, length), w, narrow(targets, dim, start, length));
      total = total.defined() ? total + lc : lc;
    }
    return o.reduction == LossReduction::Mean ? total / count() : total;
  }
  T wl = w.detach();
  wl.requires_grad_();
  std::vector<T> dh_parts;
  T total;
  for (const auto& [start, length] : chunk_ranges(hs[static_cast<size_t>(dim)], o.chunks)) {
    T hc = narrow(h, dim, start, length).detach();
    hc.requires_grad_();
    const T lc = loss_of(hc, wl, narrow(targets, dim, start, length));
    backward(lc);
    dh_parts.push_back(hc.grad());
    total = total.defined() ? total + lc.detach() : lc.detach();
  }
  T dh = dh_parts.size() == 1 ? dh_parts.front() : cat(dh_parts, dim);
  T dw = wl.grad();
  T loss = total;
  if (o.reduction == LossReduction::Mean) {
    const double n = count();
    loss = total / n;
    dh = dh / n;
    dw = dw / n;
  }
  auto saved = std::make_shared<const Saved<T>>(Saved<T>{dh.detach(), dw.detach()});
  const std::vector<Var> inputs{to_var(h), to_var(w)};
  return record("chunked_cross_entropy", nullptr, inputs, {}, to_var(loss.detach()),
                chunked_backward<T>, saved)
      .template value<T>();
}

}  // namespace

Tensor chunked_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                             const ChunkedLossOptions& options, SourceLocation loc) {
  const UserCallSite site(loc);
  return chunked(h, w, targets, options);
}

DTensor chunked_cross_entropy(const DTensor& h, const DTensor& w, const DTensor& targets,
                              const ChunkedLossOptions& options, SourceLocation loc) {
  const UserCallSite site(loc);
  return chunked(h, w, targets, options);
}

}  // namespace spmd
