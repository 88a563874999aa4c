// spmd/ops/placement.cpp: printing, parsing and hashing of placements.
#include <spmd/ops/placement.h>

#include <cctype>
#include <charconv>
#include <ostream>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {

bool is_partial_op(ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Product ||
         op == ReduceOp::Min || op == ReduceOp::Max;
}

std::string to_string(const Placement& p) {
  if (const Shard* s = std::get_if<Shard>(&p)) return fmt::format("S({})", s->dim);
  if (is_replicate(p)) return "R";
  return fmt::format("P({})", reduce_op_str(std::get<Partial>(p).op));
}

std::string to_string(const Placements& placements) {
  std::string out;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i) out += ',';
    out += to_string(placements[i]);
  }
  return out;
}

namespace {

// The text between '(' and ')' of `item` when it has the form name(...), or nullopt.
std::optional<std::string_view> argument_of(std::string_view item, std::string_view name) {
  if (item.size() < name.size() + 2 || item.substr(0, name.size()) != name) return std::nullopt;
  if (item[name.size()] != '(' || item.back() != ')') return std::nullopt;
  return item.substr(name.size() + 1, item.size() - name.size() - 2);
}

Placement parse_one(std::string_view item, std::string_view text) {
  auto bad = [&](std::string_view why) -> Placement {
    throw_error<PlacementError>(
        "parse_placements: bad placement '{}' in \"{}\": {} (expected S(dim), R or P(op) with op "
        "sum, avg, product, min or max, separated by commas)",
        item, text, why);
  };
  if (item.empty()) return bad("empty item");
  if (item == "R" || item == "Replicate()" || item == "Replicate") return Replicate{};
  if (item == "P" || item == "Partial()" || item == "Partial") return Partial{};
  auto shard_arg = argument_of(item, "S");
  if (!shard_arg) shard_arg = argument_of(item, "Shard");
  if (shard_arg) {
    std::string_view digits = *shard_arg;
    if (digits.substr(0, 4) == "dim=") digits.remove_prefix(4);
    int dim = 0;
    const char* end = digits.data() + digits.size();
    auto [ptr, ec] = std::from_chars(digits.data(), end, dim);
    if (digits.empty() || ec != std::errc() || ptr != end)
      return bad("the shard dim is not an int");
    return Shard{dim};
  }
  auto partial_arg = argument_of(item, "P");
  if (!partial_arg) partial_arg = argument_of(item, "Partial");
  if (partial_arg) {
    std::string_view name = *partial_arg;
    if (name.size() >= 2 && (name.front() == '\'' || name.front() == '"') &&
        name.back() == name.front()) {
      name = name.substr(1, name.size() - 2);
    }
    auto op = parse_reduce_op(name);
    if (!op) return bad(fmt::format("unknown reduce op '{}'", name));
    if (!is_partial_op(*op)) {
      return bad(fmt::format("reduce op '{}' cannot be a Partial placement", name));
    }
    return Partial{*op};
  }
  return bad("not a placement");
}

}  // namespace

Placements parse_placements(std::string_view text) {
  std::string compact;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) compact += c;
  }
  Placements out;
  if (compact.empty()) return out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= compact.size(); ++i) {
    if (i < compact.size() && compact[i] == '(') ++depth;
    if (i < compact.size() && compact[i] == ')') --depth;
    if (i == compact.size() || (compact[i] == ',' && depth == 0)) {
      out.push_back(parse_one(std::string_view(compact).substr(start, i - start), text));
      start = i + 1;
    }
  }
  return out;
}

std::size_t hash_value(const Placement& p) {
  return std::visit([](const auto& v) { return std::hash<std::decay_t<decltype(v)>>{}(v); }, p);
}

std::size_t hash_value(const Placements& placements) {
  std::size_t seed = placements.size();
  for (const Placement& p : placements) hash_combine(seed, hash_value(p));
  return seed;
}

std::ostream& operator<<(std::ostream& os, const Placement& p) {
  return os << to_string(p);
}

std::ostream& operator<<(std::ostream& os, const Placements& placements) {
  return os << to_string(placements);
}

}  // namespace spmd
