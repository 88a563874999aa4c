// spmd/nn/context_parallel.cpp: ring and all-gather attention over a sequence split across a mesh
// dim (nn/context_parallel.h, Note [Context parallelism]).
#include <spmd/nn/context_parallel.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <spmd/collectives/functional.h>
#include <spmd/core/error.h>
#include <spmd/nn/parallel.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

namespace spmd {

std::vector<int64_t> zigzag_order(int64_t seq, int64_t cp) {
  if (cp < 1 || seq % (2 * cp) != 0) {
    throw_error<ConfigError>(
        "zigzag_order: a sequence of {} positions does not split into 2 x {} equal chunks (cp = "
        "{})",
        seq, cp, cp);
  }
  const int64_t chunk = seq / (2 * cp);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(seq));
  for (int64_t c = 0; c < cp; ++c) {
    for (int64_t part : {c, 2 * cp - 1 - c}) {
      for (int64_t i = 0; i < chunk; ++i) order.push_back(part * chunk + i);
    }
  }
  return order;
}

namespace {

// A hidden score: finite, so that a row with nothing visible in a block stays finite (its
// weights are zeroed by the visibility mask, not by exp(-inf)).
constexpr double kHidden = -1e30;

struct Ring {
  DeviceMesh mesh;
  int cp_dim = 0;
  int64_t cp = 1;
  int64_t block = 0;  // sequence indices per rank
  double scale = 1.0;
  bool causal = true;
  std::vector<int64_t> positions;  // of every global sequence index
  std::vector<int> held;
  std::map<int, int64_t> coordinate;  // held rank -> its cp coordinate
  SourceLocation loc;
};

// 1 where key block `kb`'s index j is visible to query block `qb`'s index i, else 0: [Sl, Sl].
Tensor visible(const Ring& r, int64_t qb, int64_t kb, const Tensor& like) {
  std::vector<double> m(static_cast<size_t>(r.block * r.block), 1.0);
  if (r.causal) {
    for (int64_t i = 0; i < r.block; ++i) {
      const int64_t pq = r.positions[static_cast<size_t>(qb * r.block + i)];
      for (int64_t j = 0; j < r.block; ++j) {
        m[static_cast<size_t>(i * r.block + j)] =
            r.positions[static_cast<size_t>(kb * r.block + j)] <= pq ? 1.0 : 0.0;
      }
    }
  }
  return from_vector(m, {r.block, r.block}).to(like.dtype()).to(like.device());
}

Tensor transposed(const Tensor& t) {
  return t.transpose(-1, -2);
}

// Every tensor of `send` moved one step around the ring (cp rank c to c + 1): per cp coordinate,
// the held ranks there send to the next coordinate, then every group receives from the previous
// one (all sends first: under sim a recv must follow its send in the program).
std::vector<LocalTensor> shift(const Ring& r, const std::vector<LocalTensor>& send) {
  if (r.cp == 1) return send;
  std::map<int64_t, std::vector<int>> groups;
  for (int rank : r.held) groups[r.coordinate.at(rank)].push_back(rank);
  std::vector<std::vector<Async<LocalTensor>>> sends;
  for (const auto& [c, ranks] : groups) {
    std::vector<Async<LocalTensor>> mine;
    for (size_t t = 0; t < send.size(); ++t) {
      const LocalTensor piece =
          LocalTensor::from_fn(ranks, [&](int rank) { return send[t].shard(rank); });
      mine.push_back(isend(piece, r.mesh, r.cp_dim, static_cast<int>((c + 1) % r.cp),
                           static_cast<int64_t>(t), r.loc));
    }
    sends.push_back(std::move(mine));
  }
  std::map<int64_t, std::vector<LocalTensor>> received;
  for (const auto& [c, ranks] : groups) {
    for (size_t t = 0; t < send.size(); ++t) {
      const LocalTensor like =
          LocalTensor::from_fn(ranks, [&](int rank) { return send[t].shard(rank); });
      received[c].push_back(irecv(like, r.mesh, r.cp_dim, static_cast<int>((c + r.cp - 1) % r.cp),
                                  static_cast<int64_t>(t), r.loc)
                                .wait());
    }
  }
  for (auto& group : sends) {
    for (Async<LocalTensor>& s : group) (void)s.wait();
  }
  std::vector<LocalTensor> out;
  for (size_t t = 0; t < send.size(); ++t) {
    out.push_back(mesh_from_fn(r.mesh, r.held, [&](int rank) {
      return received.at(r.coordinate.at(rank))[t].shard(rank);
    }));
  }
  return out;
}

// The block origin a rank at coordinate c holds at step i.
int64_t origin(const Ring& r, int64_t c, int64_t i) {
  return ((c - i) % r.cp + r.cp) % r.cp;
}

struct Saved {
  Ring ring;
  LocalTensor q, k, v, out, lse;
};

// Per held rank: fn(rank, coordinate).
template <class F>
LocalTensor per_rank(const Ring& r, F&& fn) {
  return mesh_from_fn(r.mesh, r.held, [&](int rank) { return fn(rank, r.coordinate.at(rank)); });
}

// The forward ring: online softmax over the blocks as they come by. Returns {out, lse}.
std::pair<LocalTensor, LocalTensor> ring_forward(const Ring& r, const LocalTensor& q,
                                                 const LocalTensor& k0, const LocalTensor& v0) {
  std::map<int, Tensor> m, l, o;
  for (int rank : r.held) {
    const Tensor& qs = q.shard(rank);
    Shape rows = qs.shape();
    rows.back() = 1;
    Shape out_shape = qs.shape();
    out_shape.back() = v0.shard(rank).size(-1);
    m[rank] = full(rows, kHidden, qs.dtype(), qs.device());
    l[rank] = zeros(rows, qs.dtype(), qs.device());
    o[rank] = zeros(out_shape, qs.dtype(), qs.device());
  }
  LocalTensor k = k0, v = v0;
  for (int64_t i = 0; i < r.cp; ++i) {
    for (int rank : r.held) {
      const int64_t c = r.coordinate.at(rank);
      const Tensor& qs = q.shard(rank);
      const Tensor vis = visible(r, c, origin(r, c, i), qs);
      const Tensor s =
          matmul(qs, transposed(k.shard(rank))) * r.scale * vis + (1.0 - vis) * kHidden;
      const Tensor mb = amax(s, {-1}, true);
      const Tensor p = exp(s - mb) * vis;
      const Tensor m_new = maximum(m[rank], mb);
      const Tensor a = exp(m[rank] - m_new);
      const Tensor b = exp(mb - m_new);
      o[rank] = o[rank] * a + matmul(p, v.shard(rank)) * b;
      l[rank] = l[rank] * a + sum(p, {-1}, true) * b;
      m[rank] = m_new;
    }
    if (i + 1 < r.cp) {
      std::vector<LocalTensor> next = shift(r, {k, v});
      k = next[0];
      v = next[1];
    }
  }
  return {per_rank(r, [&](int rank, int64_t) { return o[rank] / l[rank]; }),
          per_rank(r, [&](int rank, int64_t) { return m[rank] + log(l[rank]); })};
}

// The backward ring: each block's key/value gradient travels with the block and is home after cp
// steps; the queries' gradient accumulates in place.
void ring_backward(BackwardContext& c) {
  const Saved& s = c.payload<Saved>();
  const Ring& r = s.ring;
  const LocalTensor& dout = c.grad().as<LocalTensor>();
  std::map<int, Tensor> dq, delta;
  for (int rank : r.held) {
    dq[rank] = zeros(s.q.shard(rank).shape(), s.q.shard(rank).dtype(), s.q.shard(rank).device());
    delta[rank] = sum(dout.shard(rank) * s.out.shard(rank), {-1}, true);
  }
  LocalTensor k = s.k, v = s.v;
  LocalTensor dk = per_rank(r, [&](int rank, int64_t) {
    return zeros(s.k.shard(rank).shape(), s.k.shard(rank).dtype(), s.k.shard(rank).device());
  });
  LocalTensor dv = per_rank(r, [&](int rank, int64_t) {
    return zeros(s.v.shard(rank).shape(), s.v.shard(rank).dtype(), s.v.shard(rank).device());
  });
  for (int64_t i = 0; i < r.cp; ++i) {
    std::map<int, Tensor> dk_new, dv_new;
    for (int rank : r.held) {
      const int64_t co = r.coordinate.at(rank);
      const Tensor& qs = s.q.shard(rank);
      const Tensor& ks = k.shard(rank);
      const Tensor& vs = v.shard(rank);
      const Tensor& g = dout.shard(rank);
      const Tensor vis = visible(r, co, origin(r, co, i), qs);
      const Tensor scores = matmul(qs, transposed(ks)) * r.scale * vis + (1.0 - vis) * kHidden;
      const Tensor p = exp(scores - s.lse.shard(rank)) * vis;
      dv_new[rank] = dv.shard(rank) + matmul(transposed(p), g);
      const Tensor ds = p * (matmul(g, transposed(vs)) - delta[rank]);
      dq[rank] = dq[rank] + matmul(ds, ks) * r.scale;
      dk_new[rank] = dk.shard(rank) + matmul(transposed(ds), qs) * r.scale;
    }
    dk = per_rank(r, [&](int rank, int64_t) { return dk_new[rank]; });
    dv = per_rank(r, [&](int rank, int64_t) { return dv_new[rank]; });
    if (i + 1 < r.cp) {
      std::vector<LocalTensor> next = shift(r, {k, v, dk, dv});
      k = next[0];
      v = next[1];
      dk = next[2];
      dv = next[3];
    } else {
      std::vector<LocalTensor> home = shift(r, {dk, dv});
      dk = home[0];
      dv = home[1];
    }
  }
  if (c.needs_grad(0))
    c.set_grad(0, local_var(per_rank(r, [&](int rank, int64_t) { return dq[rank]; })));
  if (c.needs_grad(1)) c.set_grad(1, local_var(dk));
  if (c.needs_grad(2)) c.set_grad(2, local_var(dv));
}

// All-gather: the keys and values gathered over cp, one block of attention per rank, masked by
// position; made of recorded ops, so autograd differentiates it as it is.
LocalTensor all_gather_attention(const Ring& r, const LocalTensor& q, const LocalTensor& k,
                                 const LocalTensor& v, int64_t seq_dim) {
  const LocalTensor kg = all_gather(k, r.mesh, r.cp_dim, seq_dim, r.loc);
  const LocalTensor vg = all_gather(v, r.mesh, r.cp_dim, seq_dim, r.loc);
  LocalTensor scores = matmul(q, transpose(kg, -1, -2)) * r.scale;
  if (r.causal) {
    const int64_t total = r.block * r.cp;
    const LocalTensor hidden = mesh_from_fn(r.mesh, r.held, [&](int rank) {
      const int64_t c = r.coordinate.at(rank);
      std::vector<bool> h(static_cast<size_t>(r.block * total));
      for (int64_t i = 0; i < r.block; ++i) {
        const int64_t pq = r.positions[static_cast<size_t>(c * r.block + i)];
        for (int64_t j = 0; j < total; ++j) {
          h[static_cast<size_t>(i * total + j)] = r.positions[static_cast<size_t>(j)] > pq;
        }
      }
      return from_vector(h, {r.block, total}).to(q.shard(rank).device());
    });
    scores = masked_fill(scores, hidden, -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(scores, -1), vg);
}

}  // namespace

DTensor context_attention(const DTensor& q_in, const DTensor& k_in, const DTensor& v_in,
                          const ContextAttentionOptions& options, SourceLocation loc) {
  const UserCallSite site(loc);
  const DeviceMesh& mesh = q_in.mesh();
  // Along mesh dims of one rank any placement is the layout wanted: the sequence split over cp,
  // the rest replicated (a cp of 1, the one-rank run of --spmd-debug=parity).
  Placements wanted = replicate_placements(mesh);
  const int64_t seq_dim = static_cast<int64_t>(q_in.shape().size()) - 2;
  if (seq_dim >= 0) {
    wanted[static_cast<size_t>(mesh.resolve(options.cp))] = Shard{static_cast<int>(seq_dim)};
  }
  const DTensor q = with_size_one_dims(q_in, wanted);
  const DTensor k = k_in.mesh() == mesh ? with_size_one_dims(k_in, wanted) : k_in;
  const DTensor v = v_in.mesh() == mesh ? with_size_one_dims(v_in, wanted) : v_in;
  const Shape& qs = q.shape();
  const int64_t nd = static_cast<int64_t>(qs.size());
  Shape ks = k.shape();
  Shape vs = v.shape();
  bool shapes_ok = nd >= 2 && ks == qs && vs.size() == qs.size();
  for (int64_t d = 0; shapes_ok && d + 1 < nd; ++d)
    shapes_ok = vs[static_cast<size_t>(d)] == qs[static_cast<size_t>(d)];
  if (!shapes_ok) {
    throw_error<ShapeError>(
        "context_attention: expects q and k [..., S, D] of one shape and v [..., S, Dv], got q {}, "
        "k {}, v {} (repeat grouped key/value heads first)",
        shape_str(qs), shape_str(ks), shape_str(vs));
  }
  if (!(k.mesh() == mesh) || !(v.mesh() == mesh) || k.placements() != q.placements() ||
      v.placements() != q.placements()) {
    throw_error<PlacementError>(
        "context_attention: q, k and v must share one mesh and placements, got q {}, k {}, v {}",
        to_string(q.placements()), to_string(k.placements()), to_string(v.placements()));
  }
  Ring r;
  r.mesh = mesh;
  r.cp_dim = mesh.resolve(options.cp);
  r.cp = mesh.size(r.cp_dim);
  r.causal = options.causal;
  r.loc = loc;
  const int64_t seq = qs[static_cast<size_t>(nd - 2)];
  const std::string cp_name = mesh.dim_name(r.cp_dim);
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = q.placements()[static_cast<size_t>(m)];
    const bool wanted = m == r.cp_dim;
    const bool seq_split = is_shard(p, static_cast<int>(nd - 2));
    if (is_partial(p) || is_shard(p, static_cast<int>(nd - 1)) || seq_split != wanted) {
      throw_error<PlacementError>(
          "context_attention: the sequence (dim {}) must be split over {} and nothing else, the "
          "last dim whole and nothing Partial; got {} on mesh {}",
          nd - 2, cp_name, to_string(q.placements()), mesh.to_string());
    }
  }
  if (seq % r.cp != 0) {
    throw_error<ShapeError>(
        "context_attention: the sequence of {} does not split evenly over {} = {} ranks", seq,
        cp_name, r.cp);
  }
  r.block = seq / r.cp;
  r.scale = options.scale ? *options.scale
                          : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(qs.back(), 1)));
  r.positions = options.positions;
  if (r.positions.empty()) {
    for (int64_t i = 0; i < seq; ++i) r.positions.push_back(i);
  } else if (static_cast<int64_t>(r.positions.size()) != seq) {
    throw_error<ConfigError>("context_attention: {} positions for a sequence of {}",
                             r.positions.size(), seq);
  }
  // The held ranks the mesh holds (a pipeline stage's mesh holds only some of the world's).
  const PerRank<int64_t> coordinate = mesh.local_rank(r.cp_dim);
  r.held = coordinate.ranks();
  for (int rank : r.held) r.coordinate[rank] = coordinate.at(rank);

  const LocalTensor ql = q.to_local();
  const LocalTensor kl = k.to_local();
  const LocalTensor vl = v.to_local();
  LocalTensor out;
  if (options.method == ContextMethod::AllGather) {
    out = all_gather_attention(r, ql, kl, vl, nd - 2);
  } else {
    std::pair<LocalTensor, LocalTensor> result;
    {
      NoGradGuard no_grad;
      result = ring_forward(r, ql.detach(), kl.detach(), vl.detach());
    }
    // The output varies as the queries do (their types: split over cp, and as q elsewhere).
    out = ql.spmd_types() != nullptr ? result.first.with_types(ql.spmd_types()) : result.first;
    const std::vector<Var> inputs{local_var(ql), local_var(kl), local_var(vl)};
    if (grad_enabled() && any_requires_grad(inputs)) {
      auto saved = std::make_shared<const Saved>(
          Saved{r, ql.detach(), kl.detach(), vl.detach(), out, result.second});
      out = record("context_attention", nullptr, inputs, {}, local_var(out), ring_backward, saved)
                .value<LocalTensor>();
    }
  }
  Shape out_shape = qs;
  out_shape.back() = vs.back();
  return DTensor::from_local(out, mesh, q.placements(), out_shape);
}

}  // namespace spmd
