// spmd/core/check.cpp: the failure path of the CHECK macros.
#include <spmd/core/check.h>

#include <spmd/core/error.h>

namespace spmd::detail {

void check_failed(const char* file, int line, std::string_view expression,
                  std::string_view detail) {
  if (detail.empty()) {
    throw InternalError(fmt::format("{}:{}: check failed: {}", file, line, expression));
  }
  throw InternalError(fmt::format("{}:{}: check failed: {} ({})", file, line, expression, detail));
}

}  // namespace spmd::detail
