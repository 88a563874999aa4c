// tests/support/collectives_since.h: the collectives a rank recorded in the trace since a point,
// for tests that check which collectives a forward or backward issues.
#pragma once

#include <string>
#include <vector>

#include <spmd/spmd.h>

namespace spmd::test_support {

// The collectives that rank `rank` recorded since trace record `start`, as "op dim_name", in
// order (start: trace().records().size() before the code under test).
inline std::vector<std::string> collectives_since(size_t start, int rank) {
  std::vector<std::string> out;
  const std::vector<TraceRecord> records = trace().records();
  for (size_t i = start; i < records.size(); ++i) {
    if (records[i].rank == rank) out.push_back(records[i].op + " " + records[i].dim_name);
  }
  return out;
}

}  // namespace spmd::test_support
