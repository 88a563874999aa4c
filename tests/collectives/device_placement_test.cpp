// Note [NCCL device placement] without a GPU: a sim world whose ranks all live on a stand-in
// "cuda:0" (host memory, CPU kernels behind the DeviceOps seam) and whose collectives check that
// every shard they get is on that device. LocalTensor factories, collectives, digests and DTensor
// programs must keep every tensor there and compute what the plain sim world computes; a tensor
// that falls back to the CPU fails with "different devices" or the backend's check.
#include <gtest/gtest.h>

#include <cstdlib>

#include <spmd/spmd.h>

#include <spmd/backends/sim/backend.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {
namespace {

class HostBackedAllocator : public DeviceAllocator {
 public:
  void* allocate(std::size_t nbytes, int) override {
    return std::aligned_alloc(64, (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64);
  }
  void deallocate(void* ptr, std::size_t, int) override { std::free(ptr); }
};

// The CPU kernels, reached through the CUDA slot (the memory is host memory either way).
class ForwardingOps : public DeviceOps {
 public:
  void fill(const Tensor& dst, double value) override { cpu_ops().fill(dst, value); }
  void copy(const Tensor& dst, const Tensor& src) override { cpu_ops().copy(dst, src); }
  void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) override {
    cpu_ops().binary(op, out, a, b);
  }
  void unary(int op, const Tensor& out, const Tensor& in) override { cpu_ops().unary(op, out, in); }
  void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                      const Tensor& result) override {
    cpu_ops().unary_backward(op, out, grad, in, result);
  }
  void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad, const Tensor& a,
                       const Tensor& b) override {
    cpu_ops().binary_backward(op, wrt, out, grad, a, b);
  }
  void reduce(Reduction op, const Tensor& out, const Tensor& in,
              const std::vector<int64_t>& dims) override {
    cpu_ops().reduce(op, out, in, dims);
  }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
              double beta) override {
    cpu_ops().matmul(out, a, b, alpha, beta);
  }
  void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) override {
    cpu_ops().softmax(out, in, d, log);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    cpu_ops().where(out, cond, a, b);
  }
  bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
              int64_t limit) override {
    return cpu_ops().gather(out, in, dim, index, offset, limit);
  }
  bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                   int64_t offset, int64_t limit) override {
    return cpu_ops().scatter_add(out, dim, index, src, offset, limit);
  }
  bool equal(const Tensor& a, const Tensor& b) override { return cpu_ops().equal(a, b); }
  bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) override {
    return cpu_ops().allclose(a, b, rtol, atol);
  }
  double max_abs_diff(const Tensor& a, const Tensor& b) override {
    return cpu_ops().max_abs_diff(a, b);
  }
  bool has_nonfinite(const Tensor& t) override { return cpu_ops().has_nonfinite(t); }
};

const Device kDevice = cuda(0);

// The sim backend for a world on kDevice: inputs must be there; they go to the CPU for the math
// and the results come back, as the nccl backend's results stay on each rank's GPU.
class DeviceBackend final : public Backend {
 public:
  std::string name() const override { return "sim"; }
  bool is_lockstep() const override { return true; }
  Device device_of(int) const override { return kDevice; }

  WorkPtr issue(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                const CallSite& site) override {
    // The barrier token is a CPU tensor nobody reads (collectives/functional.cpp).
    if (std::holds_alternative<BarrierOptions>(options)) return sim_.issue(comm, x, options, site);
    for (const Tensor& shard : x.shards()) {
      if (shard.device() != kDevice && shard.numel() > 0) {
        throw_error<CommError>("{}: a shard on {} reached the device backend", kind_of(options),
                               shard.device());
      }
    }
    WorkPtr work = sim_.issue(comm, x.to(cpu()), options, site);
    work->wait();
    return std::make_shared<CompletedWork>(work->take_result().to(kDevice));
  }

 private:
  SimBackend sim_;
};

class DevicePlacement : public ::testing::Test {
 protected:
  void SetUp() override {
    register_device_allocator(DeviceType::CUDA, &allocator_);
    register_device_ops(DeviceType::CUDA, &ops_);
  }
  void TearDown() override {
    register_device_ops(DeviceType::CUDA, nullptr);
    register_device_allocator(DeviceType::CUDA, nullptr);
  }

  // World::sim(n) with every rank on kDevice and collectives through DeviceBackend.
  static World device_world(int n) {
    auto state = std::make_shared<WorldState>(World::sim(n).state());
    state->devices.assign(static_cast<size_t>(n), kDevice);
    state->backend = std::make_shared<DeviceBackend>();
    return World(std::move(state));
  }

  static void expect_on_device(const LocalTensor& t, const char* what) {
    for (int r : t.ranks()) EXPECT_EQ(t.shard(r).device(), kDevice) << what << " rank " << r;
  }

  HostBackedAllocator allocator_;
  ForwardingOps ops_;
};

// The collectives of examples/collectives_tour, on a (2, n/2) mesh.
std::vector<LocalTensor> tour(const World& world) {
  const int64_t tp = world.size() / 2;
  DeviceMesh mesh = init_device_mesh(world, {2, tp}, {"dp", "tp"});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return (arange(4) + 10.0 * r).reshape({2, 2});
  });
  LocalTensor rows = LocalTensor::from_fn(world, [&](int r) {
    return full({tp, 3}, r % 3) + arange(3);
  });
  std::vector<int> next(static_cast<size_t>(tp), -1);
  for (int64_t i = 0; i + 1 < tp; ++i) next[static_cast<size_t>(i)] = static_cast<int>(i + 1);
  LocalTensor mine = reduce_scatter(rows, mesh, "tp");
  std::vector<LocalTensor> out = {all_reduce(x, mesh, "tp"),
                                  all_gather(x, mesh, "dp", 1),
                                  all_reduce(x, mesh, "dp", ReduceOp::Avg),
                                  mine,
                                  all_gather(mine, mesh, "tp"),
                                  all_to_all(rows, mesh, "tp"),
                                  permute(x, mesh, "tp", next),
                                  broadcast(x, mesh, "tp", 1),
                                  reduce(x, mesh, "dp", ReduceOp::Max, 0),
                                  scatter(rows, mesh, "tp", 0),
                                  gather(x, mesh, "dp", 1),
                                  all_to_all_single(rows, mesh, "tp", {}, {})};
  barrier(mesh);
  return out;
}

TEST_F(DevicePlacement, FactoriesPutShardsOnTheRanksDevice) {
  const World world = device_world(4);
  EXPECT_EQ(world.device_of(2), kDevice);
  expect_on_device(LocalTensor::from_fn(world, [](int r) { return full({3}, r); }), "from_fn");
  const LocalTensor same = LocalTensor::replicate(world, arange(5));
  expect_on_device(same, "replicate");
  EXPECT_TRUE(same.is_replicated());  // one copy per device, shared by its ranks
  // The rank-list forms leave shards where they were made.
  EXPECT_TRUE(LocalTensor::from_fn(world.held_ranks(), [](int r) { return full({3}, r); })
                  .shard(1)
                  .device()
                  .is_cpu());
  EXPECT_TRUE(World::sim(2).device_of(1).is_cpu());
}

TEST_F(DevicePlacement, CollectivesAndDigestsMatchTheHostWorld) {
  const World host = World::sim(4);
  const World device = device_world(4);
  const std::vector<LocalTensor> want = tour(host);
  const std::vector<LocalTensor> got = tour(device);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    expect_on_device(got[i], "collective result");
    for (int r : want[i].ranks()) {
      EXPECT_TRUE(equal(got[i].shard(r).to(cpu()), want[i].shard(r)))
          << "result " << i << " rank " << r;
    }
  }
  EXPECT_EQ(digest(device, got), digest(host, want));
}

TEST_F(DevicePlacement, DTensorProgramsStayOnTheDevice) {
  const World host = World::sim(4);
  const World device = device_world(4);
  auto program = [](const World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    const DTensor w = distribute_tensor(randn({8, 12}, 1), mesh, {Replicate{}, Shard{1}});
    const DTensor x = distribute_tensor(randn({6, 8}, 2), mesh, {Shard{0}, Replicate{}});
    const DTensor b = randn({12}, mesh, {Replicate{}, Shard{0}}, 3);
    DTensor y = gelu(matmul(x, w) + b);
    DTensor z = sum(y, {1}, true);
    DTensor s = softmax(y.redistribute({Shard{0}, Replicate{}}), 1);
    DTensor m = amax(matmul(x, w), {0}, false);
    DTensor p =
        matmul(x.redistribute({Shard{0}, Shard{1}}), w.redistribute({Replicate{}, Shard{0}}));
    return std::vector<DTensor>{y, z, s, m, p.redistribute({Replicate{}, Replicate{}})};
  };
  const std::vector<DTensor> want = program(host);
  const std::vector<DTensor> got = program(device);
  for (size_t i = 0; i < got.size(); ++i) {
    expect_on_device(got[i].to_local(), "DTensor result");
    EXPECT_EQ(got[i].placements(), want[i].placements()) << "result " << i;
    const Tensor full_got = got[i].full_tensor();
    EXPECT_EQ(full_got.device(), kDevice) << "result " << i;
    EXPECT_TRUE(allclose(full_got.to(cpu()), want[i].full_tensor(), 1e-5, 1e-6))
        << "result " << i << ": " << max_abs_diff(full_got.to(cpu()), want[i].full_tensor());
  }
}

}  // namespace
}  // namespace spmd
