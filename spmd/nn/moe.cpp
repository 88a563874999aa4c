// spmd/nn/moe.cpp: the mixture-of-experts layer (nn/moe.h, Note [Expert parallelism]).
#include <spmd/nn/moe.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <variant>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/dtensor/ops.h>
#include <spmd/nn/parallel.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

// One rank's (or one device's) routing of its T tokens, on the host.
struct Routing {
  int64_t tokens = 0;
  std::vector<int64_t> choice;      // [T k]: the expert of choice a = t k + j
  std::vector<int64_t> order;       // the kept choices, sorted by expert (then by a)
  std::vector<int64_t> per_expert;  // kept choices per expert [E]
  std::vector<int64_t> load;        // all choices per expert [E]
  std::vector<int64_t> slot;        // [T k]: a's row in `order`, or order.size() when dropped

  std::vector<int64_t> token_rows(int64_t k) const {
    std::vector<int64_t> rows;
    rows.reserve(order.size());
    for (int64_t a : order) rows.push_back(a / k);
    return rows;
  }
};

// Top-k by probability (ties: the lower expert), then capacity and the sort by expert. `probs`
// [T E] row-major, or absent in a shape-only run (balanced synthetic choices).
Routing route(const std::optional<std::vector<double>>& probs, int64_t tokens, int64_t experts,
              const MoEOptions& o) {
  const int64_t k = o.top_k;
  Routing r;
  r.tokens = tokens;
  r.choice.resize(static_cast<size_t>(tokens * k));
  std::vector<int64_t> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    if (!probs) {
      for (int64_t j = 0; j < k; ++j)
        r.choice[static_cast<size_t>(t * k + j)] = (t * k + j) % experts;
      continue;
    }
    const double* p = probs->data() + t * experts;
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < k; ++j)
      r.choice[static_cast<size_t>(t * k + j)] = ids[static_cast<size_t>(j)];
  }
  const int64_t capacity =
      o.capacity_factor > 0.0
          ? static_cast<int64_t>(std::ceil(o.capacity_factor * static_cast<double>(tokens * k) /
                                           static_cast<double>(experts)))
          : tokens * k;
  r.per_expert.assign(static_cast<size_t>(experts), 0);
  r.load.assign(static_cast<size_t>(experts), 0);
  std::vector<bool> kept(r.choice.size(), false);
  // First choices before second ones, then token order (GShard's priority).
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < tokens; ++t) {
      const auto a = static_cast<size_t>(t * k + j);
      const auto e = static_cast<size_t>(r.choice[a]);
      ++r.load[e];
      if (r.per_expert[e] < capacity) {
        ++r.per_expert[e];
        kept[a] = true;
      }
    }
  }
  for (size_t a = 0; a < kept.size(); ++a) {
    if (kept[a]) r.order.push_back(static_cast<int64_t>(a));
  }
  std::stable_sort(r.order.begin(), r.order.end(), [&](int64_t a, int64_t b) {
    return r.choice[static_cast<size_t>(a)] < r.choice[static_cast<size_t>(b)];
  });
  r.slot.assign(r.choice.size(), static_cast<int64_t>(r.order.size()));
  for (size_t i = 0; i < r.order.size(); ++i)
    r.slot[static_cast<size_t>(r.order[i])] = static_cast<int64_t>(i);
  return r;
}

Tensor index_tensor(const std::vector<int64_t>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())});
}

// The experts on rows sorted by expert: SwiGLU per group.
template <class T, class S>
T experts_ffn(const T& rows, const T& w1, const T& w3, const T& w2, const S& sizes) {
  const T h = silu(grouped_mm(rows, w1, sizes)) * grouped_mm(rows, w3, sizes);
  return grouped_mm(h, w2, sizes);
}

// Each token's k results (rows of `out` at its choices' slots; a dropped choice's slot is the
// zero row appended) weighted by the gates and added: [T, d].
template <class T, class I>
T combine(const T& out, const T& zero_row, const I& slots, const T& gates, int64_t k, int64_t d) {
  const T rows = index_select(cat({out, zero_row}, 0), 0, slots);
  return sum(reshape(rows, {-1, k, d}) * unsqueeze(gates, -1), {1});
}

struct Dims {
  int64_t d = 0, experts = 0, hidden = 0;
};

Dims check_moe(const Shape& x, const Shape& router, const Shape& w1, const Shape& w3,
               const Shape& w2, const MoEOptions& o) {
  if (x.empty() || router.size() != 2 || router[0] != x.back()) {
    throw_error<ShapeError>(
        "moe: expects tokens x [..., d] and a router [d, E], got x {} and router {}", shape_str(x),
        shape_str(router));
  }
  Dims dims{x.back(), router[1], w1.size() == 3 ? w1[2] : -1};
  const Shape up{dims.experts, dims.d, dims.hidden};
  const Shape down{dims.experts, dims.hidden, dims.d};
  if (w1 != up || w3 != up || w2 != down) {
    throw_error<ShapeError>(
        "moe: expects experts w1 and w3 [E, d, f] and w2 [E, f, d] for d = {} and E = {} (the "
        "router's), got w1 {}, w3 {}, w2 {}",
        dims.d, dims.experts, shape_str(w1), shape_str(w3), shape_str(w2));
  }
  if (o.top_k < 1 || o.top_k > dims.experts) {
    throw_error<ConfigError>("moe: top_k must be in 1..{} (the experts), got {}", dims.experts,
                             o.top_k);
  }
  if (!(o.capacity_factor >= 0.0) || !std::isfinite(o.capacity_factor)) {
    throw_error<ConfigError>("moe: capacity_factor must be 0 (no limit) or positive, got {}",
                             o.capacity_factor);
  }
  return dims;
}

template <class T>
T gates_of(const T& probs, const T& choice, const MoEOptions& o) {
  const T gates = gather(probs, 1, choice);
  return o.normalize_gates ? gates / sum(gates, {-1}, true) : gates;
}

std::optional<std::vector<double>> values_of(const Tensor& probs) {
  if (probs.is_meta()) return std::nullopt;
  return probs.to(DType::F64).to(Device{}).to_vector<double>();
}

// The load per expert as fractions of the batch's choices, in `dtype`.
Tensor load_fraction(const std::vector<int64_t>& load, int64_t choices, DType dtype) {
  std::vector<double> f;
  for (int64_t n : load) f.push_back(static_cast<double>(n) / static_cast<double>(choices));
  return from_vector(f, {static_cast<int64_t>(f.size())}).to(dtype);
}

}  // namespace

MoEOutput<Tensor> moe(const Tensor& x, const MoEWeights<Tensor>& w, const MoEOptions& o,
                      SourceLocation loc) {
  const UserCallSite site(loc);
  const Dims dims =
      check_moe(x.shape(), w.router.shape(), w.w1.shape(), w.w3.shape(), w.w2.shape(), o);
  const int64_t k = o.top_k;
  const Tensor x2 = reshape(x, {-1, dims.d});
  const int64_t tokens = x2.size(0);
  const Tensor probs = softmax(matmul(x2, w.router), -1);
  const Routing r = route(values_of(probs), tokens, dims.experts, o);
  const Tensor gates = gates_of(probs, from_vector(r.choice, {tokens, k}), o);
  const Tensor rows = index_select(x2, 0, index_tensor(r.token_rows(k)));
  const Tensor out = experts_ffn(rows, w.w1, w.w3, w.w2, index_tensor(r.per_expert));
  const Tensor y = combine(out, zeros({1, dims.d}, out.dtype(), out.device()), index_tensor(r.slot),
                           gates, k, dims.d);
  MoEOutput<Tensor> result;
  result.out = reshape(y, x.shape());
  const Tensor f = load_fraction(r.load, tokens * k, probs.dtype());
  result.aux_loss = sum(mean(probs, {0}) * f) * static_cast<double>(dims.experts);
  result.load = r.load;
  result.dropped = tokens * k - static_cast<int64_t>(r.order.size());
  return result;
}

MoEOutput<DTensor> moe(const DTensor& x_in, const MoEWeights<DTensor>& w_in, const MoEOptions& o,
                       SourceLocation loc) {
  const UserCallSite site(loc);
  const Dims dims = check_moe(x_in.shape(), w_in.router.shape(), w_in.w1.shape(), w_in.w3.shape(),
                              w_in.w2.shape(), o);
  const int64_t k = o.top_k;
  const DeviceMesh& mesh = x_in.mesh();
  const int ep = mesh.resolve(o.ep);
  // Along mesh dims of one rank any placement is the layout wanted (an ep of 1, the one-rank run
  // of --spmd-debug=parity): the tokens split over ep, the router replicated, the experts split
  // by expert over ep.
  Placements x_wanted = x_in.placements();
  for (int m = 0; m < mesh.ndim(); ++m) {
    Placement& p = x_wanted[static_cast<size_t>(m)];
    if (is_partial(p)) p = Replicate{};
    if (m == ep && is_replicate(p)) p = Shard{0};
  }
  const DTensor x = with_size_one_dims(x_in, x_wanted);
  MoEWeights<DTensor> w = w_in;
  for (DTensor* t : {&w.router, &w.w1, &w.w3, &w.w2}) {
    if (!(t->mesh() == mesh)) continue;  // reported below
    *t = with_size_one_dims(
        *t, t == &w.router ? replicate_placements(mesh) : placed_on(mesh, ep, Shard{0}));
  }
  const int64_t ep_size = mesh.size(ep);
  const std::string ep_name = mesh.dim_name(ep);
  for (const DTensor* t : {&w.router, &w.w1, &w.w3, &w.w2}) {
    if (!(t->mesh() == mesh)) {
      throw_error<PlacementError>("moe: the weights must be on the tokens' mesh {}, got one on {}",
                                  mesh.to_string(), t->mesh().to_string());
    }
  }
  if (dims.experts % ep_size != 0) {
    throw_error<ConfigError>("moe: {} experts do not split over {} = {} ranks (mesh {})",
                             dims.experts, ep_name, ep_size, mesh.to_string());
  }
  // The tokens: split over ep, nowhere Partial, the feature dim whole.
  const Placements& xp = x.placements();
  const int nd = static_cast<int>(x.shape().size());
  Placements router_claim, expert_claim;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = xp[static_cast<size_t>(m)];
    if (is_partial(p) || is_shard(p, nd - 1)) {
      throw_error<PlacementError>(
          "moe: the tokens x {} must be split by token (not Partial, the feature dim whole), got "
          "{} on mesh dim {} of {}",
          shape_str(x.shape()), to_string(xp), mesh.dim_name(m), mesh.to_string());
    }
    const bool splits = !is_replicate(p);
    router_claim.push_back(splits ? Placement{Partial{}} : Placement{Replicate{}});
    expert_claim.push_back(m == ep ? Placement{Shard{0}} : router_claim.back());
  }
  if (is_replicate(xp[static_cast<size_t>(ep)])) {
    throw_error<PlacementError>(
        "moe: the tokens x must be split over the expert-parallel dim {} (each rank routes its own "
        "tokens), got {} on mesh {}; shard the batch or the sequence over {}",
        ep_name, to_string(xp), mesh.to_string(), ep_name);
  }
  const Placements expert_placements = placed_on(mesh, ep, Shard{0});
  if (!(w.router.placements() == Placements(static_cast<size_t>(mesh.ndim()), Replicate{}))) {
    throw_error<PlacementError>("moe: the router must be Replicate on mesh {}, got {}",
                                mesh.to_string(), to_string(w.router.placements()));
  }
  for (const DTensor* t : {&w.w1, &w.w3, &w.w2}) {
    if (!(t->placements() == expert_placements)) {
      throw_error<PlacementError>(
          "moe: the experts must be split by expert over {} and Replicate elsewhere ({}), got {}",
          ep_name, to_string(expert_placements), to_string(t->placements()));
    }
  }

  const int64_t local_experts = dims.experts / ep_size;
  // The held ranks the mesh holds (a pipeline stage's mesh holds only some of the world's).
  const PerRank<int64_t> ep_rank = mesh.local_rank(ep);
  const std::vector<int>& held = ep_rank.ranks();

  const LocalTensor xl = x.to_local();
  const LocalTensor x2 = reshape(xl, {-1, dims.d});
  const LocalTensor router = w.router.to_local(router_claim);
  const LocalTensor w1 = w.w1.to_local(expert_claim);
  const LocalTensor w3 = w.w3.to_local(expert_claim);
  const LocalTensor w2 = w.w2.to_local(expert_claim);
  const LocalTensor probs = softmax(matmul(x2, router), -1);

  // 1. Each rank routes its own tokens.
  std::map<int, Routing> routing;
  for (int r : held) {
    const Tensor& p = probs.shard(r);
    routing[r] = route(values_of(p), p.size(0), dims.experts, o);
  }
  auto per_rank = [&](auto&& fn) { return mesh_from_fn(mesh, held, fn); };
  const LocalTensor choice = per_rank([&](int r) {
    return from_vector(routing.at(r).choice, {routing.at(r).tokens, k});
  });
  const LocalTensor gates = gates_of(probs, choice, o);

  // 2. Counts: what each rank sends to each peer's experts, and what it receives.
  const auto send_split = PerRank<std::vector<int64_t>>::from_fn(held, [&](int r) {
    std::vector<int64_t> split(static_cast<size_t>(ep_size), 0);
    const std::vector<int64_t>& n = routing.at(r).per_expert;
    for (int64_t e = 0; e < dims.experts; ++e)
      split[static_cast<size_t>(e / local_experts)] += n[static_cast<size_t>(e)];
    return split;
  });
  const LocalTensor counts =
      per_rank([&](int r) { return index_tensor(routing.at(r).per_expert); });
  const LocalTensor received_counts = all_to_all(counts, mesh, ep);
  // recv[r][s * local_experts + e]: rows rank r gets from ep peer s for its local expert e.
  std::map<int, std::vector<int64_t>> recv;
  for (int r : held) {
    const Tensor& c = received_counts.shard(r);
    if (!c.is_meta()) {
      recv[r] = c.to(Device{}).to_vector<int64_t>();
      continue;
    }
    // A shape-only run: every peer routed as this rank did (balanced synthetic choices).
    std::vector<int64_t> v;
    const int64_t q = ep_rank.at(r);
    for (int64_t s = 0; s < ep_size; ++s) {
      for (int64_t e = 0; e < local_experts; ++e) {
        v.push_back(routing.at(r).per_expert[static_cast<size_t>(q * local_experts + e)]);
      }
    }
    recv[r] = std::move(v);
  }
  const auto recv_split = PerRank<std::vector<int64_t>>::from_fn(held, [&](int r) {
    std::vector<int64_t> split(static_cast<size_t>(ep_size), 0);
    for (int64_t s = 0; s < ep_size; ++s) {
      for (int64_t e = 0; e < local_experts; ++e) {
        split[static_cast<size_t>(s)] += recv.at(r)[static_cast<size_t>(s * local_experts + e)];
      }
    }
    return split;
  });

  // 3. Dispatch, regroup by local expert, the experts.
  const LocalTensor rows = index_select(
      x2, 0, per_rank([&](int r) { return index_tensor(routing.at(r).token_rows(k)); }));
  const LocalTensor arrived = all_to_all_single(rows, mesh, ep, recv_split, send_split);
  std::map<int, std::vector<int64_t>> by_expert;  // arrived rows in (local expert, source) order
  for (int r : held) {
    const std::vector<int64_t>& n = recv.at(r);
    std::vector<int64_t> start(n.size(), 0);
    int64_t at = 0;
    for (size_t i = 0; i < n.size(); ++i) {
      start[i] = at;
      at += n[i];
    }
    std::vector<int64_t> perm;
    for (int64_t e = 0; e < local_experts; ++e) {
      for (int64_t s = 0; s < ep_size; ++s) {
        const auto i = static_cast<size_t>(s * local_experts + e);
        for (int64_t row = 0; row < n[i]; ++row) perm.push_back(start[i] + row);
      }
    }
    by_expert[r] = std::move(perm);
  }
  const LocalTensor grouped =
      index_select(arrived, 0, per_rank([&](int r) { return index_tensor(by_expert.at(r)); }));
  const LocalTensor sizes = per_rank([&](int r) {
    std::vector<int64_t> n(static_cast<size_t>(local_experts), 0);
    for (int64_t s = 0; s < ep_size; ++s) {
      for (int64_t e = 0; e < local_experts; ++e) {
        n[static_cast<size_t>(e)] += recv.at(r)[static_cast<size_t>(s * local_experts + e)];
      }
    }
    return index_tensor(n);
  });
  const LocalTensor expert_out = experts_ffn(grouped, w1, w3, w2, sizes);

  // 4. Home again, and each token's choices added.
  const LocalTensor unsorted = index_select(expert_out, 0, per_rank([&](int r) {
                                              const std::vector<int64_t>& perm = by_expert.at(r);
                                              std::vector<int64_t> inverse(perm.size());
                                              for (size_t i = 0; i < perm.size(); ++i) {
                                                inverse[static_cast<size_t>(perm[i])] =
                                                    static_cast<int64_t>(i);
                                              }
                                              return index_tensor(inverse);
                                            }));
  const LocalTensor returned = all_to_all_single(unsorted, mesh, ep, send_split, recv_split);
  const LocalTensor zero_row = per_rank([&](int) {
    return zeros({1, dims.d}, x.dtype(), returned.shard(held.front()).device());
  });
  const LocalTensor y =
      combine(returned, zero_row, per_rank([&](int r) { return index_tensor(routing.at(r).slot); }),
              gates, k, dims.d);

  // The output in x's local shapes (one dim may differ between ranks: uneven pieces).
  Shape local_shape = xl.shard(held.front()).shape();
  for (int r : held) {
    const Shape& s = xl.shard(r).shape();
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != local_shape[i]) local_shape[i] = -1;
    }
  }
  if (std::count(local_shape.begin(), local_shape.end(), -1) > 1) {
    throw_error<ShapeError>(
        "moe: the ranks' pieces of x {} differ in more than one dim (placements {} on mesh {}); "
        "split the tokens evenly",
        shape_str(x.shape()), to_string(xp), mesh.to_string());
  }
  MoEOutput<DTensor> result;
  result.out = DTensor::from_local(reshape(y, local_shape), mesh, xp, x.shape());

  // The load over the whole batch and the dropped choices: summed over every token-splitting dim.
  LocalTensor load = per_rank([&](int r) {
    std::vector<int64_t> v = routing.at(r).load;
    v.push_back(static_cast<int64_t>(routing.at(r).choice.size() - routing.at(r).order.size()));
    return index_tensor(v);
  });
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!is_replicate(xp[static_cast<size_t>(m)])) load = all_reduce(load, mesh, m);
  }
  const int64_t tokens = shape_numel(x.shape()) / dims.d;
  const Tensor& total = load.shard(held.front());
  if (!total.is_meta()) {
    result.load = total.to(Device{}).to_vector<int64_t>();
    result.dropped = result.load.back();
    result.load.pop_back();
  }
  const Tensor f = total.is_meta()
                       ? zeros({dims.experts}, probs.shard(held.front()).dtype())
                       : load_fraction(result.load, tokens * k, probs.shard(held.front()).dtype());
  const LocalTensor partial_aux =
      sum(sum(probs, {0}) * f) * (static_cast<double>(dims.experts) / static_cast<double>(tokens));
  result.aux_loss = DTensor::from_local(partial_aux, mesh, router_claim, Shape{},
                                        Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
  return result;
}

}  // namespace spmd
