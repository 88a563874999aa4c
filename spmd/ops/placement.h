// spmd/ops/placement.h: how a DTensor is laid out along each mesh dim: Shard{dim}, Replicate{},
// Partial{op}; and the one place that says how an uneven dim is split (shard_size/shard_offset).
//
// A DTensor on an N-D mesh has one Placement per mesh dim. Placements are small values with ==,
// hashing and printing as PyTorch prints them: S(0), R, P(sum). Text round-trips through
// parse_placements / to_string:
//
//   Placements p = parse_placements("S(0),R,P(avg)");   // {Shard{0}, Replicate{}, Partial{Avg}}
//   to_string(p);                                        // "S(0),R,P(avg)"
//
// Note [Uneven sharding]
// A tensor dim of size n sharded over k ranks is split as torch.chunk splits it: every chunk has
// c = ceil(n / k) elements except the trailing ones, which are short or EMPTY. The rank with
// coordinate i along the mesh dim holds rows [min(i*c, n), min((i+1)*c, n)). Examples (n / k):
//
//   rank (coordinate) | 5 / 4    | 10 / 4   | 9 / 4    | 3 / 4    | 6 / 4
//   ------------------+----------+----------+----------+----------+---------
//   0                 | 2 @ 0    | 3 @ 0    | 3 @ 0    | 1 @ 0    | 2 @ 0
//   1                 | 2 @ 2    | 3 @ 3    | 3 @ 3    | 1 @ 1    | 2 @ 2
//   2                 | 1 @ 4    | 3 @ 6    | 3 @ 6    | 1 @ 2    | 2 @ 4
//   3                 | 0 @ 5    | 1 @ 9    | 0 @ 9    | 0 @ 3    | 0 @ 6
//   ("size @ offset"; 6 / 4 shows that even a divisible-looking split can leave a rank empty.)
//
// Two consequences the rest of dtensor/ relies on: chunk sizes never increase with the
// coordinate, and the valid rows of the chunks padded to c and concatenated in coordinate order
// form a prefix of length n. So an uneven all_gather is pad-to-c -> all_gather -> keep the first
// n rows, and an uneven reduce_scatter is pad-to-k*c -> reduce_scatter -> keep the first
// shard_size rows (dtensor/redistribute.cpp).
//
// Nested sharding: when several mesh dims shard one tensor dim, the outer (lower-index) mesh
// dim splits first and each inner one splits the piece the outer ones left, each by the rule
// above. On a (2, 2) mesh with {Shard{0}, Shard{0}}, 5 rows go 3 | 2 over the outer dim, then
// 2 | 1 and 1 | 1 over the inner one: ranks 0, 1, 2, 3 hold rows [0,2), [2,3), [3,4), [4,5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <spmd/tensor/reduce_op.h>

namespace spmd {

// The tensor dim `dim` is split over the ranks of the mesh dim (Note [Uneven sharding]).
struct Shard {
  int dim = 0;
  bool operator==(const Shard&) const = default;
};

// Every rank of the mesh dim holds the whole (logical) tensor.
struct Replicate {
  bool operator==(const Replicate&) const = default;
};

// Every rank of the mesh dim holds a piece; the value is the reduction of the pieces with `op`
// (Sum, Avg, Product, Min or Max). With Partials on several mesh dims the innermost mesh dim
// reduces first.
struct Partial {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const Partial&) const = default;
};

using Placement = std::variant<Shard, Replicate, Partial>;
using Placements = std::vector<Placement>;

inline bool is_shard(const Placement& p) {
  return std::holds_alternative<Shard>(p);
}
inline bool is_shard(const Placement& p, int dim) {
  const Shard* s = std::get_if<Shard>(&p);
  return s != nullptr && s->dim == dim;
}
inline bool is_replicate(const Placement& p) {
  return std::holds_alternative<Replicate>(p);
}
inline bool is_partial(const Placement& p) {
  return std::holds_alternative<Partial>(p);
}

// "S(0)", "R", "P(sum)".
std::string to_string(const Placement& p);
// "S(0),R,P(sum)" (empty for no placements).
std::string to_string(const Placements& placements);

// Parses the to_string forms, comma separated, spaces ignored. Also accepts "Shard(0)",
// "Replicate()", "Partial(sum)", "P" (= P(sum)) and "prod" for product. PlacementError naming
// the text and the offending item for anything else, including a Partial op other than sum,
// avg, product, min, max.
Placements parse_placements(std::string_view text);

// True for the reduce ops a Partial may carry (sum, avg, product, min, max).
bool is_partial_op(ReduceOp op);

std::size_t hash_value(const Placement& p);
std::size_t hash_value(const Placements& placements);

std::ostream& operator<<(std::ostream& os, const Placement& p);
std::ostream& operator<<(std::ostream& os, const Placements& placements);

// ---- Note [Uneven sharding] -----------------------------------------------------------------
// Size of chunk `index` of a dim of `size` split into `num_chunks` (torch.chunk).
// @pre size >= 0, num_chunks >= 1, 0 <= index < num_chunks.
// shard_size(5, 4, i) = 2, 2, 1, 0.
inline int64_t shard_size(int64_t size, int64_t num_chunks, int64_t index) {
  // Written so that no intermediate overflows, whatever the size: ceil without size + k - 1, and
  // a start past the end (or beyond int64) gives an empty chunk.
  const int64_t chunk = size / num_chunks + (size % num_chunks != 0 ? 1 : 0);
  int64_t start = 0;
  if (__builtin_mul_overflow(chunk, index, &start) || start >= size) return 0;
  return chunk <= size - start ? chunk : size - start;
}
// Offset of chunk `index` (its first element; `size` for an empty chunk).
// shard_offset(5, 4, i) = 0, 2, 4, 5.
inline int64_t shard_offset(int64_t size, int64_t num_chunks, int64_t index) {
  const int64_t chunk = size / num_chunks + (size % num_chunks != 0 ? 1 : 0);
  int64_t start = 0;
  if (__builtin_mul_overflow(chunk, index, &start)) return size;
  return start < size ? start : size;
}
// The padded chunk size ceil(size / num_chunks): the size of chunk 0.
inline int64_t shard_capacity(int64_t size, int64_t num_chunks) {
  return size / num_chunks + (size % num_chunks != 0 ? 1 : 0);
}

}  // namespace spmd

template <>
struct std::hash<spmd::Shard> {
  std::size_t operator()(const spmd::Shard& s) const noexcept {
    return std::hash<int>{}(s.dim) * 31u + 1u;
  }
};
template <>
struct std::hash<spmd::Replicate> {
  std::size_t operator()(const spmd::Replicate&) const noexcept { return 2u; }
};
template <>
struct std::hash<spmd::Partial> {
  std::size_t operator()(const spmd::Partial& p) const noexcept {
    return static_cast<std::size_t>(p.op) * 31u + 3u;
  }
};

template <>
struct fmt::formatter<spmd::Placement> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const spmd::Placement& p, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", spmd::to_string(p));
  }
};
template <>
struct fmt::formatter<spmd::Placements> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const spmd::Placements& p, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", spmd::to_string(p));
  }
};
