// spmd/core/env.h: reading configuration from the environment.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace spmd {

// The value of environment variable `name`, or nullopt when unset or empty.
inline std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace spmd
