// spmd/collectives/types.cpp: names, hashing, descriptions and comparisons of collectives and
// their options, all derived from the options structs (Note [One collective, one options struct]).
#include <spmd/collectives/types.h>

#include <charconv>

namespace spmd {
namespace {

constexpr std::array<std::string_view, kNumCollectiveKinds> kCollectiveNames =
    detail::collective_names(std::make_index_sequence<kNumCollectiveKinds>());

}  // namespace

std::string_view collective_name(CollectiveKind kind) {
  return kCollectiveNames[static_cast<size_t>(kind)];
}

std::optional<CollectiveKind> parse_collective(std::string_view name) {
  for (size_t i = 0; i < kCollectiveNames.size(); ++i) {
    if (kCollectiveNames[i] == name) return static_cast<CollectiveKind>(i);
  }
  return std::nullopt;
}

bool AllToAllSingleOptions::operator==(const AllToAllSingleOptions& other) const {
  auto same = [](const PerRank<std::vector<int64_t>>& a, const PerRank<std::vector<int64_t>>& b) {
    if (a.empty() || b.empty()) return a.empty() == b.empty();
    if (a.is_uniform() != b.is_uniform()) return false;
    if (a.is_uniform()) return *a.uniform() == *b.uniform();
    if (a.ranks() != b.ranks()) return false;
    for (int r : a.ranks()) {
      if (a.at(r) != b.at(r)) return false;
    }
    return true;
  };
  return same(out_splits, other.out_splits) && same(in_splits, other.in_splits);
}

namespace detail {

std::size_t hash_field(const PerRank<std::vector<int64_t>>& splits) {
  if (splits.empty()) return static_cast<std::size_t>(-1);
  if (splits.is_uniform()) return hash_range(*splits.uniform());
  std::size_t seed = 0;
  for (int r : splits.ranks()) {
    hash_combine(seed, r);
    hash_combine(seed, hash_range(splits.at(r)));
  }
  return seed;
}

void append_field_text(std::string& out, const PerRank<std::vector<int64_t>>& splits) {
  out += splits.empty() ? std::string("even") : splits.to_string();
}

void append_field_text(std::string& out, ReduceOp op) {
  out += reduce_op_name(op);
}

void append_field_text(std::string& out, int64_t value) {
  char text[24];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

}  // namespace detail

std::size_t hash_value(const CollectiveOptions& o) {
  return std::visit([](const auto& options) { return hash_value(options); }, o);
}

std::size_t shared_hash(const CollectiveOptions& o) {
  return std::visit([](const auto& options) { return detail::hash_fields<true>(options); }, o);
}

std::vector<std::string_view> shared_field_differences(const CollectiveOptions& a,
                                                       const CollectiveOptions& b) {
  std::vector<std::string_view> out;
  if (a.index() != b.index()) return out;
  std::visit(
      [&](const auto& x) {
        using Options = std::decay_t<decltype(x)>;
        const auto fx = x.fields();
        const auto fy = std::get<Options>(b).fields();
        [[maybe_unused]] auto one = [&](const auto& fa, const auto& fb) {
          using T = std::remove_cvref_t<decltype(fa.value)>;
          if constexpr (!detail::IsPerRank<T>::value) {
            if (!(fa.value == fb.value)) out.push_back(fa.name);
          }
        };
        [&]<std::size_t... I>(std::index_sequence<I...>) {
          (one(std::get<I>(fx), std::get<I>(fy)), ...);
        }
        (std::make_index_sequence<std::tuple_size_v<decltype(fx)>>());
      },
      a);
  return out;
}

std::string describe(const CollectiveOptions& o) {
  return std::visit([](const auto& options) { return describe(options); }, o);
}

}  // namespace spmd
