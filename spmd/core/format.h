// spmd/core/format.h: fmt support shared by every printable spmdsim type.
//
// SPMD_FORMAT_AS_TEXT(Type, expr) defines fmt::formatter<Type> printing `expr` (a string built
// from `value`), without format specs. (Inheriting fmt::formatter<std::string_view> would allow
// padding, but GCC 12 then warns, falsely, inside fmt 9's spec parser: -Wstringop-overflow in
// fill_t, fmtlib/fmt#3334.) Use it at global scope, after the type's declaration.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace spmd {

// "'dp', 'tp'": each name in single quotes, comma-separated (messages listing names).
inline std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) {
    out += fmt::format("{}'{}'", k ? ", " : "", names[k]);
  }
  return out;
}

// The rank-list formatters: every message, label and report prints a set of ranks with one of
// these three (fmt's own range formatter draws a false GCC 12 warning).

// "[0, 1, 2]": a rank list as a value, in its order (a group's members: "group ranks [0, 4]").
std::string ranks_str(const std::vector<int>& ranks);

// "0-3,8": ascending ranks with runs of three or more collapsed ("0,1" stays), as the sharding
// picture's labels, the debug reports and the report prefixes print rank sets; "" for none.
std::string ranks_compact(const std::vector<int>& ranks);

// "rank 3", "ranks 0-3,8" (ranks_compact) or "no ranks": a rank set as a sentence names it
// ("[ranks 0-7] CommError: ...", "the call still lacks rank 3").
std::string ranks_text(const std::vector<int>& ranks);

}  // namespace spmd

namespace spmd::detail {

// The parse half of a spec-less formatter.
struct TextFormatterBase {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
};

}  // namespace spmd::detail

#define SPMD_FORMAT_AS_TEXT(Type, expr)                             \
  template <>                                                       \
  struct fmt::formatter<Type> : ::spmd::detail::TextFormatterBase { \
    template <class Ctx>                                            \
    auto format(const Type& value, Ctx& ctx) const {                \
      return fmt::format_to(ctx.out(), "{}", expr);                 \
    }                                                               \
  };
