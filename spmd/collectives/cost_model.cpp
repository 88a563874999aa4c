// spmd/collectives/cost_model.cpp: the collective cost formulas of Note [Cost model].
#include <spmd/collectives/cost_model.h>

#include <cmath>

namespace spmd {
namespace {

constexpr double kBytesPerGB = 1024.0 * 1024.0 * 1024.0;

double ceil_log2(int64_t n) {
  return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n)));
}

}  // namespace

int64_t collective_cost_bytes(CollectiveKind kind, int64_t rank_bytes, int64_t group_size) {
  switch (kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::Gather:
      return rank_bytes * group_size;
    default:
      return rank_bytes;
  }
}

double collective_cost_us(CollectiveKind kind, int64_t bytes, int64_t group_size,
                          const LinkParams& link, const Topology& topology) {
  if (group_size <= 1) return 0.0;
  const double n = static_cast<double>(group_size);
  double factor = 0.0;
  double hops = 0.0;
  switch (kind) {
    case CollectiveKind::AllReduce:
      factor = 2.0 * (n - 1.0) / n;
      hops = 2.0 * (n - 1.0);
      break;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll:
    case CollectiveKind::AllToAllSingle:
    case CollectiveKind::Scatter:
    case CollectiveKind::Gather:
      factor = (n - 1.0) / n;
      hops = n - 1.0;
      break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::Reduce:
      factor = 1.0;
      hops = ceil_log2(group_size);
      break;
    case CollectiveKind::Permute:
      factor = 1.0;
      hops = 1.0;
      break;
    case CollectiveKind::Barrier:
      factor = 0.0;
      hops = ceil_log2(group_size);
      break;
  }
  const double transfer_s = static_cast<double>(bytes) / kBytesPerGB * factor / link.bandwidth_gbps;
  return topology.base_latency_us + hops * link.latency_us + transfer_s * 1e6;
}

}  // namespace spmd
