// spmd/ops/strategy.cpp: the strategy helpers, and the Partial rules of elementwise ops.
#include <spmd/ops/strategy.h>

#include <algorithm>

#include <spmd/core/check.h>

namespace spmd {
namespace {

// Strategies costed at most per cache miss; beyond it only the first ones are considered.
constexpr size_t kMaxStrategies = 4096;

Placements all_replicate(int mesh_ndim) {
  return Placements(static_cast<size_t>(mesh_ndim), Replicate{});
}

// The Partial combinations a binary op keeps: (a, b) -> out, with R as Replicate.
std::vector<DimOption> binary_partial_options(PartialRule rule) {
  const Placement R = Replicate{};
  auto P = [](ReduceOp o) { return Placement{Partial{o}}; };
  std::vector<DimOption> out;
  switch (rule) {
    case PartialRule::Additive:
    case PartialRule::Subtractive:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{P(o), P(o)}, P(o)});
      for (ReduceOp o : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        out.push_back({{P(o), R}, P(o)});
      }
      out.push_back({{R, P(ReduceOp::Avg)}, P(ReduceOp::Avg)});
      if (rule == PartialRule::Additive) {
        out.push_back({{R, P(ReduceOp::Max)}, P(ReduceOp::Max)});
        out.push_back({{R, P(ReduceOp::Min)}, P(ReduceOp::Min)});
      } else {
        out.push_back({{R, P(ReduceOp::Max)}, P(ReduceOp::Min)});
        out.push_back({{R, P(ReduceOp::Min)}, P(ReduceOp::Max)});
      }
      break;
    case PartialRule::Multiplicative:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
        out.push_back({{P(o), R}, P(o)});
        out.push_back({{R, P(o)}, P(o)});
      }
      break;
    case PartialRule::Divisive:
      for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{P(o), R}, P(o)});
      break;
    case PartialRule::Max:
    case PartialRule::Min: {
      const ReduceOp o = rule == PartialRule::Max ? ReduceOp::Max : ReduceOp::Min;
      out.push_back({{P(o), P(o)}, P(o)});
      out.push_back({{P(o), R}, P(o)});
      out.push_back({{R, P(o)}, P(o)});
      break;
    }
    case PartialRule::None:
    case PartialRule::Negation:
    case PartialRule::NonDecreasing:
      break;
  }
  return out;
}

}  // namespace

OpStrategy replicate_strategy(ShardingInputs in) {
  OpStrategy s;
  for (size_t t = 0; t < in.size(); ++t) s.inputs.push_back(all_replicate(in[0]->mesh_ndim()));
  s.output = all_replicate(in[0]->mesh_ndim());
  return s;
}

std::vector<OpStrategy> derived_strategies(
    ShardingInputs in, const std::function<std::optional<Placement>(const Placement&)>& map) {
  OpStrategy s;
  s.inputs.push_back(in[0]->placements());
  for (Placement& p : s.inputs[0]) {
    std::optional<Placement> out = map(p);
    if (!out) {
      p = Replicate{};
      out = map(p);
      SPMD_CHECK(out.has_value());
    }
    s.output.push_back(*out);
  }
  return {std::move(s), replicate_strategy(in)};
}

int aligned_dim(const Shape& in, const Shape& out, int o) {
  const int d = o - static_cast<int>(out.size() - in.size());
  if (d < 0) return -1;
  if (in[static_cast<size_t>(d)] != out[static_cast<size_t>(o)]) return -1;
  return d;
}

std::vector<OpStrategy> expand_dim_options(ShardingInputs inputs,
                                           const std::vector<DimOption>& options) {
  const size_t n = inputs.size();
  const int mesh_ndim = inputs[0]->mesh_ndim();
  auto all_replicate_option = [&](const DimOption& o) {
    return is_replicate(o.output) &&
           std::all_of(o.inputs.begin(), o.inputs.end(),
                       [](const Placement& p) { return is_replicate(p); });
  };
  std::vector<std::vector<const DimOption*>> per_dim(static_cast<size_t>(mesh_ndim));
  for (int i = 0; i < mesh_ndim; ++i) {
    auto& kept = per_dim[static_cast<size_t>(i)];
    for (const DimOption& o : options) {
      bool matches = all_replicate_option(o);
      for (size_t t = 0; t < n && !matches; ++t) {
        matches = o.inputs[t] == inputs[t]->placements()[static_cast<size_t>(i)];
      }
      if (matches && std::find(kept.begin(), kept.end(), &o) == kept.end()) kept.push_back(&o);
    }
    SPMD_CHECK_MSG(!kept.empty(), "expand_dim_options: no all-Replicate option");
  }
  std::vector<OpStrategy> out;
  std::vector<size_t> pick(static_cast<size_t>(mesh_ndim), 0);
  while (out.size() < kMaxStrategies) {
    OpStrategy s;
    s.inputs.assign(n, Placements(static_cast<size_t>(mesh_ndim)));
    s.output.resize(static_cast<size_t>(mesh_ndim));
    for (int i = 0; i < mesh_ndim; ++i) {
      const DimOption& o = *per_dim[static_cast<size_t>(i)][pick[static_cast<size_t>(i)]];
      for (size_t t = 0; t < n; ++t) s.inputs[t][static_cast<size_t>(i)] = o.inputs[t];
      s.output[static_cast<size_t>(i)] = o.output;
    }
    out.push_back(std::move(s));
    int i = mesh_ndim - 1;
    while (i >= 0 && ++pick[static_cast<size_t>(i)] == per_dim[static_cast<size_t>(i)].size()) {
      pick[static_cast<size_t>(i)] = 0;
      --i;
    }
    if (i < 0) break;
  }
  return out;
}

std::vector<OpStrategy> unary_pointwise_strategies(ShardingInputs in, PartialRule rule) {
  return derived_strategies(in, [rule](const Placement& p) -> std::optional<Placement> {
    const Partial* q = std::get_if<Partial>(&p);
    if (q == nullptr) return p;
    if (rule == PartialRule::Negation) {
      if (is_linear(q->op)) return p;
      if (is_min_max(q->op)) return swap_min_max(q->op);
    }
    if (rule == PartialRule::NonDecreasing && is_min_max(q->op)) return p;
    return std::nullopt;
  });
}

std::vector<OpStrategy> binary_pointwise_strategies(ShardingInputs in, const OpMeta& meta,
                                                    PartialRule rule) {
  std::vector<DimOption> options = {{{Replicate{}, Replicate{}}, Replicate{}}};
  for (int o = 0; o < static_cast<int>(meta.shape.size()); ++o) {
    const int da = aligned_dim(in[0]->shape(), meta.shape, o);
    const int db = aligned_dim(in[1]->shape(), meta.shape, o);
    if (da < 0 && db < 0) continue;
    options.push_back({{da >= 0 ? Placement{Shard{da}} : Placement{Replicate{}},
                        db >= 0 ? Placement{Shard{db}} : Placement{Replicate{}}},
                       Shard{o}});
  }
  for (DimOption& o : binary_partial_options(rule)) options.push_back(std::move(o));
  return expand_dim_options(in, options);
}

std::vector<DimOption> pointwise_shard_options(ShardingInputs in, const OpMeta& meta) {
  const size_t n = in.size();
  std::vector<DimOption> options = {{std::vector<Placement>(n, Replicate{}), Replicate{}}};
  for (int o = 0; o < static_cast<int>(meta.shape.size()); ++o) {
    DimOption option{{}, Shard{o}};
    bool any = false;
    for (size_t t = 0; t < n; ++t) {
      const int d = aligned_dim(in[t]->shape(), meta.shape, o);
      any = any || d >= 0;
      option.inputs.push_back(d >= 0 ? Placement{Shard{d}} : Placement{Replicate{}});
    }
    if (any) options.push_back(std::move(option));
  }
  return options;
}

std::vector<OpStrategy> linear_pointwise_strategies(ShardingInputs in, const OpMeta& meta) {
  const size_t n = in.size();
  std::vector<DimOption> options = pointwise_shard_options(in, meta);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DimOption option{std::vector<Placement>(n, Replicate{}), Partial{op}};
    option.inputs[0] = Partial{op};
    options.push_back(std::move(option));
  }
  return expand_dim_options(in, options);
}

}  // namespace spmd
