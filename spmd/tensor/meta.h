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

// Note [Meta allocations]
// Every meta storage counts its bytes from its allocation to its destruction, and a listener
// (the dry run's allocator model, debug/allocator_model.h) sees each allocation and free in the
// order they happen, by id. Storages made on a thread inside a MetaUncountedScope are not
// counted: the scope stands for a fused kernel whose temporaries live in on-chip memory (a
// flash-attention backward, Note [Fused attention accounting] in ops/ops.h), whose results are
// made after the scope closes. Each allocation also carries the stream a real run would make it
// on (Note [Allocation streams]).
//
// Note [Allocation streams]
// PyTorch's caching allocator keeps a pool of blocks per CUDA stream: memory freed by a tensor
// made on one stream is reused only by later allocations on that stream, never by another's. Most
// work runs on the compute stream; FSDP2 makes the reduced gradients on its reduce-scatter stream
// (torch.distributed.fsdp's foreach_reduce allocates the reduce-scatter output there, and the
// sharded gradient is a view of it, or its cast to the parameter's dtype made there too), so
// the gradients a step's backward reduces hold memory the compute stream cannot take back after
// zero_grad: the next forward's activations grow the compute stream's pool instead. Library code
// that stands for such a stream opens a MetaStreamScope around its allocations (the FSDP
// reduction in dtensor/ and nn/), and the listener is told each allocation's stream.
enum class MetaStream : uint8_t {
  compute = 0,        // the default stream
  reduce_scatter = 1  // FSDP2's reduce-scatter stream: the reduced (sharded) gradients
};
inline constexpr int kMetaStreams = 2;
std::string_view meta_stream_name(MetaStream stream);
// The stream this thread's meta allocations are made on (compute unless a scope is open).
MetaStream meta_stream();
// Meta storages made on this thread while the scope is open are made on `stream` (nests).
class MetaStreamScope {
 public:
  explicit MetaStreamScope(MetaStream stream);
  ~MetaStreamScope();
  MetaStreamScope(const MetaStreamScope&) = delete;
  MetaStreamScope& operator=(const MetaStreamScope&) = delete;

 private:
  MetaStream saved_;
};

// Bytes of counted meta storages alive now and the most alive at once since the last reset:
// what a dry run would hold (each distinct shard counted once: per rank when ranks' shards have
// the same shapes, Note [Shard classes] in world/local_tensor.h).
int64_t meta_live_bytes();
int64_t meta_peak_bytes();
// Also forgets meta_bytes_at_backward.
void reset_meta_peak_bytes();
// The counted bytes alive when the first backward since the last reset began (what the forward
// left: the parameters and optimizer state, the activations autograd saved, the loss), noted by
// the autograd engine under --spmd-tensors=meta; -1 before that.
int64_t meta_bytes_at_backward();

// Sees counted meta allocations and frees, in order, under a lock (one call at a time).
class MetaAllocationListener {
 public:
  virtual ~MetaAllocationListener() = default;
  virtual void allocated(uint64_t id, int64_t bytes, MetaStream stream) = 0;
  virtual void freed(uint64_t id, int64_t bytes) = 0;
};
// Installs `listener` (nullptr: none) and returns the one it replaces.
MetaAllocationListener* set_meta_allocation_listener(MetaAllocationListener* listener);

// Meta storages made on this thread while the scope is open are not counted (nests).
class MetaUncountedScope {
 public:
  MetaUncountedScope();
  ~MetaUncountedScope();
  MetaUncountedScope(const MetaUncountedScope&) = delete;
  MetaUncountedScope& operator=(const MetaUncountedScope&) = delete;
};

namespace detail {
// Storage on the meta device reports here (tensor/storage.cpp): meta_allocated returns the
// storage's id, 0 inside a MetaUncountedScope.
uint64_t meta_allocated(int64_t bytes);
void meta_freed(uint64_t id, int64_t bytes);
// ops/autograd.cpp: a backward begins (noted if it is the first since the reset).
void note_backward_start();
}  // namespace detail

// Throws ShapeOnlyError: `op` needs the values of `t`, a meta tensor.
[[noreturn]] void throw_shape_only(std::string_view op, const Tensor& t);

}  // namespace spmd
