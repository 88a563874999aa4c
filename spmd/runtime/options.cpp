// spmd/runtime/options.cpp: --spmd-* flags and SPMD_* variables.
#include <spmd/runtime/options.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>
#include <spmd/world/backend_driver.h>

namespace spmd {
namespace {

struct FlagSpec {
  std::string_view flag;
  const char* variable;
  bool alias = false;  // an older name, accepted but not listed
};
// The environment is read in this order, so a variable later in the list wins over an alias
// before it (SPMD_TIMEOUT over SPMD_NCCL_TIMEOUT).
constexpr FlagSpec kFlags[] = {
    {"--spmd-backend", "SPMD_BACKEND"},
    {"--spmd-world-size", "SPMD_WORLD_SIZE"},
    {"--spmd-trace", "SPMD_TRACE"},
    {"--spmd-debug", "SPMD_DEBUG"},
    {"--spmd-topology", "SPMD_TOPOLOGY"},
    {"--spmd-nccl-timeout", "SPMD_NCCL_TIMEOUT", true},
    {"--spmd-timeout", "SPMD_TIMEOUT"},
    {"--spmd-gpus-per-process", "SPMD_GPUS_PER_PROCESS"},
    {"--spmd-tensors", "SPMD_TENSORS"},
    {"--spmd-parity-tol", "SPMD_PARITY_TOL"},
    {"--spmd-dump-values", "SPMD_DUMP_VALUES"},
};

std::string valid_flags() {
  std::string out;
  for (const FlagSpec& f : kFlags) {
    if (!f.alias) out += fmt::format("{}{}", out.empty() ? "" : ", ", f.flag);
  }
  return out;
}

// Longer timeouts overflow the clocks' integer nanoseconds; no run waits a billion seconds.
constexpr double kMaxTimeoutSeconds = 1e9;

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Applies one setting; `source` names it in messages ("--spmd-backend=foo", "SPMD_BACKEND=foo").
void apply(LaunchOptions& o, std::string_view flag, const std::string& value,
           const std::string& source) {
  if (flag == "--spmd-backend") {
    const auto& names = backend_names();
    if (std::find(names.begin(), names.end(), value) == names.end()) {
      throw_error<ConfigError>("unknown backend '{}' ({}); valid backends: {}", value, source,
                               backend_list());
    }
    o.backend = value;
    o.backend_source = source;
  } else if (flag == "--spmd-world-size") {
    const auto n = parse_int(value);
    if (!n || *n < 1) {
      throw_error<ConfigError>("{}: the world size must be a positive integer, got '{}'", source,
                               value);
    }
    o.world_size = *n;
    o.world_size_source = source;
  } else if (flag == "--spmd-trace") {
    o.trace_path = value;
  } else if (flag == "--spmd-debug") {
    DebugOptions parsed = parse_debug_options(value, source);
    parsed.parity_tol = o.debug.parity_tol;
    parsed.dump_values = o.debug.dump_values;
    o.debug = std::move(parsed);
  } else if (flag == "--spmd-parity-tol") {
    char* end = nullptr;
    const double tol = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(tol > 0) || !std::isfinite(tol)) {
      throw_error<ConfigError>(
          "{}: the parity tolerance is a positive relative difference (1e-4: the values may differ "
          "by 1e-4 of the tensor's largest), got '{}'",
          source, value);
    }
    o.debug.parity_tol = tol;
  } else if (flag == "--spmd-dump-values") {
    if (value.empty()) {
      throw_error<ConfigError>("{}: give the folder the values are written to", source);
    }
    o.debug.dump_values = value;
  } else if (flag == "--spmd-topology") {
    o.topology_path = value;
  } else if (flag == "--spmd-timeout" || flag == "--spmd-nccl-timeout") {
    char* end = nullptr;
    const double seconds = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(seconds > 0) || !(seconds <= kMaxTimeoutSeconds)) {
      throw_error<ConfigError>(
          "{}: the timeout must be a positive number of seconds up to {}, got '{}'", source,
          kMaxTimeoutSeconds, value);
    }
    o.timeout_s = seconds;
  } else if (flag == "--spmd-gpus-per-process") {
    const auto n = parse_int(value);
    if (!n || *n < 1) {
      throw_error<ConfigError>("{}: GPUs per process must be a positive integer, got '{}'", source,
                               value);
    }
    o.gpus_per_process = *n;
  } else if (flag == "--spmd-tensors") {
    if (value != "real" && value != "meta") {
      throw_error<ConfigError>(
          "{}: tensors are 'real' (the default) or 'meta' (shape-only, a dry run), got '{}'",
          source, value);
    }
    o.meta_tensors = value == "meta";
  }
}

}  // namespace

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const KnownBackend& k : known_backends()) out.emplace_back(k.name);
    return out;
  }();
  return names;
}

std::string backend_list() {
  return known_backend_list();
}

DebugOptions parse_debug_options(std::string_view list, std::string_view source) {
  DebugOptions debug;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view item = list.substr(start, end - start);
    if (item == "check") {
      debug.check = true;
    } else if (item == "replicate") {
      debug.replicate = true;
    } else if (item == "fingerprint") {
      debug.fingerprint = true;
    } else if (item == "nan") {
      debug.nan = true;
    } else if (item == "nan:allow-inf") {
      debug.nan = true;
      debug.allow_inf = true;
    } else if (item == "divergence") {
      debug.divergence = true;
    } else if (item == "types") {
      debug.types = true;
    } else if (item == "parity") {
      debug.parity = true;
    } else if (item == "all") {
      debug.all = true;
    } else if (!item.empty()) {
      throw_error<ConfigError>(
          "{}: unknown debug check '{}'; valid checks: all, check, replicate, fingerprint, nan, "
          "nan:allow-inf, divergence, types, parity",
          source, item);
    }
    start = end + 1;
  }
  return debug;
}

LaunchOptions launch_options_from_env() {
  LaunchOptions o;
  // Read by the kernels' thread pool, not here; checked here so a bad value fails the launch.
  env_num_threads();
  for (const FlagSpec& f : kFlags) {
    if (auto value = env_value(f.variable)) {
      apply(o, f.flag, *value, fmt::format("{}={}", f.variable, *value));
    }
  }
  return o;
}

LaunchOptions parse_launch_options(int& argc, char** argv) {
  LaunchOptions o = launch_options_from_env();
  int out = argc > 0 ? 1 : 0;  // argv[0] stays
  bool done = false;
  for (int i = out; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (done || arg.substr(0, 7) != "--spmd-") {
      if (arg == "--") done = true;
      argv[out++] = argv[i];
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string_view flag = arg.substr(0, eq);
    const auto* spec = std::find_if(std::begin(kFlags), std::end(kFlags),
                                    [&](const FlagSpec& f) { return f.flag == flag; });
    if (spec == std::end(kFlags)) {
      throw_error<ConfigError>("unknown flag '{}'; spmdsim's flags are {}", arg, valid_flags());
    }
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw_error<ConfigError>("flag {} needs a value ({}=...)", flag, flag);
    }
    apply(o, flag, value, fmt::format("{}={}", flag, value));
  }
  argc = out;
  argv[argc] = nullptr;
  return o;
}

}  // namespace spmd
