// tools/spmd/version_command.cpp: `spmd version`, the library version and what this build holds
// (spmd/config.h).
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/config.h>
#include <spmd/world/backend_driver.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

// The backends compiled into this build, in the catalog's order (world/backend_driver.h); a program
// gets nccl only by linking spmd::nccl.
std::vector<std::string> built_backends() {
  std::vector<std::string> out;
  for (const KnownBackend& k : known_backends()) {
    if (k.built) out.emplace_back(k.name);
  }
  return out;
}

}  // namespace

Command add_version_command(CLI::App& parent) {
  auto json = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand("version", "The spmdsim version and the backends built");
  app->add_flag("--json", *json, "Machine-readable output");
  return {app, [json] {
            const std::vector<std::string> backends = built_backends();
            const std::string sanitize = SPMD_SANITIZE;
            if (*json) {
              nlohmann::json doc = {{"version", SPMD_VERSION_STRING},
                                    {"version_major", SPMD_VERSION_MAJOR},
                                    {"version_minor", SPMD_VERSION_MINOR},
                                    {"version_patch", SPMD_VERSION_PATCH},
                                    {"backends", backends},
                                    {"sanitize", sanitize}};
              print_json(doc);
              return 0;
            }
            fmt::print("spmd {}\nbackends: {}\n", SPMD_VERSION_STRING, fmt::join(backends, ", "));
            if (!sanitize.empty()) fmt::print("sanitizer: {}\n", sanitize);
            return 0;
          }};
}

}  // namespace spmd::cli
