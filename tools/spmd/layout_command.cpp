// tools/spmd/layout_command.cpp: `spmd layout`, the layout algebra of mesh/layout.h on the command
// line, in layout notation.
//
//   spmd layout coalesce '(3,2):(2,1)'            6:1
//   spmd layout complement '(2,2):(4,1)' 8        2:2
//   spmd layout compose '4:2' '(2,2):(2,1)'       (2,2):(4,2)
//
// Text output is the result alone (so it composes in shell scripts); --json adds the inputs, the
// result's size and cosize, and its offsets when there are few.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/error.h>
#include <spmd/mesh/layout.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct LayoutOptions {
  std::string a;      // the layout (compose: A)
  std::string b;      // compose: B
  std::string world;  // complement's world size
  bool json = false;
};

// The largest layout whose offsets --json lists.
constexpr int64_t kMaxListedOffsets = 4096;

Layout parse_layout(const std::string& text, const char* what) {
  try {
    return Layout::parse(text);
  } catch (const MeshError& e) {
    throw_error<ConfigError>("{} '{}' is not a layout such as (2,4):(4,1): {}", what, text,
                             e.what());
  }
}

int print_result(const std::string& op, const std::vector<std::string>& inputs,
                 const Layout& result, bool json) {
  if (!json) {
    fmt::print("{}\n", result);
    return 0;
  }
  nlohmann::json doc;
  doc["op"] = op;
  doc["inputs"] = inputs;
  doc["result"] = result.to_string();
  doc["size"] = size(result);
  doc["cosize"] = cosize(result);
  if (size(result) <= kMaxListedOffsets) doc["offsets"] = codomain(result);
  print_json(doc);
  return 0;
}

}  // namespace

Command add_layout_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "layout", "The layout algebra: coalesce, complement, compose (layouts as (2,4):(4,1))");
  app->require_subcommand(1);
  app->footer(
      "Layouts map coordinates to offsets, the right-most mode fastest (PyTorch's convention):\n"
      "(2,4):(4,1) sends (i,j) to 4i + j. Quote them in the shell.");

  auto coalesce_opts = std::make_shared<LayoutOptions>();
  CLI::App* coalesce_app = app->add_subcommand(
      "coalesce", "The same function with as few modes as possible: (3,2):(2,1) -> 6:1");
  coalesce_app->add_option("layout", coalesce_opts->a, "The layout")->required();
  coalesce_app->add_flag("--json", coalesce_opts->json, "Machine-readable output");

  auto complement_opts = std::make_shared<LayoutOptions>();
  CLI::App* complement_app = app->add_subcommand(
      "complement", "The offsets that tile a world of N with the layout: (2,2):(4,1) 8 -> 2:2");
  complement_app->add_option("layout", complement_opts->a, "The layout")->required();
  complement_app->add_option("world", complement_opts->world, "World size N")->required();
  complement_app->add_flag("--json", complement_opts->json, "Machine-readable output");

  auto compose_opts = std::make_shared<LayoutOptions>();
  CLI::App* compose_app = app->add_subcommand(
      "compose", "A o B, the layout R with R(c) = A(B(c)): 4:2 (2,2):(2,1) -> (2,2):(4,2)");
  compose_app->add_option("A", compose_opts->a, "The outer layout")->required();
  compose_app->add_option("B", compose_opts->b, "The inner layout")->required();
  compose_app->add_flag("--json", compose_opts->json, "Machine-readable output");

  return {app, [coalesce_app, complement_app, coalesce_opts, complement_opts, compose_opts] {
            if (coalesce_app->parsed()) {
              const Layout a = parse_layout(coalesce_opts->a, "layout");
              return print_result("coalesce", {coalesce_opts->a}, coalesce(a), coalesce_opts->json);
            }
            if (complement_app->parsed()) {
              const Layout a = parse_layout(complement_opts->a, "layout");
              const std::vector<int64_t> world =
                  parse_int_list(complement_opts->world, "complement: the world size");
              if (world.size() != 1 || world[0] < 1) {
                throw_error<ConfigError>(
                    "complement: the world size must be one integer of at least 1, not '{}'",
                    complement_opts->world);
              }
              return print_result("complement", {complement_opts->a, complement_opts->world},
                                  complement(a, world[0]), complement_opts->json);
            }
            const Layout a = parse_layout(compose_opts->a, "A");
            const Layout b = parse_layout(compose_opts->b, "B");
            return print_result("compose", {compose_opts->a, compose_opts->b}, composition(a, b),
                                compose_opts->json);
          }};
}

}  // namespace spmd::cli
