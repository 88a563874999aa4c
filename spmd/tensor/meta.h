// spmd/tensor/meta.h: the switch that makes factories produce shape-only (meta) tensors.
//
// Note [Shape-only tensors]
// A meta tensor has a shape, strides, a dtype and a Storage on the meta device that records its
// size and holds no data (torch's device='meta'). Views work as usual; every op-table entry runs
// its `meta` function only (ops/op.cpp), so shapes are checked exactly as in a real run; the
// collectives compute each rank's result shape (collectives/group_math.cpp). Anything that would
// read or write values (item(), to_vector(), equal(), a kernel) throws ShapeOnlyError naming the
// call. Writes (fill_, copy_) check shapes and do nothing.
//
// --spmd-tensors=meta (SPMD_TENSORS=meta) turns meta_tensors() on for the run: every factory
// (empty, zeros, full, arange, from_vector, randn, ...) then makes meta tensors, so the same
// program runs without data. Library code that needs real values under a meta run (sizes
// exchanged through a collective) opens a MetaTensorsScope(false) around them.
#pragma once

#include <cstdint>
#include <string_view>

#include <spmd/core/error.h>

namespace spmd {

class Tensor;

// Reading a value of a shape-only tensor.
class ShapeOnlyError : public Unsupported {
 public:
  using Unsupported::Unsupported;
  std::string_view type_name() const noexcept override { return "ShapeOnlyError"; }
};

// Whether factories make meta tensors: this thread's MetaTensorsScope if one is open, else the
// process-wide setting (launch() sets it from --spmd-tensors for the run).
bool meta_tensors();
void set_meta_tensors(bool on);

// Sets meta_tensors() on this thread for a scope and restores it after (rank threads of the
// threads backend each open their own).
class MetaTensorsScope {
 public:
  explicit MetaTensorsScope(bool on);
  ~MetaTensorsScope();
  MetaTensorsScope(const MetaTensorsScope&) = delete;
  MetaTensorsScope& operator=(const MetaTensorsScope&) = delete;

 private:
  int saved_;
};

// Bytes of meta storages alive now and the most alive at once since the last reset: what a
// dry run would hold (each distinct shard counted once: per rank when ranks' shards have the
// same shapes, Note [Shard classes] in world/local_tensor.h).
int64_t meta_live_bytes();
int64_t meta_peak_bytes();
void reset_meta_peak_bytes();

namespace detail {
// Storage on the meta device counts its bytes here (tensor/storage.cpp).
void count_meta_bytes(int64_t delta);
}  // namespace detail

// Throws ShapeOnlyError: `op` needs the values of `t`, a meta tensor.
[[noreturn]] void throw_shape_only(std::string_view op, const Tensor& t);

}  // namespace spmd
