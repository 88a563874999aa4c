// spmd/collectives/typed.cpp: the type rules and backward collectives of the local collectives,
// and convert().
#include <spmd/collectives/typed.h>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/core/overloaded.h>
#include <spmd/ops/autograd.h>
#include <spmd/world/local_ops.h>

namespace spmd {

AxisType axis_type(const DeviceMesh& mesh, int d, SpmdType type, std::string_view via,
                   const SourceLocation& loc) {
  AxisType t{mesh.dim_name(d), type, via, loc, nullptr, std::make_shared<const DeviceMesh>(mesh)};
  if (types_data_check()) t.groups = std::make_shared<const AxisGroups>(mesh.groups(d));
  return t;
}

namespace {

bool is_sum(ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Avg;
}

[[noreturn]] void collective_error(CollectiveKind kind, const AxisType& in, std::string_view why) {
  throw_error<TypeError>("{}: along mesh axis '{}' the input is {}: {}", kind, in.axis,
                         describe(in), why);
}

constexpr std::string_view kDoubled =
    "its shards are already identical along the axis, so summing them again multiplies the value "
    "by the group size (a doubled reduction: this sum was done before)";
constexpr std::string_view kPartialIn =
    "a pending sum must be reduced (all_reduce or reduce_scatter) before it is moved";

// The output type along the dim; TypeError for an input type the collective contradicts. One
// rule per collective: a collective without its rule does not compile.
SpmdType output_type(const CollectiveOptions& options, const AxisType& in) {
  const SpmdType t = in.type;
  const CollectiveKind kind = kind_of(options);
  const bool p = t == SpmdType::P;
  const bool same = t == SpmdType::R || t == SpmdType::I;
  // A collective that moves values without reducing them: `out`, unless the input is a pending sum.
  auto moved = [&](SpmdType out) {
    if (p) collective_error(kind, in, kPartialIn);
    return out;
  };
  return std::visit(Overloaded{
                        [&](const AllReduceOptions& o) {
                          if (is_sum(o.op)) {
                            if (same) collective_error(kind, in, kDoubled);
                            return p ? SpmdType::R : SpmdType::I;
                          }
                          if (p) {
                            collective_error(
                                kind, in,
                                "a pending sum reduced with another op than sum means nothing; "
                                "all_reduce it with Sum first");
                          }
                          return SpmdType::I;
                        },
                        [&](const AllGatherOptions&) { return moved(SpmdType::R); },
                        [&](const ReduceScatterOptions& o) {
                          if (same) collective_error(kind, in, kDoubled);
                          if (!is_sum(o.op) && p)
                            collective_error(kind, in, "a pending sum reduces only by Sum");
                          return SpmdType::V;
                        },
                        [&](const AllToAllOptions&) { return moved(SpmdType::V); },
                        [&](const AllToAllSingleOptions&) { return moved(SpmdType::V); },
                        [&](const BroadcastOptions&) { return moved(SpmdType::R); },
                        [&](const ScatterOptions&) { return moved(SpmdType::V); },
                        [&](const GatherOptions&) { return moved(SpmdType::V); },
                        [&](const ReduceOptions& o) {
                          if (same && is_sum(o.op)) collective_error(kind, in, kDoubled);
                          return SpmdType::V;
                        },
                        [&](const PermuteOptions&) { return p ? SpmdType::P : SpmdType::V; },
                        // The token keeps the input's type; what arrives differs per rank.
                        [&](const SendOptions&) { return moved(t); },
                        [&](const RecvOptions&) { return SpmdType::V; },
                        [&](const BarrierOptions&) { return t; },
                    },
                    options);
}

// What the backward of one typed collective needs.
struct TypedCollective {
  DeviceMesh mesh;
  int dim;
  CollectiveOptions options;
  SpmdType in_type;
  std::string where;  // "all_gather over mesh dim 'tp' at x.cpp:12"
  // all_reduce Max/Min only: 1 where a rank's input is the result, else 0 (untyped, computed in
  // the forward so a later in-place change of the input cannot alter it).
  LocalTensor hit;
};

// Zeros on every rank but group rank `keep` of dim `d`.
LocalTensor keep_only(const LocalTensor& t, const DeviceMesh& mesh, int d, int64_t keep) {
  const PerRank<int64_t> local = mesh.local_rank(d);
  return t.with_types(nullptr).map([&](int r, const Tensor& x) {
    return local.at(r) == keep ? x : zeros(x.shape(), x.dtype(), x.device());
  });
}

void typed_collective_backward(BackwardContext& c) {
  const auto& tc = c.payload<TypedCollective>();
  const LocalTensor& g = c.grad().as<LocalTensor>();
  const int64_t n = tc.mesh.size(tc.dim);
  auto not_differentiable = [&]() -> LocalTensor {
    throw_error<Unsupported>(
        "backward: {} is not differentiable: its non-root ranks get empty results, and a "
        "LocalTensor whose shards differ in shape carries no gradient; use all_gather or "
        "all_reduce",
        tc.where);
  };
  // One backward per collective: a collective without its backward does not compile.
  const LocalTensor grad = std::visit(
      Overloaded{
          [&](const AllReduceOptions& o) -> LocalTensor {
            if (o.op == ReduceOp::Max || o.op == ReduceOp::Min) {
              // The result is I. An I input is the result itself (the identity); otherwise the
              // gradient goes to the ranks that hold the extreme, split evenly among ties (R
              // input: every rank ties, each gets g/n, a P gradient that sums to g).
              const LocalTensor gu = g.with_types(nullptr);
              if (tc.in_type == SpmdType::I) return gu;
              const LocalTensor hit = tc.hit.to(gu.dtype());
              return gu * hit / all_reduce(hit, tc.mesh, tc.dim, ReduceOp::Sum);
            }
            if (!is_sum(o.op)) {
              throw_error<Unsupported>(
                  "backward: {} with {} is not differentiable (Sum, Avg, Max and Min are)",
                  tc.where, o.op);
            }
            const double scale = o.op == ReduceOp::Avg ? 1.0 / static_cast<double>(n) : 1.0;
            // P -> R: the gradient is pending (P) and each input part needs all of it (R).
            if (tc.in_type == SpmdType::P) return all_reduce(g, tc.mesh, tc.dim, o.op);
            // V -> I: the gradient is the same on every rank (I), and it is each part's.
            return scale == 1.0 ? g : g * scale;
          },
          [&](const AllGatherOptions& o) {
            return reduce_scatter(g, tc.mesh, tc.dim, ReduceOp::Sum, o.gather_dim);
          },
          [&](const ReduceScatterOptions& o) {
            const LocalTensor full = all_gather(g, tc.mesh, tc.dim, o.scatter_dim);
            return o.op == ReduceOp::Avg ? full * (1.0 / static_cast<double>(n)) : full;
          },
          [&](const AllToAllOptions& o) {
            return all_to_all(g, tc.mesh, tc.dim, o.concat_dim, o.split_dim);
          },
          [&](const AllToAllSingleOptions& o) {
            return all_to_all_single(g, tc.mesh, tc.dim, o.in_splits, o.out_splits);
          },
          [&](const BroadcastOptions& o) {
            const LocalTensor summed = all_reduce(g, tc.mesh, tc.dim, ReduceOp::Sum);
            return tc.in_type == SpmdType::I ? summed : keep_only(summed, tc.mesh, tc.dim, o.src);
          },
          [&](const ScatterOptions& o) {
            return keep_only(all_gather(g, tc.mesh, tc.dim, o.scatter_dim), tc.mesh, tc.dim, o.src);
          },
          [&](const GatherOptions&) { return not_differentiable(); },
          [&](const ReduceOptions&) { return not_differentiable(); },
          [&](const PermuteOptions& o) {
            std::vector<int> inverse(o.dst_of.size(), -1);
            for (size_t i = 0; i < o.dst_of.size(); ++i) {
              if (o.dst_of[i] >= 0) {
                inverse[static_cast<size_t>(o.dst_of[i])] = static_cast<int>(i);
              }
            }
            return permute(g, tc.mesh, tc.dim, std::move(inverse));
          },
          // Recorded with their own backward whether typed or not (functional.cpp, Note
          // [Point-to-point]): never by record_typed_collective.
          [&](const SendOptions&) -> LocalTensor {
            throw_error<InternalError>("backward: {} reached the typed collectives' backward",
                                       tc.where);
          },
          [&](const RecvOptions&) -> LocalTensor {
            throw_error<InternalError>("backward: {} reached the typed collectives' backward",
                                       tc.where);
          },
          [&](const BarrierOptions&) { return not_differentiable(); },
      },
      tc.options);
  c.set_grad(0, local_var(grad));
}

}  // namespace

TypesPtr collective_types(const TypesPtr& in, const CollectiveOptions& options,
                          const DeviceMesh& mesh, int d, const SourceLocation& loc) {
  if (in == nullptr) return nullptr;
  const UserCallSite site(loc);
  if (in->world != 0 && in->world != mesh.world().state().id) {
    throw_error<TypeError>(
        "{}: the LocalTensor comes from world #{}, the mesh {} from {}: a collective runs on the "
        "values of its own world",
        kind_of(options), in->world, mesh.to_string(), mesh.world().to_string());
  }
  const AxisType& along = in->of(mesh.dim_name(d));
  AxisType named = along;
  named.axis = mesh.dim_name(d);
  const SpmdType out = output_type(options, named);
  return std::make_shared<const SpmdTypes>(
      in->with(axis_type(mesh, d, out, collective_name(kind_of(options)), loc)));
}

LocalTensor record_typed_collective(const LocalTensor& x, const LocalTensor& result,
                                    const CollectiveOptions& options, const DeviceMesh& mesh, int d,
                                    const SourceLocation& loc) {
  if (!grad_enabled() || !x.requires_grad() || !is_floating(result.dtype())) return result;
  const CollectiveKind kind = kind_of(options);
  TypedCollective tc{
      mesh,
      d,
      options,
      x.spmd_types()->of(mesh.dim_name(d)).type,
      fmt::format("{} over mesh dim '{}' at {}", kind, mesh.dim_name(d), site_text(loc)),
      {}};
  if (const auto* ar = std::get_if<AllReduceOptions>(&options);
      ar != nullptr && (ar->op == ReduceOp::Max || ar->op == ReduceOp::Min)) {
    const NoGradGuard no_grad;
    tc.hit = eq(x.with_types(nullptr), result.with_types(nullptr));
  }
  auto payload = std::make_shared<const TypedCollective>(std::move(tc));
  const Var in = local_var(x);
  return record(collective_name(kind), nullptr, {&in, 1}, {}, local_var(result),
                typed_collective_backward, std::move(payload))
      .value<LocalTensor>();
}

// ---- convert
// --------------------------------------------------------------------------------------

namespace {

struct Conversion {
  DeviceMesh mesh;
  int dim;
  SpmdType from;
  SpmdType to;
};

void convert_backward(BackwardContext& c) {
  const auto& steps = c.payload<std::vector<Conversion>>();
  LocalTensor g = c.grad().as<LocalTensor>();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const Conversion& s = *it;
    if (s.from == SpmdType::I && (s.to == SpmdType::R || s.to == SpmdType::V)) {
      g = all_reduce(g, s.mesh, s.dim, ReduceOp::Sum);
    } else if (s.from == SpmdType::R && s.to == SpmdType::I) {
      g = keep_only(g, s.mesh, s.dim, 0);
    } else if (s.from == SpmdType::R && s.to == SpmdType::P) {
      g = keep_only(g, s.mesh, s.dim, 0);
    }
  }
  c.set_grad(0, local_var(g));
}

}  // namespace

LocalTensor convert(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                    SourceLocation loc) {
  const UserCallSite site(loc);
  if (!t.defined()) throw_error<Error>("convert: the LocalTensor is undefined");
  if (!types_active() || t.spmd_types() == nullptr) return t;
  SpmdTypes out = *t.spmd_types();
  LocalTensor data = t.detach();
  auto steps = std::make_shared<std::vector<Conversion>>();
  for (const auto& [axis, want] : types) {
    check_axis_name(out, axis, "convert");
    const AxisType& got = out.of(axis);
    if (got.type == want) continue;
    const bool same = got.type == SpmdType::R || got.type == SpmdType::I;
    const bool local = same || (got.type == SpmdType::V && want == SpmdType::P);
    if (!local) {
      throw_error<TypeError>(
          "convert: along mesh axis '{}' {} cannot become {} without communication ({})", axis,
          describe(got), to_string(want),
          got.type == SpmdType::P ? "all_reduce makes a pending sum R, reduce_scatter V"
                                  : "all_gather makes varying shards R, all_reduce I");
    }
    if (got.mesh == nullptr) {
      throw_error<TypeError>(
          "convert: the mesh of axis '{}' is not known ({}): give the value its type along the "
          "axis with a collective, to_local or reinterpret after one",
          axis, describe(got));
    }
    const auto& mesh = *std::static_pointer_cast<const DeviceMesh>(got.mesh);
    const int d = mesh.resolve(axis);
    if (same && want == SpmdType::P) {
      const NoGradGuard no_grad;
      data = keep_only(data, mesh, d, 0).detach();
    }
    steps->push_back(Conversion{mesh, d, got.type, want});
    AxisType next = got;
    next.axis = axis;
    next.type = want;
    next.via = "convert";
    next.origin = loc;
    out = out.with(std::move(next));
  }
  LocalTensor result = data.with_types(std::make_shared<const SpmdTypes>(std::move(out)));
  check_types_against_data(result, "convert", loc);
  if (grad_enabled() && t.requires_grad() && is_floating(t.dtype())) {
    const Var in = local_var(t);
    result = record("convert", nullptr, {&in, 1}, {}, local_var(result), convert_backward,
                    std::move(steps))
                 .value<LocalTensor>();
  }
  return result;
}

}  // namespace spmd
