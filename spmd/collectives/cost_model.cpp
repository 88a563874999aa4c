// spmd/collectives/cost_model.cpp: Topology (code and JSON) and the collective cost formulas of
// Note [Cost model].
#include <spmd/collectives/cost_model.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <spmd/core/error.h>
#include <spmd/mesh/group_family.h>

namespace spmd {
namespace {

constexpr double kBytesPerGB = 1024.0 * 1024.0 * 1024.0;

double ceil_log2(int64_t n) {
  return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n)));
}

double positive(const nlohmann::json& j, const char* key, double fallback, const char* where) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || v.get<double>() <= 0) {
    throw_error<ConfigError>("Topology: '{}{}' must be a positive number, got {}", where, key,
                             v.dump());
  }
  return v.get<double>();
}

}  // namespace

bool Topology::spans_hosts(const std::vector<int>& ranks) const {
  for (int r : ranks) {
    if (r / devices_per_host != ranks.front() / devices_per_host) return true;
  }
  return false;
}

LinkParams Topology::link_for_ranks(const std::vector<int>& ranks) const {
  if (spans_hosts(ranks)) return {inter_host_bandwidth_gbps, inter_host_latency_us};
  return {intra_host_bandwidth_gbps, intra_host_latency_us};
}

LinkParams Topology::link_for(const GroupFamily& family) const {
  for (const std::vector<int>& group : family.groups()) {
    if (spans_hosts(group)) return {inter_host_bandwidth_gbps, inter_host_latency_us};
  }
  return {intra_host_bandwidth_gbps, intra_host_latency_us};
}

Topology Topology::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error<ConfigError>("Topology: malformed JSON: {}", e.what());
  }
  if (!j.is_object())
    throw_error<ConfigError>("Topology: expected a JSON object, got {}", j.dump());
  for (const auto& [key, value] : j.items()) {
    if (key != "devices_per_host" && key != "intra_host" && key != "inter_host" &&
        key != "base_latency_us") {
      throw_error<ConfigError>(
          "Topology: unknown key '{}' (expected devices_per_host, intra_host, inter_host, "
          "base_latency_us)",
          key);
    }
  }
  Topology t;
  if (j.contains("devices_per_host")) {
    const auto& v = j.at("devices_per_host");
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      throw_error<ConfigError>("Topology: 'devices_per_host' must be an integer >= 1, got {}",
                               v.dump());
    }
    t.devices_per_host = v.get<int>();
  }
  for (const char* level : {"intra_host", "inter_host"}) {
    if (!j.contains(level)) continue;
    const auto& link = j.at(level);
    if (!link.is_object()) {
      throw_error<ConfigError>(
          "Topology: '{}' must be an object with bandwidth_gbps and "
          "latency_us, got {}",
          level, link.dump());
    }
    const std::string where = std::string(level) + ".";
    const bool intra = std::string_view(level) == "intra_host";
    double& bw = intra ? t.intra_host_bandwidth_gbps : t.inter_host_bandwidth_gbps;
    double& lat = intra ? t.intra_host_latency_us : t.inter_host_latency_us;
    bw = positive(link, "bandwidth_gbps", bw, where.c_str());
    lat = positive(link, "latency_us", lat, where.c_str());
  }
  if (j.contains("base_latency_us")) {
    const auto& v = j.at("base_latency_us");
    if (!v.is_number() || v.get<double>() < 0) {
      throw_error<ConfigError>("Topology: 'base_latency_us' must be a number >= 0, got {}",
                               v.dump());
    }
    t.base_latency_us = v.get<double>();
  }
  return t;
}

Topology Topology::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error<ConfigError>("Topology::load: cannot open '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str());
}

std::string Topology::to_json() const {
  nlohmann::json j = {
      {"devices_per_host", devices_per_host},
      {"intra_host",
       {{"bandwidth_gbps", intra_host_bandwidth_gbps}, {"latency_us", intra_host_latency_us}}},
      {"inter_host",
       {{"bandwidth_gbps", inter_host_bandwidth_gbps}, {"latency_us", inter_host_latency_us}}},
      {"base_latency_us", base_latency_us}};
  return j.dump(2);
}

const Topology& default_topology() {
  static const Topology instance;
  return instance;
}

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
