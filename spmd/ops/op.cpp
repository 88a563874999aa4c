// spmd/ops/op.cpp: call() and the OpArgs helpers.
#include <spmd/ops/op.h>

#include <algorithm>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/selective.h>
#include <spmd/tensor/factory.h>

namespace spmd {

std::size_t OpArgs::hash() const {
  std::size_t seed = ints.size() * 131 + reals.size();
  for (int64_t v : ints) hash_combine(seed, v);
  for (double v : reals) hash_combine(seed, v);
  return seed;
}

std::string OpArgs::to_string() const {
  std::string out;
  if (!ints.empty()) out += "ints=" + shape_str(ints);
  if (!reals.empty()) {
    out += out.empty() ? "reals=[" : " reals=[";
    for (size_t i = 0; i < reals.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", reals[i]);
    out += "]";
  }
  if (seed != 0) out += fmt::format("{}seed={}", out.empty() ? "" : " ", seed);
  return out;
}

namespace {
constexpr size_t kInlineInputs = 4;
}  // namespace

OpMeta op_meta(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args) {
  InputMeta inline_metas[kInlineInputs];
  std::vector<InputMeta> heap_metas;
  InputMeta* metas = inline_metas;
  if (inputs.size() > kInlineInputs) {
    heap_metas.resize(inputs.size());
    metas = heap_metas.data();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      throw_error<Error>("{}: argument {} is an undefined tensor", op.name, i + 1);
    }
    metas[i] = InputMeta{&inputs[i].shape(), inputs[i].dtype()};
  }
  return op_meta(op, std::span<const InputMeta>(metas, inputs.size()), args);
}

OpMeta op_meta(const OpDef& op, std::span<const InputMeta> inputs, const OpArgs& args) {
  if (!op.float8) [[likely]] {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (is_float8(inputs[i].dtype)) [[unlikely]] {
        throw_error<Unsupported>(
            "{}: argument {} (shape {}) is {}: float8 tensors take casts, copies, views, cat and "
            "scaled_mm only, as in PyTorch (Note [Float8 ops] in spmd/ops/op.h); convert with "
            "to(DType::BF16) or to(DType::F32) first",
            op.name, i + 1, shape_str(*inputs[i].shape), inputs[i].dtype);
      }
    }
  }
  return op.meta(inputs, args);
}

namespace {

// The op's result: its computation, or for shape-only inputs its meta alone (Note [Shape-only
// tensors] in tensor/meta.h).
Tensor compute(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args,
               const OpMeta& meta) {
  if (std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.is_meta(); })) {
    return empty(meta.shape, meta.dtype, meta_device());
  }
  return op.compute(inputs, args, meta);
}

}  // namespace

Tensor call(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args) {
  const AllocationScope allocating(op.name);  // Note [Out of memory] in tensor/factory.h
  const OpMeta meta = op_meta(op, inputs, args);
  // Note [Selective recompute]: a kept output, saved or taken.
  if (SelectiveScope* kept = selective_scope("Tensor", op.name)) [[unlikely]] {
    if (kept->mode() == SelectiveScope::Mode::Save) {
      Tensor out;
      {
        const SelectiveScope::Inside inside(*kept);
        out = compute(op, inputs, args, meta);
      }
      kept->save(op.name, out);
      return out;
    }
    const Tensor out = kept->take(op.name).tensor();
    if (!grad_enabled() || !is_floating(meta.dtype) ||
        std::none_of(inputs.begin(), inputs.end(),
                     [](const Tensor& t) { return t.requires_grad(); })) {
      return out;
    }
    const std::vector<Var> vars(inputs.begin(), inputs.end());
    return record(op.name, &op, vars, args, out).value<Tensor>();
  }
  if (!grad_enabled() || !is_floating(meta.dtype) ||
      std::none_of(inputs.begin(), inputs.end(),
                   [](const Tensor& t) { return t.requires_grad(); })) {
    return compute(op, inputs, args, meta);
  }
  // Note [Autograd]: the computation itself records nothing (its inner ops and Tensor methods run
  // with grad mode off); the op is one node.
  Tensor out;
  {
    NoGradGuard no_grad;
    out = compute(op, inputs, args, meta);
  }
  const std::vector<Var> vars(inputs.begin(), inputs.end());
  return record(op.name, &op, vars, args, out).value<Tensor>();
}

Tensor compute_piece(const OpDef& op, std::span<const Tensor> pieces, const OpArgs& args,
                     const PieceContext& where) {
  if (std::any_of(pieces.begin(), pieces.end(), [](const Tensor& t) { return t.is_meta(); })) {
    return empty(where.local_shape, where.output.dtype(), meta_device());
  }
  if (op.piece != nullptr) return op.piece(pieces, args, where);
  return call(op, pieces, args);
}

Tensor reference(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args) {
  if (op.reference != nullptr) return op.reference(inputs, args);
  return call(op, inputs, args);
}

}  // namespace spmd
