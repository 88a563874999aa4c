// spmd/tensor/factory.cpp: the factories of tensor/factory.h.
#include <spmd/tensor/factory.h>

#include <algorithm>
#include <iterator>
#include <new>

#include <spmd/core/error.h>
#include <spmd/tensor/meta.h>

namespace spmd {

namespace {

// The op named by the calling thread's outermost AllocationScope; empty outside any.
thread_local std::string_view t_allocating_op;

// "4 TiB", "1.5 GiB", "512 MiB", "12 KiB", "100 bytes".
std::string bytes_text(std::size_t bytes) {
  constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} bytes", bytes) : fmt::format("{:.3g} {}", value, kUnits[unit]);
}

// Note [Out of memory].
[[noreturn]] void throw_out_of_memory(const Shape& shape, DType dtype, Device device,
                                      std::size_t bytes, std::string_view why) {
  throw_error<OutOfMemoryError>(
      "{}: out of memory allocating a {} {} tensor of {} bytes ({}) on {}{}{}",
      t_allocating_op.empty() ? std::string_view("empty") : t_allocating_op, shape_str(shape),
      dtype, bytes, bytes_text(bytes), device_str(device), why.empty() ? "" : ": ", why);
}

}  // namespace

AllocationScope::AllocationScope(std::string_view op) : previous_(t_allocating_op) {
  if (previous_.empty()) t_allocating_op = op;
}

AllocationScope::~AllocationScope() {
  t_allocating_op = previous_;
}

Tensor empty_for(std::string_view op, const Shape& shape, DType dtype, Device device) {
  check_dtype(dtype, op);
  const int64_t numel = checked_numel(shape, op);
  // Under --spmd-tensors=meta host tensors are shape-only (Note [Shape-only tensors]).
  if (device.is_cpu() && meta_tensors()) device = meta_device();
  const std::size_t bytes = static_cast<std::size_t>(numel) * itemsize(dtype);
  if (!device.is_cpu() && !device.is_meta() && device_allocator(device.type) == nullptr) {
    throw_error<Unsupported>("{}: no allocator is registered for device {} (shape {} {})", op,
                             device, shape_str(shape), dtype);
  }
  // Names `op` unless an op-table call of this thread already names its op (Note [Out of memory]).
  const AllocationScope scope(op);
  std::shared_ptr<Storage> storage;
  try {
    storage = Storage::allocate(bytes, device);
  } catch (const std::bad_alloc&) {
    throw_out_of_memory(shape, dtype, device, bytes, "");
  } catch (const OutOfMemoryError& e) {
    // The CPU allocator's report adds nothing; a device allocator's (cudaMalloc's error) does.
    throw_out_of_memory(shape, dtype, device, bytes, device.is_cpu() ? "" : e.what());
  }
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return empty_for("empty", shape, dtype, device);
}

namespace {

Tensor full_for(std::string_view op, const Shape& shape, double value, DType dtype, Device device) {
  check_dtype(dtype, op);
  check_fill_value(value, dtype, op);
  Tensor out = empty_for(op, shape, dtype, device);
  out.fill_(value);
  return out;
}

}  // namespace

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full_for("zeros", shape, 0.0, dtype, device);
}

Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full_for("ones", shape, 1.0, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return full_for("full", shape, value, dtype, device);
}

Tensor arange(int64_t n, DType dtype) {
  if (n < 0) throw_error<ShapeError>("arange: n must be non-negative, got {}", n);
  check_dtype(dtype, "arange");
  if (dtype == DType::Bool) throw_error<Unsupported>("arange: dtype bool is not supported");
  Tensor out = empty_for("arange", {n}, dtype);
  if (out.is_meta()) return out;
  dispatch_arithmetic(dtype, "arange", [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = convert_element<T>(i);
  });
  return out;
}

Tensor scalar_tensor(double value, DType dtype) {
  return full({}, value, dtype);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  const Shape actual = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  const int64_t numel = checked_numel(actual, "from_vector");
  if (static_cast<std::size_t>(numel) != values.size()) {
    throw_error<ShapeError>("from_vector: {} values do not fill shape {} ({} elements)",
                            values.size(), shape_str(actual), numel);
  }
  Tensor out = empty_for("from_vector", actual, dtype_of<T>());
  if (out.is_meta()) return out;
  std::copy(values.begin(), values.end(), out.data<T>());
  return out;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&);

}  // namespace spmd
