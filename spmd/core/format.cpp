// spmd/core/format.cpp: the rank-list formatters (core/format.h).
#include <spmd/core/format.h>

namespace spmd {

std::string ranks_str(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

std::string ranks_compact(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += out.empty() ? "" : ",";
    if (j == i) {
      out += fmt::format("{}", ranks[i]);
    } else {
      out += fmt::format("{}{}{}", ranks[i], j == i + 1 ? "," : "-", ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no ranks";
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  return "ranks " + ranks_compact(ranks);
}

}  // namespace spmd
