// spmd/tensor/factory.h: new tensors: empty, zeros, ones, full, arange, scalar_tensor, from_vector.
//
// Results are contiguous, on the CPU unless a device is given. The ops on tensors are in
// ops/ops.h; the random factories (randn, rand) in tensor/random.h.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <spmd/tensor/tensor.h>

namespace spmd {

// Note [Out of memory]
// A tensor the allocator cannot provide is an OutOfMemoryError, not a bare std::bad_alloc:
//     OutOfMemoryError: add: out of memory allocating a [1048576, 1048576] f32 tensor of
//     4398046511104 bytes (4 TiB) on cpu
// The op is the outermost AllocationScope of the calling thread: call() (ops/op.h) opens one
// for every op-table entry, so the LocalTensor and DTensor forms of an op name it too, and an op
// computed from other ops is named itself; without one the factory is named ("empty").
// Before failing, the CPU allocator gives its cached blocks back and tries once more. Linux may
// grant an allocation it cannot back (overcommit): touching it later ends the process by the OOM
// killer (SIGKILL), which no program can turn into an error; the launcher (mpirun, spmdrun) then
// reports the killed rank.
class AllocationScope {
 public:
  // Names `op` unless an outer scope of this thread already names one. `op` must outlive the
  // scope (op names are string literals).
  explicit AllocationScope(std::string_view op);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

 private:
  std::string_view previous_;
};

// Uninitialized elements. ShapeError naming the op and the shape for a negative size or an
// element count (or byte size) that does not fit in int64; OutOfMemoryError naming the op, the
// shape, the dtype and the bytes when the memory cannot be had (Note [Out of memory]); Unsupported
// for a DType that is not one. The factories below check the same and name themselves; full and
// fill_ also refuse a value the dtype cannot hold (check_fill_value: NaN into i32).
Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = {});
// empty() whose errors name `op` (the operation that needs the buffer) instead of "empty".
Tensor empty_for(std::string_view op, const Shape& shape, DType dtype, Device device = {});
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = {});
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = {});
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = {});
// [0, 1, ..., n-1].
Tensor arange(int64_t n, DType dtype = DType::F32);
// A 0-d tensor.
Tensor scalar_tensor(double value, DType dtype = DType::F32);
// A tensor of `shape` (1-D of values.size() when empty) with dtype_of<T>(); ShapeError when the
// element count differs from the shape's.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape = {});

}  // namespace spmd
