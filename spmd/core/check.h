// spmd/core/check.h: CHECK macros for internal invariants.
//
// SPMD_CHECK(cond) and the comparison forms SPMD_CHECK_EQ/NE/LT/LE/GT/GE throw
// spmd::InternalError("file:line: check failed: a == b (3 vs 4)"). They are for invariants
// only: user input errors throw a typed spmd::Error instead (core/error.h). SPMD_DCHECK* are
// the same checks, compiled only when NDEBUG is unset or SPMD_ENABLE_DCHECK is defined.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <string_view>

namespace spmd::detail {

[[noreturn]] void check_failed(const char* file, int line, std::string_view expression,
                               std::string_view detail);

template <class T>
std::string check_operand(const T& value) {
  if constexpr (fmt::is_formattable<T>::value) {
    return fmt::format("{}", value);
  } else {
    return "<unprintable>";
  }
}

}  // namespace spmd::detail

#define SPMD_CHECK(cond)                                                      \
  do {                                                                        \
    if (!(cond)) ::spmd::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define SPMD_CHECK_MSG(cond, ...)                                                        \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::spmd::detail::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#define SPMD_CHECK_OP_(a, b, op)                                                \
  do {                                                                          \
    const auto& spmd_check_a_ = (a);                                            \
    const auto& spmd_check_b_ = (b);                                            \
    if (!(spmd_check_a_ op spmd_check_b_)) {                                    \
      ::spmd::detail::check_failed(                                             \
          __FILE__, __LINE__, #a " " #op " " #b,                                \
          fmt::format("{} vs {}", ::spmd::detail::check_operand(spmd_check_a_), \
                      ::spmd::detail::check_operand(spmd_check_b_)));           \
    }                                                                           \
  } while (0)

#define SPMD_CHECK_EQ(a, b) SPMD_CHECK_OP_(a, b, ==)
#define SPMD_CHECK_NE(a, b) SPMD_CHECK_OP_(a, b, !=)
#define SPMD_CHECK_LT(a, b) SPMD_CHECK_OP_(a, b, <)
#define SPMD_CHECK_LE(a, b) SPMD_CHECK_OP_(a, b, <=)
#define SPMD_CHECK_GT(a, b) SPMD_CHECK_OP_(a, b, >)
#define SPMD_CHECK_GE(a, b) SPMD_CHECK_OP_(a, b, >=)

#if !defined(NDEBUG) || defined(SPMD_ENABLE_DCHECK)
#define SPMD_DCHECK(cond) SPMD_CHECK(cond)
#define SPMD_DCHECK_EQ(a, b) SPMD_CHECK_EQ(a, b)
#define SPMD_DCHECK_LT(a, b) SPMD_CHECK_LT(a, b)
#define SPMD_DCHECK_LE(a, b) SPMD_CHECK_LE(a, b)
#else
#define SPMD_DCHECK(cond) \
  do {                    \
  } while (0)
#define SPMD_DCHECK_EQ(a, b) SPMD_DCHECK(true)
#define SPMD_DCHECK_LT(a, b) SPMD_DCHECK(true)
#define SPMD_DCHECK_LE(a, b) SPMD_DCHECK(true)
#endif
