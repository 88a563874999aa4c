// Tests for the device seam (tensor/device_ops.h): with a fake "cuda" device whose memory is
// host memory and whose kernels forward to the CPU ones, every op must route through the
// registered DeviceOps (and only it), mixing devices must fail naming both, and a device with
// no kernels must fail with Unsupported naming the op and the device.
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/element_ops.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include <spmd/ops/ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

class HostBackedAllocator : public DeviceAllocator {
 public:
  void* allocate(std::size_t nbytes, int) override {
    ++live;
    return std::aligned_alloc(64, (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64);
  }
  void deallocate(void* ptr, std::size_t, int) override {
    --live;
    std::free(ptr);
  }
  int live = 0;
};

// Counts calls per kernel family and forwards to the CPU kernels.
class RecordingOps : public DeviceOps {
 public:
  void fill(const Tensor& dst, double value) override {
    ++calls["fill"];
    cpu_ops().fill(dst, value);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    ++calls["copy"];
    cpu_ops().copy(dst, src);
  }
  void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) override {
    ++calls[std::string(element::name_of<element::BinaryOps>(op))];
    cpu_ops().binary(op, out, a, b);
  }
  void unary(int op, const Tensor& out, const Tensor& in) override {
    ++calls[std::string(element::name_of<element::UnaryOps>(op))];
    cpu_ops().unary(op, out, in);
  }
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
    ++calls[std::string(op_name(op))];
    cpu_ops().reduce(op, out, in, dims);
  }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
              double beta) override {
    ++calls["matmul"];
    cpu_ops().matmul(out, a, b, alpha, beta);
  }
  void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) override {
    ++calls[log ? "log_softmax" : "softmax"];
    cpu_ops().softmax(out, in, d, log);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    ++calls["where"];
    cpu_ops().where(out, cond, a, b);
  }
  bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
              int64_t limit) override {
    ++calls["gather"];
    return cpu_ops().gather(out, in, dim, index, offset, limit);
  }
  bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                   int64_t offset, int64_t limit) override {
    ++calls["scatter_add"];
    return cpu_ops().scatter_add(out, dim, index, src, offset, limit);
  }
  bool equal(const Tensor& a, const Tensor& b) override {
    ++calls["equal"];
    return cpu_ops().equal(a, b);
  }
  bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) override {
    ++calls["allclose"];
    return cpu_ops().allclose(a, b, rtol, atol);
  }
  double max_abs_diff(const Tensor& a, const Tensor& b) override {
    ++calls["max_abs_diff"];
    return cpu_ops().max_abs_diff(a, b);
  }
  bool has_nonfinite(const Tensor& t) override {
    ++calls["has_nonfinite"];
    return cpu_ops().has_nonfinite(t);
  }
  std::map<std::string, int> calls;
};

class DeviceSeam : public ::testing::Test {
 protected:
  void SetUp() override { register_device_allocator(DeviceType::CUDA, &allocator_); }
  void TearDown() override {
    register_device_ops(DeviceType::CUDA, nullptr);
    register_device_allocator(DeviceType::CUDA, nullptr);
  }
  HostBackedAllocator allocator_;
  RecordingOps ops_;
};

TEST_F(DeviceSeam, NoKernelsRegisteredIsUnsupported) {
  Tensor t = empty({2, 3}, DType::F32, cuda(0));  // allocation alone works
  EXPECT_EQ(t.device(), cuda(0));
  expect_throws<Unsupported>([&] { t.fill_(1); },
                             {"fill_: no kernels registered for device cuda:0"});
  expect_throws<Unsupported>([&] { add(t, t); }, {"add: no kernels registered for device cuda:0"});
  expect_throws<Unsupported>([&] { matmul(t, t.transpose(0, 1)); }, {"matmul", "cuda:0"});
  expect_throws<Unsupported>([&] { sum(t); }, {"sum", "cuda:0"});
  expect_throws<Unsupported>([&] { t.to(cpu()); }, {"copy_", "cuda:0"});
  expect_throws<Unsupported>([&] { zeros({2}).to(cuda(0)); }, {"copy_", "cuda:0"});
  expect_throws<Unsupported>([] { register_device_ops(DeviceType::CPU, nullptr); },
                             {"register_device_ops"});
}

TEST_F(DeviceSeam, MixingDevicesNamesBoth) {
  register_device_ops(DeviceType::CUDA, &ops_);
  const Tensor g = ones({3}, DType::F32, cuda(0));
  const Tensor c = ones({3});
  expect_throws<Unsupported>([&] { add(c, g); }, {"add", "different devices", "cpu", "cuda:0"});
  expect_throws<Unsupported>([&] { matmul(g, c); }, {"matmul", "cuda:0", "cpu"});
  expect_throws<Unsupported>([&] { cat({c, g}); }, {"cat", "cuda:0", "cpu"});
  expect_throws<Unsupported>([&] { add(g, ones({3}, DType::F32, cuda(1))); },
                             {"add", "cuda:0", "cuda:1"});
  expect_throws<Unsupported>([&] { equal(c, g); }, {"equal", "cuda:0"});
}

TEST_F(DeviceSeam, EveryOpRoutesThroughTheRegisteredKernels) {
  register_device_ops(DeviceType::CUDA, &ops_);
  const Tensor host = from_vector<float>({1, -2, 3, 4, 5, -6}, {2, 3});
  const Tensor g = host.to(cuda(0));
  EXPECT_EQ(g.device(), cuda(0));
  EXPECT_EQ(ops_.calls["copy"], 1);

  const Tensor s = g + g * 2.0;
  EXPECT_EQ(s.device(), cuda(0));
  EXPECT_EQ(ops_.calls["add"], 1);
  EXPECT_EQ(ops_.calls["mul"], 1);
  EXPECT_EQ(ops_.calls["fill"], 1);  // the scalar operand is made on the device
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{3, -6, 9, 12, 15, -18}));

  EXPECT_EQ(relu(g).device(), cuda(0));
  EXPECT_EQ(ops_.calls["relu"], 1);
  EXPECT_EQ(sum(g, {1}).to_vector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(ops_.calls["sum"], 1);
  EXPECT_EQ(matmul(g, g.transpose(0, 1)).to_vector<float>(),
            (std::vector<float>{14, -24, -24, 77}));
  EXPECT_EQ(ops_.calls["matmul"], 1);
  softmax(g, 1);
  log_softmax(g, 0);
  EXPECT_EQ(ops_.calls["softmax"], 1);
  EXPECT_EQ(ops_.calls["log_softmax"], 1);
  EXPECT_TRUE(equal(g, g));
  EXPECT_TRUE(allclose(g, g));
  EXPECT_EQ(max_abs_diff(g, g), 0);
  EXPECT_FALSE(has_nonfinite(g));
  EXPECT_EQ(ops_.calls["equal"], 1);
  EXPECT_EQ(ops_.calls["allclose"], 1);
  EXPECT_EQ(ops_.calls["max_abs_diff"], 1);
  EXPECT_EQ(ops_.calls["has_nonfinite"], 1);

  // Device -> host copies, conversions, views, cat and printing all stay on the seam.
  const int copies = ops_.calls["copy"];
  EXPECT_EQ(g.narrow(0, 1, 1).narrow(1, 2, 1).item<float>(), -6.0f);
  EXPECT_EQ(g.to(DType::F64).device(), cuda(0));
  EXPECT_EQ(cat({g, g}, 0).shape(), (Shape{4, 3}));
  EXPECT_GT(ops_.calls["copy"], copies);
  EXPECT_NE(g.to_string().find("device=cuda:0"), std::string::npos) << g.to_string();
  EXPECT_EQ(g.transpose(0, 1).contiguous().to_vector<float>(),
            (std::vector<float>{1, 4, -2, 5, 3, -6}));
}

TEST_F(DeviceSeam, DeviceMemoryIsReturnedToItsAllocator) {
  register_device_ops(DeviceType::CUDA, &ops_);
  {
    const Tensor g = ones({16}, DType::F32, cuda(0));
    const Tensor h = g + g;
    EXPECT_GE(allocator_.live, 2);
  }
  EXPECT_EQ(allocator_.live, 0);
}

}  // namespace
}  // namespace spmd
