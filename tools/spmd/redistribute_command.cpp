// tools/spmd/redistribute_command.cpp: `spmd redistribute`, the plan that turns one placement of
// a tensor into another, run in sim and verified against the global tensor.
//
//   spmd redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)'
//                     [--dtype f32] [--planner greedy|min-cost] [--topology FILE] [--json]
//
// Prints the plan (one step per mesh dim: from -> to, the collective, its bytes and the cost
// model's estimate on the topology), runs it on a simulated world, and checks the result two ways:
// every rank's piece has the shape and offset the target spec gives it and (unless the target has
// Partial placements, whose pieces are partial values) equals that block of the global tensor; and
// the full tensor gathered back equals the global tensor. The global tensor holds small integers,
// exact in every dtype. The sharding is drawn before and after (visualize_sharding).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/trace.h>
#include <spmd/core/error.h>
#include <spmd/debug/visualize.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/dtensor/spec.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/placement.h>
#include <spmd/tensor/dtype.h>
#include <spmd/world/world.h>
#include "tools/spmd/cli.h"

namespace spmd::cli {
namespace {

struct RedistributeOptions {
  std::string mesh;
  std::string names;
  std::string shape;
  std::string from;
  std::string to;
  std::string dtype = "f32";
  std::string planner = "greedy";
  std::string topology;
  bool json = false;
};

// The largest global tensor the tool builds (every rank's piece is materialized in sim).
constexpr int64_t kMaxElements = int64_t{1} << 24;

RedistributePlanner parse_planner(const std::string& text) {
  if (text == "greedy") return RedistributePlanner::Greedy;
  if (text == "min-cost" || text == "min_cost") return RedistributePlanner::MinCost;
  throw_error<ConfigError>("--planner '{}': expected greedy or min-cost", text);
}

// Element i is (i mod 13) - 6: small integers, exact in every dtype and under every partition.
Tensor global_tensor(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = (i % 13) - 6;
  return from_vector(values, shape).to(dtype);
}

Tensor block_of(const Tensor& global, const Shape& offset, const Shape& size) {
  Tensor t = global;
  for (std::size_t d = 0; d < size.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), offset[d], size[d]);
  }
  return t;
}

// What went wrong, or empty when every piece of `t` is right.
std::string check_pieces(const DTensor& t, const Tensor& global) {
  const DTensorSpec& spec = t.spec();
  const DTensorSpec::RankInfo& info = spec.rank_info();
  const bool partial = spec.has_partial();
  for (std::size_t i = 0; i < info.ranks.size(); ++i) {
    const int rank = info.ranks[i];
    const Tensor& piece = t.local().shard(rank);
    if (piece.shape() != info.local_shapes[i]) {
      return fmt::format("rank {} holds a piece of shape {}, the spec says {}", rank,
                         shape_str(piece.shape()), shape_str(info.local_shapes[i]));
    }
    if (partial) continue;
    const Tensor expected = block_of(global, info.local_offsets[i], info.local_shapes[i]);
    if (!equal(piece, expected)) {
      return fmt::format("rank {}'s piece at offset {} differs from the global tensor by {}", rank,
                         shape_str(info.local_offsets[i]), max_abs_diff(piece, expected));
    }
  }
  return {};
}

nlohmann::json shards_json(const DTensorSpec& spec) {
  const DTensorSpec::RankInfo& info = spec.rank_info();
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t i = 0; i < info.ranks.size(); ++i) {
    out[std::to_string(info.ranks[i])] = {{"coordinate", info.coordinates[i]},
                                          {"offset", info.local_offsets[i]},
                                          {"shape", info.local_shapes[i]}};
  }
  return out;
}

int run_redistribute(const RedistributeOptions& o) {
  const std::vector<int64_t> mesh_shape = parse_int_list(o.mesh, "--mesh");
  const int64_t world_size = checked_product(mesh_shape, kMaxWorldSize, "--mesh");
  std::vector<std::string> names;
  if (!o.names.empty()) names = parse_name_list(o.names, "--names");
  const Shape shape = parse_int_list(o.shape, "--shape", 0);
  checked_product(shape, kMaxElements, "--shape");
  const std::optional<DType> dtype = parse_dtype(o.dtype);
  if (!dtype) {
    throw_error<ConfigError>("--dtype '{}': expected one of f32, f64, bf16, f16, i32, i64, bool",
                             o.dtype);
  }
  const RedistributePlanner planner = parse_planner(o.planner);
  const Placements from = parse_placements(o.from);
  const Placements to = parse_placements(o.to);

  World world = World::sim(static_cast<int>(world_size));
  if (!o.topology.empty())
    world.set_topology(std::make_shared<Topology>(Topology::load(o.topology)));
  const DeviceMesh mesh = init_device_mesh(world, mesh_shape, names);
  const DTensorSpec from_spec(mesh, from, shape, *dtype);
  const DTensorSpec to_spec = from_spec.with_placements(to);
  const RedistributePlan plan = plan_redistribute(from_spec, to_spec, planner);

  const Tensor global = global_tensor(shape, *dtype);
  const DTensor x = distribute_tensor(global, mesh, from);
  trace().clear();
  const DTensor y = x.redistribute(to, planner);
  const std::vector<TraceEvent> executed = trace().events();

  std::string failure = check_pieces(y, global);
  if (failure.empty()) {
    const Tensor full = y.full_tensor();
    if (!equal(full, global)) {
      failure = fmt::format("full_tensor() differs from the global tensor by {}",
                            max_abs_diff(full, global));
    }
  }
  const bool verified = failure.empty();

  if (o.json) {
    nlohmann::json doc;
    doc["mesh"] = mesh.to_string();
    doc["shape"] = shape;
    doc["dtype"] = dtype_name(*dtype);
    doc["from"] = to_string(from);
    doc["to"] = to_string(to);
    doc["planner"] = planner_name(plan.planner);
    nlohmann::json steps = nlohmann::json::array();
    for (const RedistributeStep& s : plan.steps) {
      steps.push_back({{"mesh_dim", s.mesh_dim},
                       {"mesh_dim_name", mesh.dim_name(s.mesh_dim)},
                       {"from", to_string(s.from)},
                       {"to", to_string(s.to)},
                       {"collective", step_kind_name(s.kind)},
                       {"bytes", s.bytes},
                       {"est_us", s.cost_us}});
    }
    doc["plan"] = steps;
    doc["est_us"] = plan.cost_us;
    nlohmann::json ran = nlohmann::json::array();
    for (const TraceEvent& e : executed) {
      ran.push_back({{"collective", collective_name(e.kind)},
                     {"mesh_dim_name", e.dim_name},
                     {"bytes", e.bytes},
                     {"est_us", e.estimate_us}});
    }
    doc["executed"] = ran;
    doc["verified"] = verified;
    if (!verified) doc["failure"] = failure;
    doc["shards"] = {{"source", shards_json(x.spec())}, {"target", shards_json(y.spec())}};
    print_json(doc);
  } else {
    fmt::print("{}\n\n", plan);
    fmt::print("before ({}):\n{}\n\n", to_string(from), visualize_sharding(x));
    fmt::print("after ({}):\n{}\n\n", to_string(to), visualize_sharding(y));
    if (verified) {
      fmt::print(
          "verified: ran in sim on {} ranks; every piece and the full tensor match the "
          "global tensor\n",
          world_size);
    } else {
      fmt::print("NOT verified: {}\n", failure);
    }
  }
  return verified ? 0 : 1;
}

}  // namespace

Command add_redistribute_command(CLI::App& parent) {
  auto o = std::make_shared<RedistributeOptions>();
  CLI::App* app = parent.add_subcommand(
      "redistribute", "Plan a redistribution, run it in sim, verify it and draw the sharding");
  app->footer(
      "Placements: S(d) shard tensor dim d, R replicate, P(sum|avg|product|min|max) partial;\n"
      "one per mesh dim, comma-separated. Example:\n"
      "  spmd redistribute --mesh 2,4 --names dp,tp --shape 7,9 --from 'S(0),R' --to 'R,S(1)'");
  app->add_option("--mesh", o->mesh, "Mesh shape, e.g. 2,4")->required();
  app->add_option("--names", o->names, "Mesh dim names, e.g. dp,tp");
  app->add_option("--shape", o->shape, "Global tensor shape, e.g. 7,9")->required();
  app->add_option("--from", o->from, "Source placements, e.g. S(0),R")->required();
  app->add_option("--to", o->to, "Target placements, e.g. R,S(1)")->required();
  app->add_option("--dtype", o->dtype, "f32 (default), f64, bf16, f16, i32, i64, bool");
  app->add_option("--planner", o->planner, "greedy (default) or min-cost");
  app->add_option("--topology", o->topology,
                  "Topology JSON for the cost model (default: 8 devices per host)");
  app->add_flag("--json", o->json, "Machine-readable output");
  return {app, [o] { return run_redistribute(*o); }};
}

}  // namespace spmd::cli
