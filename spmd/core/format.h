// spmd/core/format.h: fmt support shared by every printable spmdsim type.
//
// SPMD_FORMAT_AS_TEXT(Type, expr) defines fmt::formatter<Type> printing `expr` (a string built
// from `value`), without format specs. (Inheriting fmt::formatter<std::string_view> would allow
// padding, but GCC 12 then warns, falsely, inside fmt 9's spec parser: -Wstringop-overflow in
// fill_t, fmtlib/fmt#3334.) Use it at global scope, after the type's declaration.
#pragma once

#include <fmt/format.h>

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
