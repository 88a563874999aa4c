// tests/debug/debug_probe.cpp: a launch() program with planted bugs for the process-level tests of
// the check modes, the fingerprint exchange and the flight recorder.
//
// It runs a few DTensor ops and collectives over a (2, world/2) mesh ("dp", "tp") and, with
// --probe-bug=B, plants one bug:
//   uneven     a user op that assumes even shards (wrong on 5 rows over tp)   check
//   replica    rank 1's copy of a replicated DTensor is changed                replicate
//   nan        rank 2's block of a sharded tensor holds a negative value, then log   nan
//   shape      rank 1's all_reduce over tp has another shape                   fingerprint
//   kind       rank 1 calls all_gather where the others call all_reduce        fingerprint
//   throw      rank 2 throws after the DTensor ops while the others wait in a barrier
// --probe-rows=N sets the rows of the first all_reduce's input (default 2).
#include <string>
#include <string_view>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

// x + (global row index), written for even shards: the row offset of a piece is taken as
// coordinate * local rows, which is wrong when the last pieces are short.
const OpDef kAddRowIndex{
    "add_row_index",
    [](std::span<const InputMeta> in, const OpArgs&) {
      return OpMeta{*in[0].shape, in[0].dtype};
    },
    [](std::span<const Tensor> in, const OpArgs&, const OpMeta&) {
      const int64_t rows = in[0].size(0);
      return in[0] + arange(rows).reshape({rows, 1});
    },
    [](ShardingInputs in, const OpArgs&, const OpMeta&) {
      return std::vector<OpStrategy>{{{in[0]->placements()}, in[0]->placements()}};
    },
    [](std::span<const Tensor> pieces, const OpArgs&, const PieceContext& where) {
      const int64_t rows = pieces[0].size(0);
      const int64_t first = where.coordinate[0] * rows;
      return pieces[0] + (arange(rows) + static_cast<double>(first)).reshape({rows, 1});
    }};

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) -> int {
    std::string bug;
    int64_t rows = 2;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.starts_with("--probe-bug=")) bug = std::string(arg.substr(12));
      if (arg.starts_with("--probe-rows=")) rows = std::stoll(std::string(arg.substr(13)));
    }
    const int64_t tp = world.size() / 2;
    DeviceMesh mesh = init_device_mesh(world, {2, tp}, {"dp", "tp"});
    DeviceMesh tp_mesh = mesh["tp"];

    // Collectives every run issues (the trace the diff tests compare).
    LocalTensor x = LocalTensor::from_fn(world, [&](int r) {
      return full({bug == "shape" && r == 1 ? rows + 1 : rows, 2}, r);
    });
    LocalTensor y = bug == "kind" && world.holds(1) && !world.holds(0) ? all_gather(x, mesh, "tp")
                                                                       : all_reduce(x, mesh, "tp");
    LocalTensor z = all_gather(y, mesh, "dp", 0);

    // DTensor ops: 5 rows over tp is uneven for tp = 4.
    DTensor a = distribute_tensor((arange(10) + 1.0).reshape({5, 2}), tp_mesh, {Shard{0}});
    if (bug == "nan") {
      Tensor values = (arange(10) + 1.0).reshape({5, 2});
      values.narrow(0, 4, 1).fill_(-1.0);  // row 4: the block of tp coordinate 2 when tp = 4
      a = distribute_tensor(values, tp_mesh, {Shard{0}});
    }
    DTensor b = log(a);
    DTensor r = distribute_tensor(ones({2, 2}), mesh, {Replicate{}, Replicate{}});
    if (bug == "replica" && world.holds(1)) {
      LocalTensor pieces = r.to_local();
      pieces.mutable_shard(1).fill_(2.0);
      r = DTensor(pieces, r.spec_ptr());
    }
    DTensor s = r * 3.0;
    DTensor c = bug == "uneven" ? dispatch(kAddRowIndex, {a}) : a + 1.0;
    Tensor total = sum(c).full_tensor();
    if (bug == "throw") {
      if (world.holds(2)) throw_error<CommError>("probe: rank 2 fails on purpose");
      barrier(mesh);
    }
    if (world.is_coordinator()) {
      fmt::print("probe: total {} on {} ranks\n", total.item<double>(), world.size());
    }
    // No print_digest: under a real backend it gathers the digests with a collective of its own,
    // which the simulator's trace lacks.
    (void)z;
    (void)s;
    (void)b;
    return 0;
  });
}
