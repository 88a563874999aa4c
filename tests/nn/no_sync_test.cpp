// Gradient accumulation without sync (Note [No sync] in spmd/dtensor/dtensor.h): microbatches'
// gradients accumulated under no_sync, then one backward with sync, equal the sum of the
// microbatches' gradients on full tensors; the backwards under no_sync issue no collective and the
// synced one issues the reductions of one plain backward (a dp-replicated weight's all_reduce, an
// FSDP weight's reduce_scatter), not one per microbatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <spmd/collectives/trace.h>
#include <spmd/dtensor/ops.h>
#include <spmd/nn/parallel.h>
#include <spmd/tensor/random.h>
#include "tests/support/collectives_since.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using test_support::collectives_since;
using testing::expect_throws;

// Where a test's collectives start in the trace (cleared first except under threads, where every
// rank shares it and records land in no rank's order: the counts are checked under sim and mpi).
size_t trace_start(const World& world) {
  if (world.backend_name() != "threads") trace().clear();
  return trace().records().size();
}

bool counts_collectives(const World& world) {
  return world.backend_name() != "threads";
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// A column-wise weight (R over dp, S(1) over tp), its bias (Replicate) and an FSDP row-wise weight
// (S(1) over dp, S(0) over tp), on a (dp=2, tp) mesh; the loss of microbatch m is
// sum(gelu(x_m w + b) fsdp_unshard(w2)) with x_m [4, 6] split over dp: its backward's only
// collectives are the gradients' reductions.
struct Model {
  int64_t tp = 1;
  Tensor w, b, w2;  // the global values

  explicit Model(int64_t tp_size)
      : tp(tp_size),
        w(randn({6, 2 * tp_size}, 11, DType::F64)),
        b(randn({2 * tp_size}, 12, DType::F64)),
        w2(randn({2 * tp_size, 3}, 13, DType::F64)) {}

  static Tensor input(int m) { return randn({4, 6}, 100 + static_cast<uint64_t>(m), DType::F64); }

  struct Params {
    DTensor w, b, w2;
    std::vector<DTensor*> all() { return {&w, &b, &w2}; }
  };
  Params place(const DeviceMesh& mesh) const {
    Params p{
        distribute_tensor(w, mesh, colwise_placements(mesh, "tp")),
        distribute_tensor(b, mesh, replicate_placements(mesh)),
        distribute_tensor(w2, mesh,
                          fsdp_placements(rowwise_placements(mesh, "tp"), w2.shape(), mesh, "dp"))};
    for (DTensor* t : p.all()) t->requires_grad_();
    return p;
  }
  static DTensor loss(const DeviceMesh& mesh, const Params& p, int m) {
    const DTensor x = distribute_tensor(input(m), mesh, {Shard{0}, Replicate{}});
    return sum(matmul(gelu(matmul(x, p.w) + p.b), fsdp_unshard(p.w2, "dp")));
  }
  // The sum over microbatches 0..n-1 of the gradients, on full tensors.
  std::vector<Tensor> reference(int n) const {
    Tensor fw = w.clone().requires_grad_(), fb = b.clone().requires_grad_();
    Tensor fw2 = w2.clone().requires_grad_();
    for (int m = 0; m < n; ++m) {
      backward(sum(matmul(gelu(matmul(input(m), fw) + fb), fw2)));
    }
    return {fw.grad(), fb.grad(), fw2.grad()};
  }
};

const char* const kNames[] = {"w", "b", "w2"};

// N - 1 microbatches under no_sync and one with sync: the gradients of the summed losses, with the
// parameters' placements; no reduction in the no_sync backwards (only the FSDP weight's gather
// again, for the matmul that saved it: Note [Regathered parameters]), and the synced one issues
// what a plain backward of one microbatch issues.
SPMD_TEST(NoSync, AccumulatesPendingSumsAndReducesOncePerParameter) {
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
  const Model model(mesh.size("tp"));
  const int rank = world.held_ranks()[0];

  // One plain backward: the reductions every microbatch would issue without no_sync.
  Model::Params plain = model.place(mesh);
  const DTensor plain_loss = Model::loss(mesh, plain, 0);
  size_t start = trace_start(world);
  backward(plain_loss);
  const std::vector<std::string> one_backward = collectives_since(start, rank);

  for (const int n : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("{} microbatches", n));
    Model::Params p = model.place(mesh);
    for (int m = 0; m < n - 1; ++m) {
      const DTensor loss = Model::loss(mesh, p, m);
      const auto guard = no_sync();
      EXPECT_FALSE(requires_gradient_sync());
      start = trace_start(world);
      backward(loss);
      if (counts_collectives(world)) {
        EXPECT_EQ(collectives_since(start, rank), std::vector<std::string>{"all_gather dp"})
            << "microbatch " << m;
      }
      for (DTensor* t : p.all()) {
        EXPECT_TRUE(t->pending_grad().defined());
        EXPECT_FALSE(t->autograd() == nullptr);
      }
    }
    EXPECT_TRUE(requires_gradient_sync());
    if (n > 1) {
      // Pending: P(sum) over dp where each rank summed its own rows.
      EXPECT_EQ(p.w.pending_grad().placements(), (Placements{Partial{}, Shard{1}}));
      EXPECT_EQ(p.w2.pending_grad().placements(), (Placements{Partial{}, Shard{0}}));
    }
    const DTensor last = Model::loss(mesh, p, n - 1);
    start = trace_start(world);
    backward(last);
    if (counts_collectives(world)) {
      EXPECT_EQ(sorted(collectives_since(start, rank)), sorted(one_backward));
    }
    const std::vector<Tensor> want = model.reference(n);
    std::vector<DTensor*> params = p.all();
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(kNames[i]);
      EXPECT_FALSE(params[i]->pending_grad().defined());
      const DTensor g = params[i]->grad();
      EXPECT_EQ(g.placements(), params[i]->placements());
      EXPECT_TRUE(allclose(g.full_tensor(), want[i], 1e-10, 1e-10));
    }
  }
  // What one backward reduces: the weight's all_reduce over dp, the bias's over dp and its gather
  // over tp, the FSDP weight's reduce_scatter over dp (so the comparison above is not vacuous),
  // beside the FSDP weight's gather again.
  if (counts_collectives(world)) {
    EXPECT_EQ(sorted(one_backward), sorted({"all_reduce dp", "all_reduce dp", "all_gather tp",
                                            "reduce_scatter dp", "all_gather dp"}));
  }
}

// set_requires_gradient_sync is the same switch; grad() outside a guard reduces a pending sum on
// read (once) and keeps it reduced; zero_grad drops pending sums.
SPMD_TEST(NoSync, SetRequiresGradientSyncAndReadingAPendingSum) {
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
  const Model model(mesh.size("tp"));
  const int rank = world.held_ranks()[0];
  Model::Params p = model.place(mesh);
  set_requires_gradient_sync(false);
  backward(Model::loss(mesh, p, 0));
  backward(Model::loss(mesh, p, 1));
  set_requires_gradient_sync(true);
  ASSERT_TRUE(p.w.pending_grad().defined());
  const std::vector<Tensor> want = model.reference(2);
  size_t start = trace_start(world);
  const DTensor g = p.w.grad();
  EXPECT_FALSE(p.w.pending_grad().defined());
  EXPECT_EQ(g.placements(), p.w.placements());
  EXPECT_TRUE(allclose(g.full_tensor(), want[0], 1e-10, 1e-10));
  start = trace_start(world);
  EXPECT_TRUE(allclose(p.w.grad().local().shard(rank), g.local().shard(rank), 0.0, 0.0));
  if (counts_collectives(world)) {
    EXPECT_EQ(collectives_since(start, rank), std::vector<std::string>{});  // reduced once
  }
  // A third microbatch after the read: the reduced sum plus its own gradient.
  backward(Model::loss(mesh, p, 2));
  EXPECT_TRUE(allclose(p.w.grad().full_tensor(), model.reference(3)[0], 1e-10, 1e-10));

  {
    const auto guard = no_sync();
    backward(Model::loss(mesh, p, 0));
  }
  EXPECT_TRUE(p.b.pending_grad().defined());
  std::vector<DTensor*> params = p.all();
  zero_grad(params);
  for (DTensor* t : params) {
    EXPECT_FALSE(t->pending_grad().defined());
    EXPECT_FALSE(t->grad().defined());
  }
}

// Reading a gradient inside no_sync while a sum is pending is an error naming the op (it would run
// the reduction no_sync defers); nested guards restore the previous setting.
SPMD_TEST(NoSync, ReadingAPendingGradientInsideNoSyncIsAnError) {
  const DeviceMesh mesh = init_device_mesh(world, {2, world.size() / 2}, {"dp", "tp"});
  const Model model(mesh.size("tp"));
  Model::Params p = model.place(mesh);
  {
    const auto outer = no_sync();
    {
      const auto inner = no_sync();
      EXPECT_FALSE(requires_gradient_sync());
    }
    EXPECT_FALSE(requires_gradient_sync());
    backward(Model::loss(mesh, p, 0));
    expect_throws<Error>([&] { (void)p.w.grad(); },
                         {"DTensor::grad", "pending", "no_sync", "P(sum),S(1)"});
  }
  EXPECT_TRUE(requires_gradient_sync());
  EXPECT_TRUE(allclose(p.w.grad().full_tensor(), model.reference(1)[0], 1e-10, 1e-10));
}

}  // namespace
}  // namespace spmd
