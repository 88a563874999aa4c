// spmd/ops/grouped.cpp: grouped_mm, the experts' matmul of a mixture-of-experts layer, and the
// entry its weight gradient uses.
//
// Note [Grouped matmul]
// grouped_mm (x [N, K], w [G, K, M], sizes [G] I64) -> [N, M]: the rows of x come in G consecutive
// groups of sizes[0], sizes[1], ... rows (they must add up to N), and group g is multiplied by
// w[g]. It is torch._grouped_mm's 2-D x 3-D case with the group sizes given as counts instead of
// offsets, and Megatron's GroupedMLP: an MoE layer sorts its tokens by expert and runs every
// expert in one call. The sizes are data (an index input), so every rank of a LocalTensor may hold
// its own split of its own rows (expert parallelism: each rank receives a different number of
// tokens per expert), and a shape-only run (--spmd-tensors=meta) needs none of them.
//   backward: dx = grouped_mm(dy, w^T per group, sizes); dw = grouped_mm_backward (x, dy, sizes)
//   [G, K, M], group g's x_g^T dy_g (a group with no rows gets a zero gradient).
// Sharding: the rows are tied to the sizes, so they are never split; the weights' output columns
// may be (w S(2) -> S(1), the tensor-parallel split of an expert's first layer), the inner dim
// too (x S(1), w S(1) -> P(sum), its second layer), and a pending sum in one operand passes.
// Its cost counts 2 N K M flops, as one matmul of all rows would.
#include <cstdint>
#include <string>
#include <vector>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>

namespace spmd {
namespace {

void check_sizes(std::string_view op, const InputMeta& sizes, int64_t groups) {
  if (sizes.dtype != DType::I64 && sizes.dtype != DType::I32) {
    throw_error<Unsupported>("{}: the group sizes must be an integer tensor, got dtype {}", op,
                             sizes.dtype);
  }
  if (sizes.shape->size() != 1 || (*sizes.shape)[0] != groups) {
    throw_error<ShapeError>("{}: the group sizes must be 1-D with one count per group ({}), got {}",
                            op, groups, shape_str(*sizes.shape));
  }
}

DType floating_result(std::string_view op, DType a, DType b) {
  const DType dtype = promote_types(a, b);
  if (!is_floating(dtype)) {
    throw_error<Unsupported>("{}: expects floating inputs, got dtypes {} and {}", op, a, b);
  }
  return dtype;
}

OpMeta grouped_mm_meta(std::span<const InputMeta> in, const OpArgs&) {
  const Shape& x = *in[0].shape;
  const Shape& w = *in[1].shape;
  if (x.size() != 2 || w.size() != 3 || x[1] != w[1]) {
    throw_error<ShapeError>(
        "grouped_mm: expects x [N, K] and w [G, K, M] with one inner size K, got x {} and w {}",
        shape_str(x), shape_str(w));
  }
  check_sizes("grouped_mm", in[2], w[0]);
  return OpMeta{{x[0], w[2]}, floating_result("grouped_mm", in[0].dtype, in[1].dtype)};
}

OpMeta grouped_mm_backward_meta(std::span<const InputMeta> in, const OpArgs&) {
  const Shape& x = *in[0].shape;
  const Shape& g = *in[1].shape;
  const Shape& sizes = *in[2].shape;
  if (x.size() != 2 || g.size() != 2 || x[0] != g[0] || sizes.size() != 1) {
    throw_error<ShapeError>(
        "grouped_mm_backward: expects x [N, K], grad [N, M] and sizes [G], got x {}, grad {}, "
        "sizes {}",
        shape_str(x), shape_str(g), shape_str(sizes));
  }
  check_sizes("grouped_mm_backward", in[2], sizes[0]);
  return OpMeta{{sizes[0], x[1], g[1]},
                floating_result("grouped_mm_backward", in[0].dtype, in[1].dtype)};
}

// The groups' first rows, checked: non-negative sizes adding up to `rows`.
std::vector<int64_t> group_starts(std::string_view op, const Tensor& sizes, int64_t rows) {
  const std::vector<int64_t> counts = sizes.to(DType::I64).to(Device{}).to_vector<int64_t>();
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] < 0) {
      throw_error<ShapeError>("{}: group {} has a negative size {} (sizes {})", op, g, counts[g],
                              shape_str(counts));
    }
    starts.push_back(total);
    total += counts[g];
  }
  if (total != rows) {
    throw_error<ShapeError>("{}: the group sizes {} add up to {}, but the input has {} rows", op,
                            shape_str(counts), total, rows);
  }
  starts.push_back(total);
  return starts;
}

Tensor grouped_mm_compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  const Tensor x = in[0].to(out.dtype);
  const Tensor w = in[1].to(out.dtype);
  const std::vector<int64_t> starts = group_starts("grouped_mm", in[2], x.size(0));
  Tensor result = zeros(out.shape, out.dtype, x.device());
  for (size_t g = 0; g + 1 < starts.size(); ++g) {
    const int64_t n = starts[g + 1] - starts[g];
    if (n == 0) continue;
    result.narrow(0, starts[g], n)
        .copy_(matmul(x.narrow(0, starts[g], n), w.select(0, static_cast<int64_t>(g))));
  }
  return result;
}

Tensor grouped_mm_backward_compute(std::span<const Tensor> in, const OpArgs&, const OpMeta& out) {
  const Tensor x = in[0].to(out.dtype);
  const Tensor g = in[1].to(out.dtype);
  const std::vector<int64_t> starts = group_starts("grouped_mm_backward", in[2], x.size(0));
  Tensor result = zeros(out.shape, out.dtype, x.device());
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const int64_t n = starts[k + 1] - starts[k];
    if (n == 0) continue;
    result.select(0, static_cast<int64_t>(k))
        .copy_(matmul(x.narrow(0, starts[k], n).transpose(0, 1), g.narrow(0, starts[k], n)));
  }
  return result;
}

std::vector<OpStrategy> grouped_mm_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  const Placement R = Replicate{};
  std::vector<DimOption> options = {
      {{R, R, R}, R},
      {{R, Shard{2}, R}, Shard{1}},
      {{Shard{1}, Shard{1}, R}, Partial{}},
  };
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
    options.push_back({{Partial{o}, R, R}, Partial{o}});
    options.push_back({{R, Partial{o}, R}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

std::vector<OpStrategy> grouped_mm_backward_strategies(ShardingInputs in, const OpArgs&,
                                                       const OpMeta&) {
  const Placement R = Replicate{};
  std::vector<DimOption> options = {
      {{R, R, R}, R},
      {{Shard{1}, R, R}, Shard{1}},
      {{R, Shard{1}, R}, Shard{2}},
  };
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
    options.push_back({{Partial{o}, R, R}, Partial{o}});
    options.push_back({{R, Partial{o}, R}, Partial{o}});
  }
  return expand_dim_options(in, options);
}

void grouped_mm_derivative(BackwardContext& c) {
  const Var& sizes = c.input(2);
  if (c.needs_grad(0)) {
    const Var wt = apply(op::transpose, {c.input(1)}, {{-1, -2}, {}});
    c.set_grad(0, apply(op::grouped_mm, {c.grad(), wt, sizes}));
  }
  if (c.needs_grad(1)) c.set_grad(1, apply(op::grouped_mm_backward, {c.input(0), c.grad(), sizes}));
}

// 2 N K M: x [N, K] and w's [K, M] (or grad [N, M]).
double grouped_mm_flops(std::span<const InputMeta> in, const OpMeta& out) {
  const double rows = static_cast<double>((*in[0].shape)[0]);
  const double inner = static_cast<double>((*in[0].shape)[1]);
  const double cols = static_cast<double>(out.shape.back());
  return 2.0 * rows * inner * cols;
}

}  // namespace

const OpDef op::grouped_mm{
    .name = "grouped_mm",
    .meta = grouped_mm_meta,
    .compute = grouped_mm_compute,
    .strategies = grouped_mm_strategies,
    .backward = grouped_mm_derivative,
    .partial_use = PartialUse::One,
    .flops = grouped_mm_flops,
};
const OpDef op::grouped_mm_backward{
    .name = "grouped_mm_backward",
    .meta = grouped_mm_backward_meta,
    .compute = grouped_mm_backward_compute,
    .strategies = grouped_mm_backward_strategies,
    .partial_use = PartialUse::One,
    .flops = grouped_mm_flops,
};

}  // namespace spmd
