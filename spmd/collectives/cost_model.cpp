// spmd/collectives/cost_model.cpp: the collective cost formulas of Note [Cost model].
#include <spmd/collectives/cost_model.h>

#include <cmath>
#include <type_traits>

#include <spmd/core/overloaded.h>

namespace spmd {
namespace {

constexpr double kBytesPerGB = 1024.0 * 1024.0 * 1024.0;

double ceil_log2(int64_t n) {
  return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n)));
}

// One line of the table in Note [Cost model], for a group of n ranks.
struct CostLine {
  double factor;         // of S / bandwidth
  double hops;           // of the link latency
  bool gathers = false;  // S is the gathered result, not the per-rank input
};

template <class Options>
using Of = std::type_identity<Options>;

// The lines, one per collective: a collective without its line does not compile.
CostLine cost_line(CollectiveKind kind, int64_t group_size) {
  const double n = static_cast<double>(group_size);
  const CostLine twice_ring{2.0 * (n - 1.0) / n, 2.0 * (n - 1.0)};
  const CostLine ring{(n - 1.0) / n, n - 1.0};
  const CostLine gathering{ring.factor, ring.hops, true};
  const CostLine tree{1.0, ceil_log2(group_size)};
  const CostLine one_hop{1.0, 1.0};
  const CostLine sync{0.0, ceil_log2(group_size)};
  const Overloaded lines{
      [&](Of<AllReduceOptions>) { return twice_ring; },
      [&](Of<AllGatherOptions>) { return gathering; },
      [&](Of<ReduceScatterOptions>) { return ring; },
      [&](Of<AllToAllOptions>) { return ring; },
      [&](Of<AllToAllSingleOptions>) { return ring; },
      [&](Of<BroadcastOptions>) { return tree; },
      [&](Of<ScatterOptions>) { return ring; },
      [&](Of<GatherOptions>) { return gathering; },
      [&](Of<ReduceOptions>) { return tree; },
      [&](Of<PermuteOptions>) { return one_hop; },
      [&](Of<SendOptions>) { return one_hop; },
      [&](Of<RecvOptions>) { return one_hop; },
      [&](Of<BarrierOptions>) { return sync; },
  };
  return visit_kind(kind, lines);
}

}  // namespace

int64_t collective_cost_bytes(CollectiveKind kind, int64_t rank_bytes, int64_t group_size) {
  return cost_line(kind, group_size).gathers ? rank_bytes * group_size : rank_bytes;
}

double collective_cost_us(CollectiveKind kind, int64_t bytes, int64_t group_size,
                          const LinkParams& link, const Topology& topology) {
  if (group_size <= 1) return 0.0;
  const CostLine line = cost_line(kind, group_size);
  const double transfer_s =
      static_cast<double>(bytes) / kBytesPerGB * line.factor / link.bandwidth_gbps;
  return topology.base_latency_us + line.hops * link.latency_us + transfer_s * 1e6;
}

}  // namespace spmd
