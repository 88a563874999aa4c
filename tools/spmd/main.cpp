// tools/spmd/main.cpp: `spmd`, the command-line tool of spmdsim.
//
//   spmd mesh --shape 2,2,2 --names dp,cp,tp --slice dp,tp       a mesh, its grid and groups
//   spmd layout coalesce '(3,2):(2,1)'                             the layout algebra
//   spmd redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)'
//   spmd trace summary trace.json                                  a --spmd-trace file
//   spmd parity run_dump ref_dump                 where --spmd-dump-values of two runs depart
//   spmd checkpoint inspect ckpt/step100          what a checkpoint holds
//   spmd version
//
// Every subcommand takes --help, and --json for machine-readable output on stdout. Exit codes are
// in tools/spmd/cli.h.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <spmd/core/error.h>
#include "tools/spmd/cli.h"

namespace {

// CLI11 reports a misspelt subcommand only as "A subcommand is required"; this finds it: the first
// word that is not an option where `app` (or the subcommand given) expects a subcommand.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  const CLI::App* current = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("-")) continue;
    const std::vector<const CLI::App*> subs =
        current->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return {};
    std::string known;
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : subs) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      if (sub->get_name() == arg) next = sub;
    }
    if (next == nullptr) {
      const std::string where =
          current == &app ? std::string("spmd") : "spmd " + current->get_name();
      return fmt::format("{}: unknown subcommand '{}' (expected one of {})", where, arg, known);
    }
    current = next;
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace spmd::cli;
  CLI::App app("spmd: meshes, layouts, redistribution plans and traces of spmdsim", "spmd");
  app.require_subcommand(1);
  std::vector<Command> commands;
  try {
    commands = {add_mesh_command(app),   add_layout_command(app), add_redistribute_command(app),
                add_trace_command(app),  add_parity_command(app), add_checkpoint_command(app),
                add_version_command(app)};
    if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
      fmt::print(stderr, "{}\nRun with --help for more information.\n", unknown);
      return 2;
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    const std::string name = command.app->get_name();
    try {
      return command.run();
    } catch (const spmd::Error& e) {
      fmt::print(stderr, "spmd {}: error: {}\n", name, e.what());
    } catch (const std::exception& e) {
      fmt::print(stderr, "spmd {}: unexpected error: {}\n", name, e.what());
    }
    return 2;
  }
  fmt::print(stderr, "spmd: no subcommand given\n{}", app.help());
  return 2;
}
