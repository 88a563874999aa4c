// tools/spmd/parity_command.cpp: `spmd parity`, two value dumps (--spmd-dump-values; Note [Value
// dumps] in debug/value_dump.h) held against each other: where a run departs from a reference run
// of the same program (a cluster run against one GPU, threads against sim on one rank).
//
//   spmd parity RUN REFERENCE [--tol X] [--json]   the first call site whose values differ, with
//                                                  the last that agreed; exit 1 if one does
#include <memory>
#include <string>

#include <fmt/format.h>

#include <spmd/debug/value_dump.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct ParityOptions {
  std::string run;
  std::string reference;
  double tol = 0.0;
  bool json = false;
};

}  // namespace

Command add_parity_command(CLI::App& parent) {
  auto o = std::make_shared<ParityOptions>();
  CLI::App* app = parent.add_subcommand(
      "parity", "Where a run's values (--spmd-dump-values) depart from a reference run's");
  app->add_option("run", o->run, "The dump folder of the run under test")->required();
  app->add_option("reference", o->reference, "The dump folder of the reference run")->required();
  app->add_option("--tol", o->tol,
                  "Largest relative difference accepted, for every float dtype (default: 1e-9 "
                  "f64, 1e-4 f32, 3e-2 bf16/f16)")
      ->check(CLI::PositiveNumber);
  app->add_flag("--json", o->json, "Machine-readable output");
  return {app, [o] {
            const std::vector<DumpedValue> run = read_value_dump(o->run);
            const std::vector<DumpedValue> reference = read_value_dump(o->reference);
            const DumpComparison c = compare_value_dumps(run, reference, o->tol);
            if (o->json) {
              print_json({{"compared", c.compared},
                          {"other_shape", c.other_shape},
                          {"only_one", c.only_one},
                          {"departure", c.departure}});
            } else if (c.departure.empty()) {
              fmt::print(
                  "parity: {} values agree; not compared: {} of another shape, {} in one dump "
                  "only\n",
                  c.compared, c.other_shape, c.only_one);
            } else {
              fmt::print("ParityError: {}\n", c.departure);
            }
            return c.departure.empty() ? 0 : 1;
          }};
}

}  // namespace spmd::cli
