// spmd/world/topology.cpp: Topology in code and as JSON.
#include <spmd/world/topology.h>

#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include <spmd/core/error.h>

namespace spmd {
namespace {

constexpr uint64_t kMaxDevices = std::numeric_limits<int>::max();

// A JSON value for a message: scalars as written, containers by their type (dumping one would
// recurse as deep as it nests).
std::string shown(const nlohmann::json& v) {
  if (v.is_structured()) return fmt::format("an {}", v.type_name());
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 80) + "..." : text;
}

double positive(const nlohmann::json& j, const char* key, double fallback, const char* where) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || v.get<double>() <= 0) {
    throw_error<ConfigError>("Topology: '{}{}' must be a positive number, got {}", where, key,
                             shown(v));
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

Topology Topology::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error<ConfigError>("Topology: malformed JSON: {}", e.what());
  }
  if (!j.is_object())
    throw_error<ConfigError>("Topology: expected a JSON object, got {}", shown(j));
  for (const auto& [key, value] : j.items()) {
    if (key != "devices_per_host" && key != "intra_host" && key != "inter_host" &&
        key != "base_latency_us" && key != "name" && key != "source") {
      throw_error<ConfigError>(
          "Topology: unknown key '{}' (expected devices_per_host, intra_host, inter_host, "
          "base_latency_us, name, source)",
          key);
    }
    if ((key == "name" || key == "source") && !value.is_string()) {
      throw_error<ConfigError>("Topology: '{}' must be a string, got {}", key, shown(value));
    }
  }
  Topology t;
  if (j.contains("devices_per_host")) {
    const auto& v = j.at("devices_per_host");
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= kMaxDevices
                              : v.is_number_integer() && v.get<int64_t>() >= 1;
    if (!in_range) {
      throw_error<ConfigError>("Topology: 'devices_per_host' must be an integer in [1, {}], got {}",
                               kMaxDevices, shown(v));
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
          level, shown(link));
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
                               shown(v));
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

}  // namespace spmd
