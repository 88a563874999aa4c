// spmd/collectives/validate.cpp: the argument checks of collectives/validate.h.
#include <spmd/collectives/validate.h>

#include <algorithm>
#include <limits>

#include <spmd/core/error.h>

namespace spmd {
namespace {

[[noreturn]] void fail(const CollectiveCall& call, int rank, const Tensor& x,
                       const std::string& what) {
  throw_error<CommError>("{}: rank {} (input shape {} {}): {}", describe_call(call), rank,
                         shape_str(x.shape()), x.dtype(), what);
}

int64_t check_dim(const CollectiveCall& call, int rank, const Tensor& x, int64_t d,
                  const char* name) {
  if (d < -x.dim() || d >= x.dim() || x.dim() == 0) {
    fail(call, rank, x, fmt::format("{}={} is out of range for a {}-d tensor", name, d, x.dim()));
  }
  return d < 0 ? d + x.dim() : d;
}

void check_divisible(const CollectiveCall& call, int rank, const Tensor& x, int64_t d,
                     const char* name, int64_t group_size) {
  const int64_t dd = check_dim(call, rank, x, d, name);
  if (x.size(dd) % group_size != 0) {
    fail(call, rank, x,
         fmt::format("size {} of {}={} is not divisible by the group size {} (uneven data is "
                     "the DTensor layer's job, by padding)",
                     x.size(dd), name, d, group_size));
  }
}

// The result of gathering `group_size` inputs along dim d must make a shape.
void check_gathered(const CollectiveCall& call, int rank, const Tensor& x, int64_t d,
                    int64_t group_size) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  if (x.numel() > limit / group_size) {
    fail(call, rank, x,
         fmt::format("the result of {} inputs along dim {} has too many elements", group_size, d));
  }
}

void check_op(const CollectiveCall& call, int rank, const Tensor& x, ReduceOp op) {
  if (!is_valid(op)) {
    throw_error<Unsupported>(
        "{}: rank {} (input shape {} {}): {} is not a reduce op (sum, avg, product, min, max, "
        "band, bor, bxor)",
        describe_call(call), rank, shape_str(x.shape()), x.dtype(), reduce_op_str(op));
  }
  if (is_bitwise(op) && is_floating(x.dtype())) {
    fail(call, rank, x,
         fmt::format("reduce op {} is defined for integer and bool dtypes only", op));
  }
  if (op == ReduceOp::Avg && x.dtype() == DType::Bool) {
    fail(call, rank, x, "reduce op avg is not defined for bool");
  }
  if (is_float8(x.dtype())) {
    fail(call, rank, x,
         "float8 tensors are gathered and moved, not reduced (as with PyTorch's NCCL process "
         "group); reduce in bf16 or f32");
  }
}

void check_root(const CollectiveCall& call, int rank, const Tensor& x, int root, const char* name,
                int64_t group_size) {
  if (root < 0 || root >= group_size) {
    fail(call, rank, x,
         fmt::format("{}={} is not a group rank (the group has {} ranks: 0..{})", name, root,
                     group_size, group_size - 1));
  }
}

void check_splits(const CollectiveCall& call, int rank, const Tensor& x,
                  const PerRank<std::vector<int64_t>>& splits, const char* name, int64_t group_size,
                  bool must_sum_to_rows) {
  if (splits.empty()) {
    if (x.dim() == 0) fail(call, rank, x, "needs at least 1 dim");
    if (x.size(0) % group_size != 0) {
      fail(call, rank, x,
           fmt::format("no {} given and {} rows do not split evenly over {} ranks", name, x.size(0),
                       group_size));
    }
    return;
  }
  if (!splits.is_uniform() &&
      !std::binary_search(splits.ranks().begin(), splits.ranks().end(), rank)) {
    fail(
        call, rank, x,
        fmt::format("{} has no entry for rank {} (it holds ranks {})", name, rank, splits.ranks()));
  }
  const std::vector<int64_t>& s = splits.at(rank);
  if (static_cast<int64_t>(s.size()) != group_size) {
    fail(
        call, rank, x,
        fmt::format("{} {} has {} entries, the group has {} ranks", name, s, s.size(), group_size));
  }
  int64_t total = 0;
  for (int64_t v : s) {
    if (v < 0) fail(call, rank, x, fmt::format("{} {} has a negative size", name, s));
    if (__builtin_add_overflow(total, v, &total)) {
      fail(call, rank, x, fmt::format("{} {} add up to more than an int64 holds", name, s));
    }
  }
  if (x.dim() == 0) fail(call, rank, x, "needs at least 1 dim");
  if (!must_sum_to_rows) {
    // The rows this rank receives, times the elements of one row, must make a shape.
    Shape out = x.shape();
    out[0] = total;
    int64_t numel = 1;
    for (int64_t size : out) {
      if (size != 0 && numel > std::numeric_limits<int64_t>::max() / 8 / size) {
        fail(call, rank, x,
             fmt::format("{} {} add up to {} rows, too many elements for the result", name, s,
                         total));
      }
      numel *= size;
    }
  }
  if (must_sum_to_rows) {
    if (total != x.size(0)) {
      fail(call, rank, x,
           fmt::format("{} {} add up to {} but the input has {} rows", name, s, total, x.size(0)));
    }
  }
}

// ---- one check per collective, reached by check_local's visit -----------------------------

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t,
           const AllReduceOptions& o) {
  check_op(call, rank, x, o.op);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const AllGatherOptions& o) {
  check_gathered(call, rank, x, check_dim(call, rank, x, o.gather_dim, "gather_dim"), group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const ReduceScatterOptions& o) {
  check_op(call, rank, x, o.op);
  check_divisible(call, rank, x, o.scatter_dim, "scatter_dim", group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const AllToAllOptions& o) {
  check_divisible(call, rank, x, o.split_dim, "split_dim", group_size);
  check_dim(call, rank, x, o.concat_dim, "concat_dim");
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const AllToAllSingleOptions& o) {
  check_splits(call, rank, x, o.in_splits, "in_splits", group_size, true);
  check_splits(call, rank, x, o.out_splits, "out_splits", group_size, false);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const BroadcastOptions& o) {
  check_root(call, rank, x, o.src, "src", group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const ScatterOptions& o) {
  check_root(call, rank, x, o.src, "src", group_size);
  check_divisible(call, rank, x, o.scatter_dim, "scatter_dim", group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const GatherOptions& o) {
  check_root(call, rank, x, o.dst, "dst", group_size);
  check_gathered(call, rank, x, check_dim(call, rank, x, o.gather_dim, "gather_dim"), group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const ReduceOptions& o) {
  check_op(call, rank, x, o.op);
  check_root(call, rank, x, o.dst, "dst", group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const PermuteOptions& o) {
  if (static_cast<int64_t>(o.dst_of.size()) != group_size) {
    fail(call, rank, x,
         fmt::format("dst_of {} has {} entries, the group has {} ranks", o.dst_of, o.dst_of.size(),
                     group_size));
  }
  std::vector<bool> taken(static_cast<size_t>(group_size), false);
  for (int d : o.dst_of) {
    if (d == -1) continue;
    if (d < -1 || d >= group_size) {
      fail(call, rank, x,
           fmt::format("dst_of {} names {}, not a group rank (0..{}) or -1", o.dst_of, d,
                       group_size - 1));
    }
    if (taken[static_cast<size_t>(d)]) {
      fail(call, rank, x, fmt::format("dst_of {} sends two shards to group rank {}", o.dst_of, d));
    }
    taken[static_cast<size_t>(d)] = true;
  }
}

// Note [Point-to-point]: the peer is another group rank; the envelope holds up to 8 dims.
void check_peer(const CollectiveCall& call, int rank, const Tensor& x, int peer,
                int64_t group_size) {
  check_root(call, rank, x, peer, "peer", group_size);
  if (call.group != nullptr && (*call.group)[static_cast<size_t>(peer)] == rank) {
    fail(call, rank, x,
         fmt::format("peer={} is the rank itself (group rank {} is rank {}): a rank cannot send to "
                     "or receive from itself",
                     peer, peer, rank));
  }
  if (x.dim() > 8) {
    fail(call, rank, x, "a point-to-point tensor has at most 8 dims");
  }
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const SendOptions& o) {
  check_peer(call, rank, x, o.peer, group_size);
}

void check(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
           const RecvOptions& o) {
  check_peer(call, rank, x, o.peer, group_size);
}

void check(const CollectiveCall&, int, const Tensor&, int64_t, const BarrierOptions&) {}

// ---- the members of a ragged collective, reached by ragged_mismatch's and merge_ragged's visits -

// Each member's all_to_all_single split sizes, resolved (even splits spelled out).
struct Splits {
  std::vector<std::vector<int64_t>> in;   // in[i][j]: rows member i sends to member j
  std::vector<std::vector<int64_t>> out;  // out[j][i]: rows member j expects from member i
};

Splits resolve_member_splits(std::span<const MemberCall> members) {
  const int64_t n = static_cast<int64_t>(members.size());
  Splits s;
  for (const MemberCall& m : members) {
    const auto& o = std::get<AllToAllSingleOptions>(*m.options);
    const int64_t rows = (*m.shape)[0];
    s.in.push_back(resolve_splits(o.in_splits, m.rank, rows, n));
    s.out.push_back(o.out_splits.empty() ? std::vector<int64_t>(static_cast<size_t>(n), rows / n)
                                         : o.out_splits.at(m.rank));
  }
  return s;
}

std::optional<RaggedMismatch> mismatch(std::span<const MemberCall> members,
                                       const AllToAllSingleOptions&) {
  const Splits s = resolve_member_splits(members);
  std::vector<std::string> lines;
  for (size_t i = 0; i < members.size(); ++i) {
    for (size_t j = 0; j < members.size(); ++j) {
      if (s.in[i][j] == s.out[j][i]) continue;
      lines.push_back(fmt::format(
          "rank {} sends {} rows to rank {} (in_splits {}), which expects {} (out_splits {})",
          members[i].rank, s.in[i][j], members[j].rank, s.in[i], s.out[j][i], s.out[j]));
    }
  }
  if (lines.empty()) return std::nullopt;
  return RaggedMismatch{"split sizes", std::move(lines)};
}

CollectiveOptions merged(std::span<const MemberCall> members, const AllToAllSingleOptions&) {
  const Splits s = resolve_member_splits(members);
  std::vector<size_t> order(members.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return members[a].rank < members[b].rank; });
  std::vector<int> ranks;
  std::vector<std::vector<int64_t>> in, out;
  for (size_t i : order) {
    ranks.push_back(members[i].rank);
    in.push_back(s.in[i]);
    out.push_back(s.out[i]);
  }
  return AllToAllSingleOptions{PerRank<std::vector<int64_t>>(ranks, std::move(out)),
                               PerRank<std::vector<int64_t>>(ranks, std::move(in))};
}

// A collective that is not ragged: every member passed the same values. A ragged one needs its
// own overloads above (Note [Ragged collectives]).
template <CollectiveOptionsType Options>
std::optional<RaggedMismatch> mismatch(std::span<const MemberCall>, const Options&) {
  static_assert(!is_ragged<Options>(), "a ragged collective needs its mismatch() overload");
  return std::nullopt;
}
template <CollectiveOptionsType Options>
CollectiveOptions merged(std::span<const MemberCall>, const Options& o) {
  static_assert(!is_ragged<Options>(), "a ragged collective needs its merged() overload");
  return o;
}

}  // namespace

std::string describe_call(const CollectiveCall& call) {
  if (call.group) {
    return fmt::format("{} over mesh dim '{}' (group ranks {})", call.kind, call.dim_name,
                       *call.group);
  }
  return fmt::format("{} over mesh dim '{}'", call.kind, call.dim_name);
}

void check_input_ranks(CollectiveKind kind, const std::string& dim_name,
                       const std::vector<int>& ranks, const World& world) {
  if (ranks.empty()) return;
  const std::vector<int>& held = world.held_ranks();
  // A world holding all its ranks (sim) holds exactly 0..size-1; ranks are never negative.
  if (static_cast<int>(held.size()) == world.size() && ranks.back() < world.size()) return;
  auto it = held.begin();
  for (int rank : ranks) {
    it = std::lower_bound(it, held.end(), rank);
    if (it == held.end() || *it != rank) {
      throw_error<CommError>(
          "{}: the input holds rank {}, which the mesh's world (a {} world of {} ranks holding "
          "{}) does not hold; was the LocalTensor made for another World?",
          describe_call(CollectiveCall{kind, dim_name}), rank, world.backend_name(), world.size(),
          held.size() == static_cast<size_t>(world.size()) ? fmt::format("0..{}", world.size() - 1)
                                                           : fmt::format("{}", held));
    }
  }
}

void check_local(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
                 const CollectiveOptions& options) {
  std::visit([&](const auto& o) { check(call, rank, x, group_size, o); }, options);
}

void check_group(const CollectiveCall& call, const std::vector<const Tensor*>& inputs) {
  const bool rows_may_differ = is_ragged(call.kind);
  const Tensor& first = *inputs[0];
  const Shape& first_shape = first.shape();
  const size_t skip = rows_may_differ && !first_shape.empty() ? 1 : 0;
  for (size_t i = 1; i < inputs.size(); ++i) {
    const Tensor& other = *inputs[i];
    const Shape& shape = other.shape();
    const bool same = other.dtype() == first.dtype() && shape.size() == first_shape.size() &&
                      std::equal(shape.begin() + skip, shape.end(), first_shape.begin() + skip);
    if (!same) {
      std::string shapes;
      for (size_t k = 0; k < inputs.size(); ++k) {
        shapes += fmt::format("{}rank {}: {} {}", k ? ", " : "", (*call.group)[k],
                              shape_str(inputs[k]->shape()), inputs[k]->dtype());
      }
      throw_error<CommError>("{}: inputs differ within the group{}: {}", describe_call(call),
                             rows_may_differ ? " (beyond dim 0)" : "", shapes);
    }
  }
}

void check_group_splits(const CollectiveCall& call, const std::vector<const Tensor*>& inputs,
                        const AllToAllSingleOptions& o) {
  const int64_t n = static_cast<int64_t>(inputs.size());
  std::vector<std::vector<int64_t>> in(inputs.size()), out(inputs.size());
  for (int64_t i = 0; i < n; ++i) {
    const int rank = (*call.group)[static_cast<size_t>(i)];
    in[static_cast<size_t>(i)] = resolve_splits(o.in_splits, rank, inputs[i]->size(0), n);
  }
  for (int64_t j = 0; j < n; ++j) {
    const int rank = (*call.group)[static_cast<size_t>(j)];
    if (o.out_splits.empty()) {
      // Even output split: the result has the input's rows, an equal share from every peer.
      out[static_cast<size_t>(j)].assign(static_cast<size_t>(n),
                                         inputs[static_cast<size_t>(j)]->size(0) / n);
    } else {
      out[static_cast<size_t>(j)] = o.out_splits.at(rank);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t sent = in[static_cast<size_t>(i)][static_cast<size_t>(j)];
      const int64_t expected = out[static_cast<size_t>(j)][static_cast<size_t>(i)];
      if (sent != expected) {
        throw_error<CommError>(
            "{}: split sizes do not match: rank {} sends {} rows to rank {} (in_splits {}), "
            "which expects {} (out_splits {})",
            describe_call(call), (*call.group)[static_cast<size_t>(i)], sent, rank,
            in[static_cast<size_t>(i)], expected, out[static_cast<size_t>(j)]);
      }
    }
  }
}

std::vector<int64_t> resolve_splits(const PerRank<std::vector<int64_t>>& splits, int rank,
                                    int64_t size, int64_t group_size) {
  if (!splits.empty()) return splits.at(rank);
  return std::vector<int64_t>(static_cast<size_t>(group_size), size / group_size);
}

std::optional<RaggedMismatch> ragged_mismatch(std::span<const MemberCall> members) {
  return std::visit([&](const auto& o) { return mismatch(members, o); }, *members[0].options);
}

CollectiveOptions merge_ragged(std::span<const MemberCall> members) {
  return std::visit([&](const auto& o) { return merged(members, o); }, *members[0].options);
}

}  // namespace spmd
