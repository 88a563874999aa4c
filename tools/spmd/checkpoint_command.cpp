// tools/spmd/checkpoint_command.cpp: `spmd checkpoint inspect DIR`, what a checkpoint written by
// spmd::checkpoint::save holds (Note [Checkpoint format] in spmd/nn/checkpoint.h).
//
//   spmd checkpoint inspect DIR [--json]   per entry: global shape, dtype, placements when saved,
//                                          chunks and bytes
#include <memory>
#include <string>

#include <fmt/format.h>

#include <spmd/nn/checkpoint.h>
#include <spmd/tensor/shape.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {

Command add_checkpoint_command(CLI::App& parent) {
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand("checkpoint", "Distributed checkpoints (spmd::checkpoint)");
  app->require_subcommand(1);
  CLI::App* inspect = app->add_subcommand("inspect", "What a checkpoint folder holds");
  inspect->add_option("dir", *dir, "The checkpoint folder")->required();
  inspect->add_flag("--json", *json, "Machine-readable output");
  return {app, [dir, json] {
            const auto entries = checkpoint::inspect(*dir);
            if (*json) {
              nlohmann::json doc = nlohmann::json::object();
              for (const auto& [key, e] : entries) {
                doc[key] = {{"shape", e.shape},
                            {"dtype", std::string(dtype_name(e.dtype))},
                            {"placements", e.placements},
                            {"chunks", e.chunks},
                            {"bytes", e.bytes}};
              }
              print_json(doc);
              return 0;
            }
            uint64_t total = 0;
            for (const auto& [key, e] : entries) {
              fmt::print("{:<24} {:>4} {:<16} {:<12} {:>3} chunks {:>12} bytes\n", key,
                         dtype_name(e.dtype), shape_str(e.shape),
                         e.placements.empty() ? std::string("(Tensor)") : e.placements, e.chunks,
                         e.bytes);
              total += e.bytes;
            }
            fmt::print("{} entries, {} bytes\n", entries.size(), total);
            return 0;
          }};
}

}  // namespace spmd::cli
