// spmd/tensor/device_ops.cpp: the DeviceOps registry, the built-in CPU DeviceOps, and kernels_for.
#include <spmd/tensor/device_ops.h>

#include <array>
#include <atomic>

#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/meta.h>

namespace spmd {

std::string_view op_name(Reduction op) {
  switch (op) {
    case Reduction::Sum:
      return "sum";
    case Reduction::Mean:
      return "mean";
    case Reduction::Amax:
      return "amax";
    case Reduction::Amin:
      return "amin";
  }
  return "?";
}

namespace {

class CpuOps final : public DeviceOps {
 public:
  void fill(const Tensor& dst, double value) override { cpu_kernels::fill(dst, value); }
  void copy(const Tensor& dst, const Tensor& src) override { cpu_kernels::copy(dst, src); }
  void binary(int op, const Tensor& out, const Tensor& a, const Tensor& b) override {
    cpu_kernels::binary(op, out, a, b);
  }
  void unary(int op, const Tensor& out, const Tensor& in) override {
    cpu_kernels::unary(op, out, in);
  }
  void unary_backward(int op, const Tensor& out, const Tensor& grad, const Tensor& in,
                      const Tensor& result) override {
    cpu_kernels::unary_backward(op, out, grad, in, result);
  }
  void binary_backward(int op, int wrt, const Tensor& out, const Tensor& grad, const Tensor& a,
                       const Tensor& b) override {
    cpu_kernels::binary_backward(op, wrt, out, grad, a, b);
  }
  void reduce(Reduction op, const Tensor& out, const Tensor& in,
              const std::vector<int64_t>& dims) override {
    cpu_kernels::reduce(op, out, in, dims);
  }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
              double beta) override {
    cpu_kernels::matmul(out, a, b, alpha, beta);
  }
  bool attention(const Tensor& out, const AttentionKernelArgs& a) override {
    return cpu_kernels::attention(out, a);
  }
  bool attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& grad,
                          const AttentionKernelArgs& a) override {
    return cpu_kernels::attention_backward(dq, dk, dv, grad, a);
  }
  void softmax(const Tensor& out, const Tensor& in, int64_t d, bool log) override {
    cpu_kernels::softmax(out, in, d, log);
  }
  bool adamw(const Tensor& out, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
             const AdamWKernelArgs& a) override {
    return cpu_kernels::adamw(out, p, g, m, v, a);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    cpu_kernels::where(out, cond, a, b);
  }
  bool gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, int64_t offset,
              int64_t limit) override {
    return cpu_kernels::gather(out, in, dim, index, offset, limit);
  }
  bool scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                   int64_t offset, int64_t limit) override {
    return cpu_kernels::scatter_add(out, dim, index, src, offset, limit);
  }
  bool equal(const Tensor& a, const Tensor& b) override { return cpu_kernels::equal(a, b); }
  bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) override {
    return cpu_kernels::allclose(a, b, rtol, atol);
  }
  double max_abs_diff(const Tensor& a, const Tensor& b) override {
    return cpu_kernels::max_abs_diff(a, b);
  }
  bool has_nonfinite(const Tensor& t) override { return cpu_kernels::has_nonfinite(t); }
};

std::array<std::atomic<DeviceOps*>, 3> g_device_ops{};

}  // namespace

void register_device_ops(DeviceType type, DeviceOps* ops) {
  if (type == DeviceType::CPU || type == DeviceType::Meta) {
    throw_error<Unsupported>("register_device_ops: the {} kernels cannot be replaced",
                             type == DeviceType::CPU ? "CPU" : "meta");
  }
  g_device_ops[static_cast<std::size_t>(type)].store(ops);
}

DeviceOps& cpu_ops() {
  static CpuOps ops;
  return ops;
}

DeviceOps& kernels_for(std::string_view op, Device device) {
  if (device.is_cpu()) return cpu_ops();
  if (device.is_meta()) {
    throw_error<ShapeOnlyError>(
        "{}: the tensor is shape-only (--spmd-tensors=meta) and has no values to compute with", op);
  }
  DeviceOps* ops = g_device_ops[static_cast<std::size_t>(device.type)].load();
  if (ops == nullptr) {
    throw_error<Unsupported>("{}: no kernels registered for device {}", op, device);
  }
  return *ops;
}

DeviceOps& kernels_for(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  std::optional<Device> device;
  int position = 0;
  for (const Tensor* t : tensors) {
    ++position;
    if (!t->defined()) {
      throw_error<Error>("{}: argument {} is an undefined tensor", op, position);
    }
    if (!device) {
      device = t->device();
    } else if (t->device() != *device) {
      throw_error<Unsupported>("{}: tensors on different devices ({} and {})", op, *device,
                               t->device());
    }
  }
  return kernels_for(op, device.value_or(Device{}));
}

}  // namespace spmd
