// examples/expert_parallel_mesh.cpp: one world, several meshes for the parts of a mixture-of-
// experts model, made with unflatten; which of their groups coincide, and that coinciding groups
// share one communicator. Then a token dispatch with all_to_all_single over the expert dim.
//
//   ./expert_parallel_mesh                                   # sim: 8 ranks
//   mpirun -n 8 ./expert_parallel_mesh --spmd-backend=mpi    # the same digest
//
// Dense layers use (dp, cp, tp), the expert layers (dp, ep, ep_tp): two views of one 1-D world
// mesh, as in PyTorch's test_unflatten_mesh_3d_with_pg_cache. With equal sizes ep is cp and ep_tp
// is tp: the same groups, so the mesh universe's communicator cache (keyed by the dim's layout)
// hands back the communicator it already made. A third view, (ep=4, ep_tp=2) with ep across dp
// and cp, has new ep groups and gets one new communicator.
//
// The dispatch: every rank routes each of its tokens to one of 2 experts per ep rank, sends them
// to the ranks holding their experts (all_to_all_single with per-rank split sizes, after an
// all_to_all of the counts so receivers know theirs), each expert transforms its tokens, and a
// second all_to_all_single brings them home. Checked token by token against the expert applied
// in place.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

constexpr int64_t kTokens = 6;  // per rank
constexpr int64_t kDim = 4;     // features per token
constexpr int64_t kExpertsPerRank = 2;

std::string groups_str(const std::vector<std::vector<int>>& groups) {
  std::string out;
  for (const std::vector<int>& g : groups) out += (out.empty() ? "" : " ") + ranks_str(g);
  return out;
}

// The router: a fixed function of (rank, token), so every backend routes alike.
int64_t expert_of(int rank, int64_t token, int64_t num_experts) {
  return (3 * rank + 5 * token + token * token) % num_experts;
}

// Expert e's transform: x (e + 1) + e, exact on the small integers used here. T is Tensor or
// LocalTensor.
template <class T>
T apply_expert(const T& x, const T& expert) {
  return x * (expert + 1.0) + expert;
}

// Rank r's tokens: small integers, then the expert id as one more column.
Tensor tokens_of(int rank, int64_t num_experts) {
  std::vector<float> values;
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t d = 0; d < kDim; ++d) values.push_back(static_cast<float>(rank * 10 + t + d));
    values.push_back(static_cast<float>(expert_of(rank, t, num_experts)));
  }
  return from_vector(values, {kTokens, kDim + 1});
}

int expert_parallel_mesh(World& world) {
  const int n = world.size();
  if (n % 4 != 0) {
    throw_error<ConfigError>("expert_parallel_mesh needs a world size divisible by 4, got {}", n);
  }
  const DeviceMesh world_mesh = init_device_mesh(world, {n}, {"world"});
  const DeviceMesh dense = world_mesh.unflatten("world", {2, 2, n / 4}, {"dp", "cp", "tp"});
  const DeviceMesh moe = world_mesh.unflatten("world", {2, 2, n / 4}, {"dp", "ep", "ep_tp"});
  const DeviceMesh moe_wide = world_mesh.unflatten("world", {n / 2, 2}, {"ep", "ep_tp"});

  // Communicators are made on first use and cached per universe by the dim's layout. (Every
  // process makes the same ones in the same order: under a real backend making one is
  // collective.)
  const CommCache& cache = world_mesh.comm_cache();
  std::vector<std::shared_ptr<Communicator>> dense_comms;
  for (const char* dim : {"dp", "cp", "tp"}) dense_comms.push_back(communicator(dense, dim));
  const std::size_t after_dense = cache.size();
  std::vector<std::shared_ptr<Communicator>> moe_comms;
  for (const char* dim : {"dp", "ep", "ep_tp"}) moe_comms.push_back(communicator(moe, dim));
  const std::size_t after_moe = cache.size();
  const std::shared_ptr<Communicator> wide_ep = communicator(moe_wide, "ep");
  const std::shared_ptr<Communicator> wide_ep_tp = communicator(moe_wide, "ep_tp");
  const std::size_t after_wide = cache.size();

  if (world.is_coordinator()) {
    fmt::print("expert_parallel_mesh: {} ranks, backend {}\n\n", n, world.backend_name());
    fmt::print("world mesh {}\n", world_mesh);
    fmt::print("dense    = unflatten(world, (2, 2, {})) = {}\n", n / 4, dense);
    fmt::print("moe      = unflatten(world, (2, 2, {})) = {}\n", n / 4, moe);
    fmt::print("moe_wide = unflatten(world, ({}, 2))    = {}\n\n", n / 2, moe_wide);
    fmt::print("{:<15} {:<28} {}\n", "dim", "groups", "communicator");
    const char* dense_dims[] = {"dp", "cp", "tp"};
    for (int d = 0; d < 3; ++d) {
      fmt::print("{:<15} {:<28} new\n", fmt::format("dense {}", dense_dims[d]),
                 groups_str(dense.groups(d)));
    }
    const char* moe_dims[] = {"dp", "ep", "ep_tp"};
    for (int d = 0; d < 3; ++d) {
      const bool same_groups = moe.groups(d) == dense.groups(d);
      fmt::print("{:<15} {:<28} {}\n", fmt::format("moe {}", moe_dims[d]),
                 same_groups ? fmt::format("= dense {}", dense_dims[d]) : groups_str(moe.groups(d)),
                 moe_comms[d] == dense_comms[d] ? fmt::format("reused (dense {})", dense_dims[d])
                                                : std::string("new"));
    }
    fmt::print("{:<15} {:<28} {}\n", "moe_wide ep", groups_str(moe_wide.groups("ep")),
               std::find(dense_comms.begin(), dense_comms.end(), wide_ep) == dense_comms.end()
                   ? "new"
                   : "reused");
    fmt::print("{:<15} {:<28} {}\n", "moe_wide ep_tp",
               moe_wide.groups("ep_tp") == dense.groups("tp")
                   ? "= dense tp"
                   : groups_str(moe_wide.groups("ep_tp")),
               wide_ep_tp == dense_comms[2] ? "reused (dense tp)" : "new");
    fmt::print("communicators in the cache: {} after dense, {} after moe, {} after moe_wide\n\n",
               after_dense, after_moe, after_wide);
  }

  // ---- token dispatch over moe_wide's ep dim ------------------------------------------------
  const int64_t ep = moe_wide.size("ep");
  const int64_t num_experts = ep * kExpertsPerRank;
  const PerRank<int64_t> ep_rank = moe_wide.local_rank("ep");
  const std::vector<int>& held = world.held_ranks();

  // Each rank's tokens sorted by the ep rank that holds their expert, and the counts per
  // destination. Rank-specific values, so they are computed per held rank (from_fn, PerRank).
  auto destination = [&](int rank, int64_t t) {
    return expert_of(rank, t, num_experts) / kExpertsPerRank;
  };
  auto order_of = [&](int rank) {
    std::vector<int64_t> order(kTokens);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return destination(rank, a) < destination(rank, b);
    });
    return order;
  };
  auto rows = [](const Tensor& t, const std::vector<int64_t>& order) {
    std::vector<Tensor> picked;
    for (int64_t i : order) picked.push_back(t.narrow(0, i, 1));
    return cat(picked, 0);
  };
  const LocalTensor tokens =
      LocalTensor::from_fn(world, [&](int r) { return tokens_of(r, num_experts); });
  const LocalTensor sorted =
      tokens.map([&](int r, const Tensor& t) { return rows(t, order_of(r)); });
  const PerRank<std::vector<int64_t>> send_counts =
      PerRank<std::vector<int64_t>>::from_fn(held, [&](int r) {
        std::vector<int64_t> counts(static_cast<std::size_t>(ep), 0);
        for (int64_t t = 0; t < kTokens; ++t) ++counts[static_cast<std::size_t>(destination(r, t))];
        return counts;
      });

  // Receivers learn their counts first: one count to each ep rank.
  // The counts decide shapes, so they are values even in a dry run (--spmd-tensors=meta).
  const MetaTensorsScope counts_have_values(false);
  const LocalTensor counts =
      LocalTensor::from_fn(world, [&](int r) { return from_vector(send_counts.at(r), {ep}); });
  const LocalTensor recv_counts_t = all_to_all(counts, moe_wide, "ep");
  const PerRank<std::vector<int64_t>> recv_counts = PerRank<std::vector<int64_t>>::from_fn(
      held, [&](int r) { return recv_counts_t.shard(r).to_vector<int64_t>(); });

  const LocalTensor dispatched =
      all_to_all_single(sorted, moe_wide, "ep", recv_counts, send_counts);
  const LocalTensor features = dispatched.narrow(1, 0, kDim);
  const LocalTensor expert_ids = dispatched.narrow(1, kDim, 1);
  const LocalTensor processed = cat({apply_expert(features, expert_ids), expert_ids}, 1);
  const LocalTensor returned =
      all_to_all_single(processed, moe_wide, "ep", send_counts, recv_counts);
  const std::string collectives = trace().summary_table();
  const LocalTensor combined = returned.map([&](int r, const Tensor& t) {
    const std::vector<int64_t> order = order_of(r);
    std::vector<int64_t> inverse(order.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      inverse[static_cast<std::size_t>(order[i])] = static_cast<int64_t>(i);
    return rows(t, inverse);
  });

  // Check each rank's tokens against its experts applied in place; the largest error over the
  // world, so every process knows the verdict.
  const bool dry_run = tokens.shard(held.front()).is_meta();
  const LocalTensor error = combined.map([&](int r, const Tensor& t) {
    if (dry_run) return scalar_tensor(0.0);
    const Tensor x = tokens.shard(r);
    const Tensor expected = apply_expert(x.narrow(1, 0, kDim), x.narrow(1, kDim, 1));
    return scalar_tensor(max_abs_diff(t.narrow(1, 0, kDim), expected));
  });
  const double worst =
      all_reduce(error, world_mesh, "world", ReduceOp::Max).shard(held.front()).item<double>();
  const bool pass = worst == 0.0;
  if (dry_run && world.is_coordinator()) {
    fmt::print("(--spmd-tensors=meta: a dry run routes the same tokens; it has no values)\n");
  }

  if (world.is_coordinator()) {
    const int r = held.front();
    fmt::print(
        "token dispatch over moe_wide ep ({} ranks, {} experts each): rank {} (ep rank {})\n", ep,
        kExpertsPerRank, r, ep_rank.at(r));
    for (int64_t t = 0; t < kTokens; ++t) {
      fmt::print("  token {}  expert {}  -> ep rank {}\n", t, expert_of(r, t, num_experts),
                 destination(r, t));
    }
    fmt::print("  sends {} tokens per ep rank, receives {}\n", shape_str(send_counts.at(r)),
               shape_str(recv_counts.at(r)));
    fmt::print("\ncollectives:\n{}\n", collectives);
    fmt::print("check: {} (every token came back transformed by its expert; max error {})\n",
               pass ? "PASS" : "FAIL", worst);
  }
  print_digest(world, {dispatched, combined});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, expert_parallel_mesh);
}
