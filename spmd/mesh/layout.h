// spmd/mesh/layout.h: Layout, the CuTe layout algebra in PyTorch's lexicographic convention.
//
// A Layout is a function from coordinates to offsets, written (sizes):(strides) over flat or
// nested integer tuples: (2,4):(4,1) sends the coordinate (i,j) to 4i + j. DeviceMesh keeps
// one layout per mesh dim over a shared rank map (mesh/device_mesh.h); everything a mesh does
// (slicing, flatten, unflatten, the groups along a dim) is this algebra on small values, never
// a walk over the world's ranks.
//
// Note [Lexicographic layouts]
// As in PyTorch's _MeshLayout (and unlike CuTe's co-lexicographic order), the right-most mode
// is the innermost: the 1-D index of a coordinate counts the last mode fastest, default
// strides are suffix products ((2,3,4) -> (12,4,1)), coalesce scans right to left, and
// complement emits its modes with the smallest stride last. Sizes are >= 1 and strides >= 0.
//
// Printing: a scalar (one size:stride) prints `8:1`; a tuple prints in parentheses with
// commas, `(2,4):(4,1)`; a tuple of one mode prints `(8):(1)`; nesting shows as nested
// parentheses, `((2,2),2):((4,1),2)`; the empty tuple prints `():()`. Layout::parse reads
// the same text back (and also accepts Python's `(8,):(1,)`).
//
// Worked example (a 2x2x2 mesh with dims dp, cp, tp):
//   Layout mesh = Layout::row_major({2, 2, 2});          // (2,2,2):(4,2,1)
//   Layout dp_cp = coalesce(Layout({2, 2}, {4, 2}));    // 4:2, the flattened dp x cp
//   complement(dp_cp, 8);                                // 2:1, one offset per dp_cp group
//   global_ranks(dp_cp, 8);                              // [[0,2,4,6],[1,3,5,7]]
//   composition(dp_cp, Layout({2, 2}, {2, 1}));          // (2,2):(4,2), unflattened again
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/format.h>

namespace spmd {

// The deepest nesting Layout::parse reads; a mesh's layouts nest a few levels at most.
inline constexpr int kMaxLayoutDepth = 64;
// The most offsets codomain and global_ranks list (512 MiB of them): more than any world's ranks,
// so a larger request is a mistake that would otherwise exhaust memory (OutOfMemoryError).
inline constexpr int64_t kMaxListedOffsets = int64_t{1} << 26;

class Layout {
 public:
  // The empty tuple ():(), whose size is 1 and whose only offset is 0.
  Layout();
  // The scalar layout size:stride. MeshError when size < 1 or stride < 0.
  Layout(int64_t size, int64_t stride);
  // The flat tuple (sizes):(strides); a tuple even with one mode. MeshError when the lengths
  // differ, a size is < 1, a stride is < 0, or size/cosize overflow int64.
  Layout(std::vector<int64_t> sizes, std::vector<int64_t> strides);
  // So that Layout({8}, {1}) is the one-mode tuple (8):(1), not the scalar 8:1.
  Layout(std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides)
      : Layout(std::vector<int64_t>(sizes), std::vector<int64_t>(strides)) {}
  // (sizes):(suffix products), the row-major layout: row_major({2,3,4}) = (2,3,4):(12,4,1).
  static Layout row_major(const std::vector<int64_t>& sizes);
  // The tuple whose top-level modes are `modes`, each keeping its own nesting (CuTe's
  // make_layout): from_modes({8:1, (2,2):(4,1)}) = (8,(2,2)):(1,(4,1)).
  static Layout from_modes(const std::vector<Layout>& modes);
  // Parses the printed form ("8:1", "(2,4):(4,1)", "((2,2)):((4,1))", "(8,):(1,)").
  // MeshError naming the text and the position on malformed input, including tuples nested more
  // than kMaxLayoutDepth deep (the parser recurses once per level).
  static Layout parse(std::string_view text);

  // A single size:stride rather than a tuple.
  bool is_scalar() const { return structure_.size() == 1; }
  // Number of top-level modes: 1 for a scalar, 0 for the empty tuple.
  int num_modes() const;
  // The i-th top-level mode (a scalar layout asked for mode 0 returns itself). MeshError when i
  // is out of range.
  Layout mode(int i) const;
  // Product of the sizes of each top-level mode: ((2,2),4):((4,1),8) -> [4, 4].
  std::vector<int64_t> top_level_sizes() const;
  // The leaves (integer sizes and strides) left to right, ignoring nesting.
  const std::vector<int64_t>& leaf_sizes() const { return sizes_; }
  const std::vector<int64_t>& leaf_strides() const { return strides_; }
  int num_leaves() const { return static_cast<int>(sizes_.size()); }
  // Nesting depth: 0 for a scalar, 1 for a flat tuple, 2 for ((2,2),2), ...
  int depth() const;

  // L(index): the offset of the index-th coordinate in lexicographic order (the last leaf
  // fastest). MeshError unless 0 <= index < size(*this). (2,4):(4,1) maps 5 -> 4*1 + 1 = 5;
  // (2,4):(1,2) maps 5 -> 1*1 + 1*2 = 3.
  int64_t operator()(int64_t index) const;

  // `(2,4):(4,1)`; see the printing rules at the top of this file.
  std::string to_string() const;
  // Structural equality (pycute's): same nesting, sizes and strides. `8:1` and `(8):(1)` differ;
  // compare coalesce() of both for equality as functions.
  bool operator==(const Layout& other) const = default;
  std::size_t hash() const;

 private:
  friend Layout nest(const Layout&);
  Layout(std::vector<int64_t> sizes, std::vector<int64_t> strides, std::string structure);
  void validate() const;

  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  // The nesting as tokens: '(' and ')' for tuples, 'x' for each leaf, in order. "x" is a
  // scalar, "(xx)" a flat pair, "((xx)x)" a pair whose first mode is a pair.
  std::string structure_;
};

std::ostream& operator<<(std::ostream& os, const Layout& layout);

// ---- the algebra ------------------------------------------------------------------------------

// Number of coordinates (the domain): the product of all sizes.
// @post size(L) >= 1.
// Example: size((2,4):(4,1)) = 8.
int64_t size(const Layout& layout);

// One past the largest offset: L(size(L) - 1) + 1 (strides are non-negative).
// @post cosize(L) = max over i < size(L) of L(i), plus 1.
// Example: cosize((2,2):(4,1)) = 6, cosize(2:4) = 5, cosize((2,4):(4,1)) = 8.
int64_t cosize(const Layout& layout);

// The same function with as few modes as possible: flatten, drop size-1 modes, merge a mode
// into its right neighbour when size*stride of the right one equals its stride.
// @post coalesce(L)(i) = L(i) for every i < size(L), and size is unchanged.
// @post the result is a scalar or a flat tuple; no mode has size 1 unless the whole result is
//       `1:1` (size-1 results never get stride 0, fixing pytorch/pytorch#169381); no two
//       adjacent modes can be merged.
// Examples: coalesce((3,2):(2,1)) = 6:1; coalesce((3,2):(4,1)) = (3,2):(4,1);
//           coalesce((2,1,3):(3,7,1)) = 6:1; coalesce((1,1):(1,1)) = 1:1.
Layout coalesce(const Layout& layout);

// coalesce without the modes that do not move (size 1 or stride 0): the shape of the image.
// @post codomain(filter(L)) lists the distinct offsets of L when L is injective apart from its
//       stride-0 modes; the result has no stride-0 mode of size > 1.
// Example: filter((2,3,2):(0,2,1)) = 6:1.
Layout filter(const Layout& layout);

// A o B, the layout R with R(c) = A(B(c)); R has B's nesting (each top-level mode of B gives
// the top-level mode of R at the same position).
// @pre every B(c) < size(A), i.e. cosize(B) <= size(A).
// @pre filter(B) is tractable (see is_tractable), unless A coalesces to a single mode: B's
//      modes must not carry into each other when their indices are added.
// @pre divisibility, leaf by leaf of B: walking the modes of coalesce(A) from the right (all
//      but the left-most), with r the remaining stride and s the remaining size of the leaf,
//      either r divides the mode size m, or m divides r; and when r divides m and m/r < s, m/r
//      divides s. A MeshError naming both layouts and the offending mode says otherwise.
// @post R(c) = A(B(c)) for every c < size(B); size(R) = size(B).
// Examples: (6,2):(2,1) o 3:2 = 3:2; 8:1 o (2,2,2):(4,2,1) = (2,2,2):(4,2,1);
//           4:2 o (2,2):(2,1) = (2,2):(4,2); (4,4):(5,1) o 6:1 is a MeshError (4 does not divide
//           6).
Layout composition(const Layout& a, const Layout& b);

// Whether L's moving modes (size > 1), sorted by stride, each have a stride that is a
// multiple of (and at least) the previous mode's size*stride. Such a layout is injective, a
// complement exists, and the other fast paths here apply.
// Examples: (2,2):(4,1) and 3:2 are tractable; (2,2):(3,1) is not (3 % 2 != 0); (2,2):(0,1)
//           is not (stride 0 repeats offsets).
bool is_tractable(const Layout& layout);

// The offsets that, added to L's image, tile [0, M): C = complement(L, world) has its modes
// sorted by stride with the smallest last, so C's offsets ascend in lexicographic order.
// Modes of size 1 or stride 0 are ignored (as in CuTe and pycute).
// @pre filter(L) is tractable (see is_tractable); otherwise MeshError naming L and saying
//      whether L overlaps (found by enumerating, the only case that enumerates).
// @post C(0) = 0 and C is strictly increasing; the layout (C, filter(L)) is a bijection onto
//       [0, M) with M = size(C) * size(filter(L)) >= world, and M < world + extent where extent
//       is the largest size*stride of L's moving modes (M = world when extent divides world).
// Examples: complement(4:1, 8) = 2:4; complement(2:2, 4) = 2:1; complement((2,2):(4,1), 8) =
//           2:2; complement(3:2, 12) = (2,2):(6,1).
Layout complement(const Layout& layout, int64_t world);

// Whether L is injective: no two coordinates share an offset.
// O(modes log modes) when the moving modes, sorted by stride, each stride exceeds the largest
// offset of the smaller ones (always so for tractable layouts); otherwise enumerates.
// Examples: check_non_overlap((2,3):(6,1)) = true; (2,3):(2,1) -> false; (4,2):(1,1) -> false;
//           (2,2):(3,1) -> true.
bool check_non_overlap(const Layout& layout);

// L(0), L(1), ..., L(size-1): every offset in lexicographic coordinate order (PyTorch's
// all_ranks_from_zero).
// Example: codomain((2,3):(3,1)) = [0..5]; codomain((2,3):(1,2)) = [0,2,4,1,3,5].
// @pre size(L) <= kMaxListedOffsets; otherwise OutOfMemoryError.
std::vector<int64_t> codomain(const Layout& layout);

// The groups of `world` positions that L's coordinates span, one per offset of
// complement(L, world), in the complement's lexicographic order:
// [[c + l for l in codomain(L)] for c in codomain(complement(L, world))].
// @pre L tractable and size(complement(L, world)) * size(L) = world; otherwise MeshError.
// @pre world <= kMaxListedOffsets; otherwise OutOfMemoryError.
// @post the groups partition [0, world).
// Example: global_ranks(4:2, 8) = [[0,2,4,6],[1,3,5,7]];
//          global_ranks((2,2):(4,1), 8) = [[0,1,4,5],[2,3,6,7]].
std::vector<std::vector<int64_t>> global_ranks(const Layout& layout, int64_t world);

// A row-major table of integers: shape [d0, d1, ...] and the values, last dim fastest.
struct RankTable {
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
  bool operator==(const RankTable&) const = default;
};

// The mesh tensor(s) of L over a 1-D rank map (PyTorch's remap_to_tensor): shape
// [num_groups, *top_level_sizes(L)], entry [g, i0, i1, ...] = rank_map[C(g) + L(i0, i1, ...)]
// with C = complement(L, rank_map.size()) and (i0, i1, ...) a coordinate per top-level mode.
// @pre as global_ranks with world = rank_map.size().
// Example: remap(2:2, [10,20,30,40]) = [[10,30],[20,40]] (shape [2,2]);
//          remap((2,2):(4,1), arange(8)) = [[[0,1],[4,5]], [[2,3],[6,7]]] (shape [2,2,2]).
RankTable remap(const Layout& layout, std::span<const int64_t> rank_map);

// L as a single top-level mode: nest(L) = (L), a one-mode tuple.
// @post nest(L).num_modes() == 1, nest(L).mode(0) == L and nest(L)(i) == L(i).
// Example: nest((2,2):(4,1)) = ((2,2)):((4,1)); nest(8:1) = (8):(1).
Layout nest(const Layout& layout);

// L with its top-level modes [start, end) replaced by the top-level modes of `replacement`
// (a scalar replacement counts as one mode).
// @pre 0 <= start <= end <= L.num_modes(); otherwise MeshError.
// @post modes [0,start) and [end, n) of L are kept, in order, around replacement's modes.
// Example: splice((4,2):(2,1), 0, 1, (2,2):(4,2)) = (2,2,2):(4,2,1).
Layout splice(const Layout& layout, int start, int end, const Layout& replacement);

// ---- coordinates ------------------------------------------------------------------------------

// The lexicographic 1-D index of `coord` in a box of `sizes` (last fastest).
// @pre coord.size() == sizes.size() and 0 <= coord[k] < sizes[k]; otherwise MeshError.
// Example: crd2idx([1,2], [2,3]) = 5.
int64_t crd2idx(std::span<const int64_t> coord, std::span<const int64_t> sizes);
// The inverse: idx2crd(5, [2,3]) = [1,2]. @pre 0 <= index < product(sizes).
std::vector<int64_t> idx2crd(int64_t index, std::span<const int64_t> sizes);

// The offset of a coordinate given per top-level mode (each entry in [0, size(mode k)), the
// mode's own lexicographic index): crd2offset([1,3], ((2,2),4):((4,1),8)) = L(1*4 + 3).
int64_t crd2offset(std::span<const int64_t> coord, const Layout& layout);

// The inverse of L at `offset`: the index i with L(i) = offset, or nullopt when L never
// reaches it. O(leaves) for tractable layouts, otherwise enumerates.
// @pre L injective (check_non_overlap), else the first such index is returned.
// Example: index_of((2,2):(4,1), 5) = 3; index_of((2,2):(4,1), 2) = nullopt.
std::optional<int64_t> index_of(const Layout& layout, int64_t offset);

// The mixed-radix digits of `offset` read through L's leaves, as a lexicographic index:
// sum over leaves of ((offset / stride) % size) weighted like L's own index.
// @pre L is a sub-layout of a tiling of [0, M) (a layout and its complement, tractable) and
//      0 <= offset < M: then offset = C(j) + L(i) for one j and i = radix_index(L, offset).
//      O(leaves); it checks nothing (the hot path of DeviceMesh coordinates and GroupFamily).
// Example: radix_index(2:4, 6) = 1 (6 = 2 + 1*4); radix_index(2:4, 3) = 0.
int64_t radix_index(const Layout& layout, int64_t offset);

}  // namespace spmd

template <>
struct std::hash<spmd::Layout> {
  std::size_t operator()(const spmd::Layout& layout) const noexcept { return layout.hash(); }
};

SPMD_FORMAT_AS_TEXT(spmd::Layout, value.to_string())
