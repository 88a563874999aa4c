// tools/spmd/mesh_command.cpp: `spmd mesh`, a DeviceMesh built from the command line and shown as
// a grid, its layout, and the groups of every dim.
//
//   spmd mesh --shape 2,2,2 --names dp,cp,tp [--ranks 7,6,5,4,3,2,1,0]
//             [--slice dp,tp] [--flatten NAME | --flatten=] [--unflatten DIM:SIZES:NAMES] ...
//             [--json]
//
// --slice, --flatten and --unflatten may repeat and apply in the order given, each to the mesh the
// previous one produced. --flatten without a name (`--flatten=`, or `--flatten` before another
// option) names the flattened dim as DeviceMesh::flatten("") does: the names joined with '_'. The
// world is simulated (every rank in this process) with as many ranks as the mesh needs.
#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/error.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/tensor/shape.h>
#include <spmd/world/world.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct MeshOptions {
  std::string shape;
  std::string names;
  std::string ranks;
  std::vector<std::string> slices;
  std::vector<std::string> flattens;
  std::vector<std::string> unflattens;
  bool json = false;
};

// "tp" or "1" (an index, negative counting from the end).
MeshDim parse_mesh_dim(const std::string& text) {
  int index = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), index);
  if (!text.empty() && ec == std::errc() && end == text.data() + text.size()) return index;
  return text;
}

// --unflatten DIM:SIZES[:NAMES], e.g. "tp:2,2:tp0,tp1" or "0:2,4".
DeviceMesh apply_unflatten(const DeviceMesh& mesh, const std::string& spec) {
  const std::vector<std::string> parts = split(spec, ':');
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty()) {
    throw_error<ConfigError>(
        "--unflatten '{}': expected DIM:SIZES:NAMES, e.g. tp:2,2:tp0,tp1 (NAMES only for an "
        "unnamed mesh may be left out)",
        spec);
  }
  const std::string option = fmt::format("--unflatten '{}': sizes", spec);
  std::vector<int64_t> sizes = parse_int_list(parts[1], option);
  std::vector<std::string> names;
  if (parts.size() == 3) names = parse_name_list(parts[2], fmt::format("--unflatten '{}'", spec));
  return mesh.unflatten(parse_mesh_dim(parts[0]), sizes, std::move(names));
}

// Groups as "[0, 4] [1, 5]".
std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::string out;
  for (const std::vector<int>& g : groups) {
    if (!out.empty()) out += ' ';
    out += shape_str(std::vector<int64_t>(g.begin(), g.end()));
  }
  return out;
}

int run_mesh(const MeshOptions& o, const std::vector<std::string>& operations,
             const std::vector<std::string>& values) {
  const std::vector<int64_t> shape = parse_int_list(o.shape, "--shape");
  const int64_t size = checked_product(shape, kMaxWorldSize, "--shape");
  std::vector<std::string> names;
  if (!o.names.empty()) names = parse_name_list(o.names, "--names");
  if (!names.empty() && names.size() != shape.size()) {
    throw_error<ConfigError>("--names '{}' gives {} names for the {} dims of --shape '{}'", o.names,
                             names.size(), shape.size(), o.shape);
  }
  std::vector<int64_t> ranks;
  int64_t world_size = size;
  if (!o.ranks.empty()) {
    ranks = parse_int_list(o.ranks, "--ranks", 0);
    if (static_cast<int64_t>(ranks.size()) != size) {
      throw_error<ConfigError>("--ranks '{}' lists {} ranks for a mesh of {} (--shape '{}')",
                               o.ranks, ranks.size(), size, o.shape);
    }
    // Compared before adding one: a rank of INT64_MAX must not overflow.
    const int64_t highest = *std::max_element(ranks.begin(), ranks.end());
    if (highest >= kMaxWorldSize) {
      throw_error<ConfigError>("--ranks '{}': rank {} is beyond the {} ranks the tool simulates",
                               o.ranks, highest, kMaxWorldSize);
    }
    world_size = std::max(world_size, highest + 1);
  } else {
    for (int64_t r = 0; r < size; ++r) ranks.push_back(r);
  }

  const World world = World::sim(static_cast<int>(world_size));
  DeviceMesh mesh = DeviceMesh::from_ranks(world, shape, ranks, names);
  std::vector<std::string> applied;
  for (std::size_t i = 0; i < operations.size(); ++i) {
    const std::string& op = operations[i];
    const std::string& value = values[i];
    if (op == "slice") {
      const std::vector<std::string> dims = parse_name_list(value, "--slice");
      std::vector<MeshDim> slice;
      for (const std::string& d : dims) slice.push_back(parse_mesh_dim(d));
      mesh = mesh.slice(slice);
    } else if (op == "flatten") {
      mesh = mesh.flatten(value);
    } else {
      mesh = apply_unflatten(mesh, value);
    }
    applied.push_back(value.empty() ? fmt::format("--{}=", op) : fmt::format("--{} {}", op, value));
  }

  std::vector<std::string> dim_names;
  for (int d = 0; d < mesh.ndim(); ++d) dim_names.push_back(mesh.dim_name(d));
  std::vector<std::vector<std::vector<int>>> groups;
  for (int d = 0; d < mesh.ndim(); ++d) groups.push_back(mesh.groups(d));

  if (o.json) {
    nlohmann::json doc;
    doc["mesh"] = mesh.to_string();
    doc["shape"] = mesh.shape();
    doc["names"] = mesh.dim_names();
    doc["layout"] = mesh.layout().to_string();
    doc["world_size"] = world_size;
    doc["rank_map"] = ranks;
    doc["num_siblings"] = mesh.num_siblings();
    doc["operations"] = applied;
    nlohmann::json by_dim = nlohmann::json::object();
    for (int d = 0; d < mesh.ndim(); ++d) by_dim[dim_names[d]] = groups[d];
    doc["groups"] = by_dim;
    nlohmann::json coordinates = nlohmann::json::object();
    const PerRank<std::vector<int64_t>> coords = mesh.coordinate();
    for (int r : coords.ranks()) coordinates[std::to_string(r)] = coords.at(r);
    doc["coordinates"] = coordinates;
    doc["grid"] = mesh.to_grid();
    print_json(doc);
    return 0;
  }

  fmt::print("world: {} simulated ranks\n", world_size);
  if (!applied.empty()) fmt::print("operations: {}\n", fmt::join(applied, ", "));
  fmt::print("layout: {}", mesh.layout());
  if (mesh.num_siblings() > 1) {
    fmt::print(" ({} sibling meshes; each rank sees the one holding it)", mesh.num_siblings());
  }
  fmt::print("\n\n{}\n", mesh.to_grid());
  fmt::print("groups:\n");
  std::size_t width = 0;
  for (const std::string& n : dim_names) width = std::max(width, n.size());
  for (int d = 0; d < mesh.ndim(); ++d) {
    fmt::print("  {}{}  {}\n", dim_names[d], std::string(width - dim_names[d].size(), ' '),
               groups_text(groups[d]));
  }
  return 0;
}

}  // namespace

Command add_mesh_command(CLI::App& parent) {
  auto options = std::make_shared<MeshOptions>();
  CLI::App* app = parent.add_subcommand(
      "mesh", "Build a device mesh and show its grid, layout and the groups of every dim");
  app->footer(
      "--slice, --flatten and --unflatten may repeat; they apply in the order given.\n"
      "Example: spmd mesh --shape 2,2,2 --names dp,cp,tp --slice dp,cp --flatten dp_cp");
  app->add_option("--shape", options->shape, "Mesh shape, e.g. 2,2,2")->required();
  app->add_option("--names", options->names, "Dim names, e.g. dp,cp,tp");
  app->add_option("--ranks", options->ranks,
                  "The ranks at the mesh's positions, row-major (default 0,1,...)");
  const CLI::Option* slice =
      app->add_option("--slice", options->slices, "Keep these dims (names or indices), e.g. dp,tp")
          ->allow_extra_args(false);
  const CLI::Option* flatten =
      app->add_option("--flatten", options->flattens,
                      "Flatten every dim into one named NAME (--flatten= joins the names with _)")
          // CLI11 reads `--flatten=` as `--flatten` without a value and would take the next
          // argument (or fail at the end): zero or one value per occurrence, every occurrence kept.
          ->expected(0, 1)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->allow_extra_args(false);
  const CLI::Option* unflatten =
      app->add_option("--unflatten", options->unflattens,
                      "Split a dim: DIM:SIZES:NAMES, e.g. tp:2,2:tp0,tp1")
          ->allow_extra_args(false);
  app->add_flag("--json", options->json, "Machine-readable output");
  return {app, [app, options, slice, flatten, unflatten] {
            // CLI11 keeps each option's values in order and the order of all parsed values;
            // together they give the operations in command-line order.
            std::vector<std::string> operations;
            std::vector<std::string> values;
            std::map<const CLI::Option*, std::size_t> next;
            for (const CLI::Option* opt : app->parse_order()) {
              std::string op;
              if (opt == slice) op = "slice";
              if (opt == flatten) op = "flatten";
              if (opt == unflatten) op = "unflatten";
              if (op.empty()) continue;
              operations.push_back(op);
              values.push_back(opt->results().at(next[opt]++));
            }
            return run_mesh(*options, operations, values);
          }};
}

}  // namespace spmd::cli
