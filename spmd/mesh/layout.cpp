// spmd/mesh/layout.cpp: the lexicographic CuTe algebra (Note [Lexicographic layouts]).
#include <spmd/mesh/layout.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <ostream>
#include <utility>

#include <fmt/ranges.h>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {
namespace {

constexpr char kOpen = '(';
constexpr char kClose = ')';
constexpr char kLeaf = 'x';

struct Leaf {
  int64_t size;
  int64_t stride;
};

// A top-level mode: its tokens [tok_begin, tok_end) and leaves [leaf_begin, leaf_end).
struct ModeSpan {
  size_t tok_begin, tok_end;
  int leaf_begin, leaf_end;
};

std::vector<ModeSpan> top_level_spans(const std::string& structure) {
  std::vector<ModeSpan> spans;
  if (structure.size() == 1) {  // a scalar is its own single mode
    spans.push_back({0, 1, 0, 1});
    return spans;
  }
  int depth = 0;
  int leaf = 0;
  ModeSpan current{};
  for (size_t t = 1; t + 1 < structure.size(); ++t) {
    char c = structure[t];
    if (depth == 0) {
      current.tok_begin = t;
      current.leaf_begin = leaf;
    }
    if (c == kOpen) ++depth;
    if (c == kClose) --depth;
    if (c == kLeaf) ++leaf;
    if (depth == 0) {
      current.tok_end = t + 1;
      current.leaf_end = leaf;
      spans.push_back(current);
    }
  }
  return spans;
}

// ceil(a / b) for a >= 0, b >= 1, without forming a + b - 1 (which overflows near int64's end).
int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

// The moving leaves (size > 1) sorted by (stride, size).
std::vector<Leaf> sorted_moving_leaves(const Layout& layout) {
  std::vector<Leaf> leaves;
  leaves.reserve(layout.leaf_sizes().size());
  for (int k = 0; k < layout.num_leaves(); ++k) {
    if (layout.leaf_sizes()[k] != 1) {
      leaves.push_back({layout.leaf_sizes()[k], layout.leaf_strides()[k]});
    }
  }
  std::sort(leaves.begin(), leaves.end(), [](const Leaf& a, const Leaf& b) {
    return a.stride != b.stride ? a.stride < b.stride : a.size < b.size;
  });
  return leaves;
}

Layout from_leaves(const std::vector<Leaf>& leaves) {
  if (leaves.size() == 1) return Layout(leaves[0].size, leaves[0].stride);
  std::vector<int64_t> sizes, strides;
  sizes.reserve(leaves.size());
  strides.reserve(leaves.size());
  for (const Leaf& l : leaves) {
    sizes.push_back(l.size);
    strides.push_back(l.stride);
  }
  return Layout(std::move(sizes), std::move(strides));
}

// Two coordinates with the same offset, for error messages; nullopt when L is injective.
std::optional<std::pair<int64_t, int64_t>> find_collision(const Layout& layout) {
  std::vector<int64_t> offsets = codomain(layout);
  std::vector<int64_t> order(offsets.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return offsets[a] < offsets[b]; });
  for (size_t k = 1; k < order.size(); ++k) {
    if (offsets[order[k]] == offsets[order[k - 1]]) return std::pair{order[k - 1], order[k]};
  }
  return std::nullopt;
}

std::string coord_str(int64_t index, const Layout& layout) {
  std::vector<int64_t> crd = idx2crd(index, layout.leaf_sizes());
  std::string out = "(";
  for (size_t k = 0; k < crd.size(); ++k) out += fmt::format("{}{}", k ? "," : "", crd[k]);
  return out + ")";
}

// The MeshError for a layout that complement/global_ranks/remap cannot handle.
[[noreturn]] void throw_not_tractable(std::string_view op, const Layout& layout) {
  if (auto collision = find_collision(layout)) {
    throw_error<MeshError>(
        "{}: layout {} overlaps: coordinates {} and {} both map to offset {}, so no complement "
        "exists",
        op, layout, coord_str(collision->first, layout), coord_str(collision->second, layout),
        layout(collision->first));
  }
  throw_error<MeshError>(
      "{}: layout {} is injective but not tractable (its modes sorted by stride do not each "
      "start at a multiple of the previous size*stride), so no layout complements it",
      op, layout);
}

// OutOfMemoryError naming `op` when listing `count` offsets of `layout` would pass
// kMaxListedOffsets.
void check_listable(std::string_view op, int64_t count, const Layout& layout) {
  if (count > kMaxListedOffsets) {
    throw_error<OutOfMemoryError>(
        "{}: listing the {} offsets of layout {} takes {} bytes; at most {} offsets are listed", op,
        count, layout, static_cast<uint64_t>(count) * sizeof(int64_t), kMaxListedOffsets);
  }
}

// ---- parsing ------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Layout layout() {
    std::string shape_structure, stride_structure;
    std::vector<int64_t> sizes, strides;
    tuple(shape_structure, sizes);
    expect(':');
    tuple(stride_structure, strides);
    skip_spaces();
    if (pos_ != text_.size()) fail("trailing characters");
    if (shape_structure != stride_structure) fail("sizes and strides have different nesting");
    return make(std::move(sizes), std::move(strides), std::move(shape_structure));
  }

  // The layout with these leaves and this nesting, built from scalars with from_modes.
  static Layout make(std::vector<int64_t> sizes, std::vector<int64_t> strides,
                     const std::string& structure) {
    size_t leaf = 0;
    size_t pos = 0;
    return build(sizes, strides, structure, pos, leaf);
  }

 private:
  static Layout build(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                      const std::string& structure, size_t& pos, size_t& leaf) {
    if (structure[pos] == kLeaf) {
      ++pos;
      Layout out(sizes[leaf], strides[leaf]);
      ++leaf;
      return out;
    }
    ++pos;  // '('
    std::vector<Layout> modes;
    while (structure[pos] != kClose) modes.push_back(build(sizes, strides, structure, pos, leaf));
    ++pos;
    return Layout::from_modes(modes);
  }

  void tuple(std::string& structure, std::vector<int64_t>& values, int depth = 0) {
    skip_spaces();
    if (peek() == '(') {
      if (depth == kMaxLayoutDepth) {
        fail(fmt::format("tuples nested deeper than {} levels", kMaxLayoutDepth));
      }
      ++pos_;
      structure += kOpen;
      skip_spaces();
      bool first = true;
      while (peek() != ')') {
        if (!first) {
          expect(',');
          skip_spaces();
          if (peek() == ')') break;  // Python's trailing comma: (8,)
        }
        tuple(structure, values, depth + 1);
        skip_spaces();
        first = false;
      }
      ++pos_;
      structure += kClose;
      return;
    }
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == start || (pos_ == start + 1 && text_[start] == '-')) fail("expected an integer");
    int64_t value = 0;
    try {
      value = std::stoll(std::string(text_.substr(start, pos_ - start)));
    } catch (const std::exception&) {
      fail("integer out of range");
    }
    values.push_back(value);
    structure += kLeaf;
  }

  char peek() {
    if (pos_ >= text_.size()) fail("unexpected end");
    return text_[pos_];
  }
  void expect(char c) {
    skip_spaces();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }
  void skip_spaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  [[noreturn]] void fail(std::string_view what) {
    // A long text is shown by its start: the position says where the fault is.
    constexpr size_t kShown = 200;
    throw_error<MeshError>("Layout::parse: {} at position {} of '{}{}'", what, pos_,
                           text_.substr(0, kShown), text_.size() > kShown ? "..." : "");
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

// ---- Layout -----------------------------------------------------------------------------------

Layout::Layout() : structure_{kOpen, kClose} {}

Layout::Layout(int64_t size, int64_t stride)
    : sizes_{size}, strides_{stride}, structure_(1, kLeaf) {
  validate();
}

Layout::Layout(std::vector<int64_t> sizes, std::vector<int64_t> strides)
    : sizes_(std::move(sizes)), strides_(std::move(strides)) {
  if (sizes_.size() != strides_.size()) {
    throw_error<MeshError>("Layout: {} sizes but {} strides", sizes_.size(), strides_.size());
  }
  structure_.reserve(sizes_.size() + 2);
  structure_ += kOpen;
  structure_.append(sizes_.size(), kLeaf);
  structure_ += kClose;
  validate();
}

Layout::Layout(std::vector<int64_t> sizes, std::vector<int64_t> strides, std::string structure)
    : sizes_(std::move(sizes)), strides_(std::move(strides)), structure_(std::move(structure)) {}

void Layout::validate() const {
  int64_t total = 1;
  int64_t last = 0;
  for (size_t k = 0; k < sizes_.size(); ++k) {
    if (sizes_[k] < 1 || strides_[k] < 0) {
      throw_error<MeshError>("Layout: sizes must be >= 1 and strides >= 0, got {}:{} in mode {}",
                             sizes_[k], strides_[k], k);
    }
    int64_t reach = 0;
    if (__builtin_mul_overflow(total, sizes_[k], &total) ||
        __builtin_mul_overflow(sizes_[k] - 1, strides_[k], &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      throw_error<MeshError>("Layout: size or cosize of {} overflows int64", to_string());
    }
  }
}

Layout Layout::row_major(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t k = sizes.size(); k-- > 1;) {
    if (__builtin_mul_overflow(strides[k], std::max<int64_t>(1, sizes[k]), &strides[k - 1])) {
      throw_error<MeshError>("Layout::row_major: the size of {} overflows int64",
                             fmt::join(sizes, "x"));
    }
  }
  return Layout(sizes, std::move(strides));
}

Layout Layout::from_modes(const std::vector<Layout>& modes) {
  Layout out;
  out.structure_.clear();
  out.structure_ += kOpen;
  for (const Layout& m : modes) {
    out.sizes_.insert(out.sizes_.end(), m.sizes_.begin(), m.sizes_.end());
    out.strides_.insert(out.strides_.end(), m.strides_.begin(), m.strides_.end());
    out.structure_ += m.structure_;
  }
  out.structure_ += kClose;
  out.validate();
  return out;
}

Layout Layout::parse(std::string_view text) {
  return Parser(text).layout();
}

int Layout::num_modes() const {
  if (is_scalar()) return 1;
  int depth = 0;
  int modes = 0;
  for (size_t t = 1; t + 1 < structure_.size(); ++t) {
    if (depth == 0) ++modes;
    if (structure_[t] == kOpen) ++depth;
    if (structure_[t] == kClose) --depth;
  }
  return modes;
}

Layout Layout::mode(int i) const {
  std::vector<ModeSpan> spans = top_level_spans(structure_);
  if (i < 0 || i >= static_cast<int>(spans.size())) {
    throw_error<MeshError>("Layout::mode: mode {} is out of range for {} with {} modes", i,
                           to_string(), spans.size());
  }
  const ModeSpan& s = spans[i];
  if (is_scalar()) return *this;
  return Layout(
      std::vector<int64_t>(sizes_.begin() + s.leaf_begin, sizes_.begin() + s.leaf_end),
      std::vector<int64_t>(strides_.begin() + s.leaf_begin, strides_.begin() + s.leaf_end),
      structure_.substr(s.tok_begin, s.tok_end - s.tok_begin));
}

std::vector<int64_t> Layout::top_level_sizes() const {
  std::vector<int64_t> out;
  for (const ModeSpan& s : top_level_spans(structure_)) {
    int64_t n = 1;
    for (int k = s.leaf_begin; k < s.leaf_end; ++k) n *= sizes_[k];
    out.push_back(n);
  }
  return out;
}

int Layout::depth() const {
  int depth = 0;
  int deepest = 0;
  for (char c : structure_) {
    if (c == kOpen) deepest = std::max(deepest, ++depth);
    if (c == kClose) --depth;
  }
  return deepest;
}

int64_t Layout::operator()(int64_t index) const {
  int64_t n = size(*this);
  if (index < 0 || index >= n) {
    throw_error<MeshError>("Layout {}: index {} is outside the domain [0, {})", to_string(), index,
                           n);
  }
  int64_t offset = 0;
  for (size_t k = sizes_.size(); k-- > 0;) {
    offset += (index % sizes_[k]) * strides_[k];
    index /= sizes_[k];
  }
  return offset;
}

std::string Layout::to_string() const {
  auto print = [&](const std::vector<int64_t>& values) {
    std::string out;
    size_t leaf = 0;
    char prev = kOpen;
    for (char c : structure_) {
      if ((c == kLeaf || c == kOpen) && (prev == kLeaf || prev == kClose)) out += ',';
      if (c == kLeaf) {
        out += std::to_string(values[leaf++]);
      } else {
        out += c;
      }
      prev = c;
    }
    return out;
  };
  return print(sizes_) + ":" + print(strides_);
}

std::size_t Layout::hash() const {
  std::size_t seed = std::hash<std::string>{}(structure_);
  for (size_t k = 0; k < sizes_.size(); ++k) {
    hash_combine(seed, sizes_[k]);
    hash_combine(seed, strides_[k]);
  }
  return seed;
}

std::ostream& operator<<(std::ostream& os, const Layout& layout) {
  return os << layout.to_string();
}

// ---- the algebra ------------------------------------------------------------------------------

int64_t size(const Layout& layout) {
  int64_t n = 1;
  for (int64_t s : layout.leaf_sizes()) n *= s;
  return n;
}

int64_t cosize(const Layout& layout) {
  int64_t last = 0;
  for (int k = 0; k < layout.num_leaves(); ++k) {
    last += (layout.leaf_sizes()[k] - 1) * layout.leaf_strides()[k];
  }
  return last + 1;
}

Layout coalesce(const Layout& layout) {
  // Built right to left (innermost first), reversed at the end.
  std::vector<Leaf> stack{{1, 0}};
  for (int k = layout.num_leaves(); k-- > 0;) {
    int64_t s = layout.leaf_sizes()[k];
    int64_t d = layout.leaf_strides()[k];
    Leaf& top = stack.back();
    if (s == 1) continue;
    if (top.size == 1) {
      top = {s, d};
    } else if (top.size * top.stride == d) {
      top.size *= s;
    } else {
      stack.push_back({s, d});
    }
  }
  if (stack.size() == 1 && stack[0].size == 1) return Layout(1, 1);
  std::reverse(stack.begin(), stack.end());
  return from_leaves(stack);
}

Layout filter(const Layout& layout) {
  std::vector<int64_t> sizes, strides;
  for (int k = 0; k < layout.num_leaves(); ++k) {
    if (layout.leaf_sizes()[k] != 1 && layout.leaf_strides()[k] != 0) {
      sizes.push_back(layout.leaf_sizes()[k]);
      strides.push_back(layout.leaf_strides()[k]);
    }
  }
  if (sizes.empty()) return Layout(1, 1);
  return coalesce(Layout(std::move(sizes), std::move(strides)));
}

namespace {

// A o (s:d) for one leaf of B, with A already coalesced (flat).
// `b` is the whole right operand, for messages.
Layout compose_leaf(const Layout& a, const Layout& flat_a, const Layout& b, int64_t s, int64_t d) {
  if (s == 1) return Layout(1, 1);
  if (d == 0) return Layout(s, 0);
  std::vector<Leaf> result;  // innermost first
  int64_t rest_size = s;
  int64_t rest_stride = d;
  const auto& sizes = flat_a.leaf_sizes();
  const auto& strides = flat_a.leaf_strides();
  for (size_t k = sizes.size(); k-- > 1 && rest_size > 1;) {
    int64_t m = sizes[k];
    if (m % rest_stride != 0 && rest_stride % m != 0) {
      throw_error<MeshError>(
          "composition: {} o {} breaks the stride divisibility condition: mode {}:{} of "
          "coalesce(A) = {} meets remaining stride {} (neither divides the other)",
          a, b, m, strides[k], flat_a, rest_stride);
    }
    int64_t taken = std::min(std::max<int64_t>(1, m / rest_stride), rest_size);
    if (taken > 1 && taken < rest_size && rest_size % taken != 0) {
      throw_error<MeshError>(
          "composition: {} o {} breaks the shape divisibility condition: mode {}:{} of "
          "coalesce(A) = {} holds {} of the remaining {} coordinates, which {} does not divide",
          a, b, m, strides[k], flat_a, taken, rest_size, taken);
    }
    if (taken != 1) result.push_back({taken, rest_stride * strides[k]});
    rest_size /= taken;
    rest_stride = ceil_div(rest_stride, m);
  }
  if (rest_size != 1 || result.empty()) result.push_back({rest_size, rest_stride * strides[0]});
  std::reverse(result.begin(), result.end());
  return from_leaves(result);
}

Layout compose(const Layout& a, const Layout& flat_a, const Layout& b, const Layout& part) {
  if (part.is_scalar()) {
    return compose_leaf(a, flat_a, b, part.leaf_sizes()[0], part.leaf_strides()[0]);
  }
  std::vector<Layout> modes;
  int n = part.num_modes();
  modes.reserve(n);
  for (int i = 0; i < n; ++i) modes.push_back(compose(a, flat_a, b, part.mode(i)));
  return Layout::from_modes(modes);
}

}  // namespace

Layout composition(const Layout& a, const Layout& b) {
  if (cosize(b) > size(a)) {
    throw_error<MeshError>(
        "composition: {} o {}: B reaches offset {} but A has only {} coordinates (cosize(B) "
        "must not exceed size(A))",
        a, b, cosize(b) - 1, size(a));
  }
  Layout flat_a = coalesce(a);
  // A o B distributes over B's modes only when their indices add without carrying across A's
  // modes; a tractable B guarantees that, and a single-mode A is linear anyway.
  if (!flat_a.is_scalar() && !is_tractable(filter(b))) {
    throw_error<MeshError>(
        "composition: {} o {}: B is not tractable (its modes sorted by stride overlap or do not "
        "nest), so its modes would carry into each other across the modes of A = {}",
        a, b, flat_a);
  }
  return compose(a, flat_a, b, b);
}

bool is_tractable(const Layout& layout) {
  int64_t current = 1;
  for (const Leaf& l : sorted_moving_leaves(layout)) {
    if (l.stride < current || l.stride % current != 0) return false;
    // Past int64 no further mode can start at a multiple: saturate.
    if (__builtin_mul_overflow(l.size, l.stride, &current)) {
      current = std::numeric_limits<int64_t>::max();
    }
  }
  return true;
}

Layout complement(const Layout& layout, int64_t world) {
  if (world < 1) {
    throw_error<MeshError>("complement: world must be >= 1, got {} (layout {})", world, layout);
  }
  std::vector<Leaf> modes;  // innermost first
  int64_t current = 1;
  for (const Leaf& l : sorted_moving_leaves(layout)) {
    if (l.stride == 0) continue;  // broadcast modes do not move
    if (l.stride < current || l.stride % current != 0) {
      throw_not_tractable("complement", filter(layout));
    }
    modes.push_back({l.stride / current, current});
    if (__builtin_mul_overflow(l.size, l.stride, &current)) {
      throw_error<MeshError>("complement: layout {} reaches beyond int64", layout);
    }
  }
  modes.push_back({ceil_div(world, current), current});
  std::reverse(modes.begin(), modes.end());
  try {
    return coalesce(from_leaves(modes));
  } catch (const MeshError& e) {
    throw_error<MeshError>("complement: the complement of {} in a world of {}: {}", layout, world,
                           e.what());
  }
}

bool check_non_overlap(const Layout& layout) {
  std::vector<Leaf> leaves = sorted_moving_leaves(layout);
  int64_t largest = 0;  // the largest offset of the modes seen so far
  bool simple = true;
  for (const Leaf& l : leaves) {
    if (l.stride == 0) return false;
    if (l.stride <= largest) {
      simple = false;
      break;
    }
    largest += (l.size - 1) * l.stride;
  }
  if (simple) return true;
  if (size(layout) > cosize(layout)) return false;  // more coordinates than offsets
  std::vector<int64_t> offsets = codomain(layout);
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end();
}

std::vector<int64_t> codomain(const Layout& layout) {
  check_listable("codomain", size(layout), layout);
  const auto& sizes = layout.leaf_sizes();
  const auto& strides = layout.leaf_strides();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(size(layout)));
  out.push_back(0);
  // Expand one leaf at a time from the left: each step repeats the current list per coordinate
  // of the next (inner) leaf, keeping lexicographic order.
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 1) continue;
    std::vector<int64_t> next;
    next.reserve(out.size() * static_cast<size_t>(sizes[k]));
    for (int64_t base : out) {
      for (int64_t c = 0; c < sizes[k]; ++c) next.push_back(base + c * strides[k]);
    }
    out = std::move(next);
  }
  return out;
}

namespace {

Layout exact_complement(std::string_view op, const Layout& layout, int64_t world) {
  if (!is_tractable(layout)) throw_not_tractable(op, layout);
  Layout c = complement(layout, world);
  if (size(c) * size(layout) != world) {
    throw_error<MeshError>(
        "{}: layout {} does not tile {} positions: its complement {} gives {} x {} = {} "
        "positions",
        op, layout, world, c, size(c), size(layout), size(c) * size(layout));
  }
  return c;
}

}  // namespace

std::vector<std::vector<int64_t>> global_ranks(const Layout& layout, int64_t world) {
  Layout c = exact_complement("global_ranks", layout, world);
  check_listable("global_ranks", world, layout);
  std::vector<int64_t> inner = codomain(layout);
  std::vector<std::vector<int64_t>> out;
  for (int64_t offset : codomain(c)) {
    std::vector<int64_t>& group = out.emplace_back(inner);
    for (int64_t& r : group) r += offset;
  }
  return out;
}

RankTable remap(const Layout& layout, std::span<const int64_t> rank_map) {
  Layout c = exact_complement("remap", layout, static_cast<int64_t>(rank_map.size()));
  RankTable table;
  table.shape.push_back(size(c));
  for (int64_t s : layout.top_level_sizes()) table.shape.push_back(s);
  std::vector<int64_t> inner = codomain(layout);
  table.values.reserve(rank_map.size());
  for (int64_t offset : codomain(c)) {
    for (int64_t l : inner) table.values.push_back(rank_map[offset + l]);
  }
  return table;
}

Layout nest(const Layout& layout) {
  return Layout(layout.sizes_, layout.strides_, std::string(1, kOpen) + layout.structure_ + kClose);
}

Layout splice(const Layout& layout, int start, int end, const Layout& replacement) {
  int n = layout.num_modes();
  if (start < 0 || start > end || end > n) {
    throw_error<MeshError>("splice: range [{}, {}) is invalid for {} with {} modes", start, end,
                           layout, n);
  }
  std::vector<Layout> modes;
  for (int i = 0; i < start; ++i) modes.push_back(layout.mode(i));
  for (int i = 0; i < replacement.num_modes(); ++i) modes.push_back(replacement.mode(i));
  for (int i = end; i < n; ++i) modes.push_back(layout.mode(i));
  return Layout::from_modes(modes);
}

// ---- coordinates ------------------------------------------------------------------------------

int64_t crd2idx(std::span<const int64_t> coord, std::span<const int64_t> sizes) {
  if (coord.size() != sizes.size()) {
    throw_error<MeshError>("crd2idx: coordinate has {} entries for {} sizes", coord.size(),
                           sizes.size());
  }
  int64_t index = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (coord[k] < 0 || coord[k] >= sizes[k]) {
      throw_error<MeshError>("crd2idx: coordinate entry {} is {}, outside [0, {})", k, coord[k],
                             sizes[k]);
    }
    index = index * sizes[k] + coord[k];
  }
  return index;
}

std::vector<int64_t> idx2crd(int64_t index, std::span<const int64_t> sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (index < 0 || index >= n) {
    throw_error<MeshError>("idx2crd: index {} is outside [0, {})", index, n);
  }
  std::vector<int64_t> coord(sizes.size());
  for (size_t k = sizes.size(); k-- > 0;) {
    coord[k] = index % sizes[k];
    index /= sizes[k];
  }
  return coord;
}

int64_t crd2offset(std::span<const int64_t> coord, const Layout& layout) {
  std::vector<int64_t> sizes = layout.top_level_sizes();
  return layout(crd2idx(coord, sizes));
}

std::optional<int64_t> index_of(const Layout& layout, int64_t offset) {
  if (offset < 0) return std::nullopt;
  if (is_tractable(layout)) {
    int64_t index = radix_index(layout, offset);
    if (layout(index) == offset) return index;
    return std::nullopt;
  }
  int64_t n = size(layout);
  for (int64_t i = 0; i < n; ++i) {
    if (layout(i) == offset) return i;
  }
  return std::nullopt;
}

int64_t radix_index(const Layout& layout, int64_t offset) {
  const auto& sizes = layout.leaf_sizes();
  const auto& strides = layout.leaf_strides();
  int64_t index = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    int64_t digit = strides[k] == 0 ? 0 : (offset / strides[k]) % sizes[k];
    index = index * sizes[k] + digit;
  }
  return index;
}

}  // namespace spmd
