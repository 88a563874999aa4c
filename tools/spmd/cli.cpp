// tools/spmd/cli.cpp: list parsing and output shared by the subcommands.
#include "tools/spmd/cli.h"

#include <charconv>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include <spmd/core/error.h>

namespace spmd::cli {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(sep, start);
    out.emplace_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

std::vector<int64_t> parse_int_list(std::string_view text, std::string_view option, int64_t min) {
  if (trim(text).empty()) {
    throw_error<ConfigError>("{}: expected a comma-separated list of integers, got '{}'", option,
                             text);
  }
  std::vector<int64_t> out;
  for (const std::string& raw : split(text, ',')) {
    const std::string_view item = trim(raw);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      throw_error<ConfigError>("{} '{}': '{}' is not an integer", option, text, item);
    }
    if (value < min) {
      throw_error<ConfigError>("{} '{}': {} is below the minimum {}", option, text, value, min);
    }
    out.push_back(value);
  }
  return out;
}

std::vector<std::string> parse_name_list(std::string_view text, std::string_view option) {
  std::vector<std::string> out;
  for (const std::string& raw : split(text, ',')) {
    const std::string_view item = trim(raw);
    if (item.empty()) {
      throw_error<ConfigError>("{} '{}': expected comma-separated names, found an empty one",
                               option, text);
    }
    out.emplace_back(item);
  }
  return out;
}

int64_t checked_product(const std::vector<int64_t>& sizes, int64_t limit, std::string_view option) {
  int64_t product = 1;
  for (int64_t s : sizes) {
    if (s != 0 && product > limit / s) {
      throw_error<ConfigError>("{}: more than {} elements; the tool simulates at most that many",
                               option, limit);
    }
    product *= s;
  }
  if (product > limit) {
    throw_error<ConfigError>("{}: {} is more than {}, the most the tool simulates", option, product,
                             limit);
  }
  return product;
}

void print_json(const nlohmann::json& doc) {
  const std::string text = doc.dump(2);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace spmd::cli
