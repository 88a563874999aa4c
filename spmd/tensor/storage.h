// spmd/tensor/storage.h: devices and the reference-counted buffers tensors view.
//
// A Storage owns one allocation on one device. Tensors hold it through shared_ptr, so copies of
// a Tensor share data (torch semantics) and the buffer is freed with its last view. CPU buffers
// are 64-byte aligned and come from a caching allocator: large buffers freed by one op are reused
// by the next without returning pages to the OS (page faults would otherwise dominate
// memory-bound ops on fresh 64 MiB results). Other device types plug in an allocator at run time
// (the NCCL backend registers CUDA).
#pragma once

#include <atomic>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include <fmt/format.h>

#include <spmd/core/format.h>

namespace spmd {

// Meta: shape-only tensors (Note [Shape-only tensors] in tensor/meta.h): a Storage of that type
// records its size and holds no data.
enum class DeviceType : uint8_t { CPU, CUDA, Meta };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_meta() const { return type == DeviceType::Meta; }
  bool operator==(const Device&) const = default;
};

inline Device cpu() {
  return Device{};
}
inline Device cuda(int index) {
  return Device{DeviceType::CUDA, index};
}
inline Device meta_device() {
  return Device{DeviceType::Meta, 0};
}
// "cpu", "cuda:0" or "meta".
std::string device_str(Device device);
std::ostream& operator<<(std::ostream& os, Device device);

// Allocation service for a non-CPU device type.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(std::size_t nbytes, int device_index) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes, int device_index) = 0;
};
// Installs the allocator used for `type` (not CPU); the object must outlive every Storage.
void register_device_allocator(DeviceType type, DeviceAllocator* allocator);
// nullptr when none is registered.
DeviceAllocator* device_allocator(DeviceType type);

class Storage {
 public:
  // A new uninitialised buffer of `nbytes` on `device`. Throws Unsupported for a device type
  // with no registered allocator, and OutOfMemoryError naming the bytes and the device when the
  // allocation fails (never a bare std::bad_alloc). On the meta device nothing is allocated: data()
  // is null.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device = {});
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // In-place writes through Tensor::fill_ and copy_ so far: autograd checks that the values it
  // saved for backward were not overwritten since (writes through data pointers are not counted).
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

  // Meta storage: its id in the shape-only byte count (Note [Meta allocations] in tensor/meta.h),
  // 0 when uncounted (made inside a MetaUncountedScope).
  uint64_t meta_id() const { return meta_id_; }

 private:
  Storage(void* data, std::size_t nbytes, Device device)
      : data_(data), nbytes_(nbytes), device_(device) {}
  void* data_;
  std::size_t nbytes_;
  Device device_;
  std::atomic<uint64_t> version_{0};
  uint64_t meta_id_ = 0;
};

// What the CPU caching allocator has served since the process started (Note [CPU caching
// allocator] in tensor/storage.cpp); counts only grow, so a caller compares two readings.
struct CpuAllocatorStats {
  uint64_t reused_blocks = 0;  // cached-size requests served from the cache
  uint64_t fresh_blocks = 0;   // cached-size requests that took a new block from the C allocator
  uint64_t fresh_bytes = 0;    // their bytes
  uint64_t small_blocks = 0;   // requests under 4 KiB, which go to the C allocator uncached
};
CpuAllocatorStats cpu_allocator_stats();
// Bytes the CPU caching allocator currently keeps for reuse (freed but not returned).
std::size_t cpu_allocator_cached_bytes();
// Returns every cached CPU block to the OS.
void cpu_allocator_release_cached();

}  // namespace spmd

SPMD_FORMAT_AS_TEXT(spmd::Device, spmd::device_str(value))
