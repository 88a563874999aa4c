// spmd/world/topology.h: the machine a World runs on, as the cost model sees it: hosts of
// devices_per_host ranks each, and the link within and between hosts.
//
// A World carries its topology (World::topology(), the default one unless --spmd-topology or
// set_topology gave another); the cost model (collectives/cost_model.h, Note [Cost model]) turns a
// collective on it into an estimated time.
//
//   Topology t = Topology::from_json(R"({"devices_per_host": 4})");
//   t.link_for_ranks({0, 5}).bandwidth_gbps;   // ranks on two hosts: the inter-host link
#pragma once

#include <string>
#include <vector>

namespace spmd {

struct LinkParams {
  double bandwidth_gbps = 0.0;  // GB/s (2^30 bytes)
  double latency_us = 0.0;      // per hop
};

class Topology {
 public:
  int devices_per_host = 8;
  double intra_host_bandwidth_gbps = 87.7;
  double intra_host_latency_us = 0.6;
  double inter_host_bandwidth_gbps = 87.7 * 0.22;
  double inter_host_latency_us = 2.7;
  double base_latency_us = 6.6;

  // The link a group family (mesh/group_family.h, or anything whose groups() lists each group's
  // ranks) uses: inter-host when any group holds ranks of two hosts.
  template <class Family>
  LinkParams link_for(const Family& family) const {
    for (const std::vector<int>& group : family.groups()) {
      if (spans_hosts(group)) return {inter_host_bandwidth_gbps, inter_host_latency_us};
    }
    return {intra_host_bandwidth_gbps, intra_host_latency_us};
  }
  // As above for one group given by its ranks.
  LinkParams link_for_ranks(const std::vector<int>& ranks) const;
  // True when `ranks` are not all on one host.
  bool spans_hosts(const std::vector<int>& ranks) const;

  // {"devices_per_host": 8, "intra_host": {"bandwidth_gbps": 87.7, "latency_us": 0.6},
  //  "inter_host": {...}, "base_latency_us": 6.6}; every key optional (defaults above).
  // ConfigError naming the key for bad values or malformed JSON.
  static Topology from_json(const std::string& text);
  static Topology load(const std::string& path);
  std::string to_json() const;
  bool operator==(const Topology&) const = default;
};

// The default topology (the seed's constants, 8 devices per host).
const Topology& default_topology();

}  // namespace spmd
