// tools/spmd/cli.h: what the subcommands of `spmd` share: how each registers itself, parsing of
// list arguments, and output.
//
// Exit codes (every subcommand): 0 success; 1 a check the command ran failed (a redistribution
// that did not verify, traces that differ); 2 bad input (a malformed value, an unknown name, an
// unreadable file): the message on stderr names the option and the value. Input errors are
// spmd::Error exceptions (ConfigError for the command line itself, MeshError, PlacementError, ...
// from the library), caught once in main.cpp; nothing else escapes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace spmd::cli {

// A registered subcommand: `run` is called when `app` was given on the command line and returns
// the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Each adds its subcommand(s) to `parent` and returns what main() runs.
Command add_mesh_command(CLI::App& parent);
Command add_layout_command(CLI::App& parent);
Command add_redistribute_command(CLI::App& parent);
Command add_trace_command(CLI::App& parent);
Command add_parity_command(CLI::App& parent);
Command add_checkpoint_command(CLI::App& parent);
Command add_version_command(CLI::App& parent);

// "2,2,2" -> {2, 2, 2}. ConfigError naming `option`, the text and the bad item for an empty list,
// an item that is not an integer, or one below `min`.
std::vector<int64_t> parse_int_list(std::string_view text, std::string_view option,
                                    int64_t min = 1);
// "dp,cp,tp" -> {"dp", "cp", "tp"} (spaces around items dropped). ConfigError for an empty item.
std::vector<std::string> parse_name_list(std::string_view text, std::string_view option);
// The text split at `sep`, items kept as they are (empty ones too).
std::vector<std::string> split(std::string_view text, char sep);

// The product of `sizes`; ConfigError naming `option` when it exceeds `limit`.
int64_t checked_product(const std::vector<int64_t>& sizes, int64_t limit, std::string_view option);

// Prints `doc` to stdout as indented JSON.
void print_json(const nlohmann::json& doc);

// The most ranks a simulated world of the tool may have (a mesh is drawn and listed in full).
inline constexpr int64_t kMaxWorldSize = 4096;

}  // namespace spmd::cli
