// spmd/collectives/cost_model.h: the alpha-beta cost of each collective on a topology
// (world/topology.h).
//
// Note [Cost model]
// Taken from PyTorch DTensor's collective cost model (ring algorithms on Ampere/Hopper, see
// ../shared/seeds/002): a group whose ranks all sit on one host communicates at the intra-host
// link (87.7 GB/s, 0.6 us per hop); a group spanning hosts at the inter-host link (0.22x the
// bandwidth, 2.7 us per hop). Ranks are placed on hosts in blocks of devices_per_host
// (rank / devices_per_host). A collective over n ranks moving S bytes costs
//     base_latency + hops * link_latency + S * factor / bandwidth
// with S and the factor in nccl-tests conventions:
//   all_reduce      S = per-rank bytes     factor 2(n-1)/n   hops 2(n-1)
//   all_gather      S = gathered bytes     factor  (n-1)/n   hops  n-1
//   reduce_scatter  S = per-rank input     factor  (n-1)/n   hops  n-1
//   all_to_all(_single), scatter, gather   factor (n-1)/n    hops  n-1
//   broadcast, reduce                      factor 1          hops  log2(n) rounded up
//   permute (one send/recv per rank)       factor 1          hops  1
//   send, recv (one transfer)              factor 1          hops  1
//   barrier                                S = 0             hops  log2(n) rounded up
// Bandwidths are in GB/s with GB = 2^30 bytes, as in the seed. A group of one rank costs 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/world/topology.h>

namespace spmd {

// Estimated microseconds for one collective over `group_size` ranks on `link`; `bytes` is S in
// the table of Note [Cost model].
double collective_cost_us(CollectiveKind kind, int64_t bytes, int64_t group_size,
                          const LinkParams& link, const Topology& topology);
// S in the table of Note [Cost model] for a call whose ranks each pass `rank_bytes` of input.
int64_t collective_cost_bytes(CollectiveKind kind, int64_t rank_bytes, int64_t group_size);

}  // namespace spmd
