// spmd/tensor/storage.cpp: Storage, the CPU caching allocator and the device allocator registry.
#include <spmd/tensor/storage.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <ostream>
#include <vector>

#include <spmd/core/error.h>
#include <spmd/tensor/meta.h>

namespace spmd {

std::string device_str(Device device) {
  if (device.is_cpu()) return "cpu";
  if (device.is_meta()) return "meta";
  return fmt::format("cuda:{}", device.index);
}

std::ostream& operator<<(std::ostream& os, Device device) {
  return os << device_str(device);
}

namespace {

std::array<std::atomic<DeviceAllocator*>, 3> g_device_allocators{};

// "4 GiB", "1.5 MiB": a byte count at a glance, beside the exact number.
std::string bytes_str(std::size_t nbytes) {
  constexpr std::array<const char*, 7> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(nbytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.3g} {}", value, kUnits[unit]);
}

// Note [CPU caching allocator]
// Memory-bound ops write fresh results: a 64 MiB buffer from aligned_alloc is a new mmap, and
// first touching its pages costs more than the op itself. So blocks of at least kMinCachedBlock
// bytes are kept when freed, binned by size class (four classes per power of two, so a class
// wastes at most a quarter of address space, and untouched pages cost no memory), and handed to
// the next request of the same class. The cache holds at most kMaxCachedBytes; beyond that the
// largest cached blocks go back to the OS first. Smaller blocks (under 4 KiB) go straight to the
// C allocator, whose own free lists serve them without page faults. The cache starts at 4 KiB,
// not at glibc's mmap threshold: freeing blocks of a few tens of KiB, as the activations of a
// small model are, made glibc consolidate its free lists on most frees (gpt_bench's d_model 64
// step: 22.5 ms under sim with the cache from 256 KiB, 20.8 ms from 4 KiB).
// The cache counts what it serves (cpu_allocator_stats): a training step in steady state takes
// every cached-size block from the cache, none fresh from the C allocator (gpt_bench's
// fresh_blocks, the test Storage.SteadyStateTrainingStepsTakeNoFreshBlocks).
constexpr std::size_t kAlignment = 64;
constexpr std::size_t kMinCachedBlock = std::size_t{4} << 10;
constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;

// The size actually allocated for a request of n bytes.
std::size_t block_size(std::size_t n) {
  if (n < kMinCachedBlock)
    return (std::max<std::size_t>(n, 1) + kAlignment - 1) & ~(kAlignment - 1);
  // Classes are 4, 5, 6, 7 times a power of two.
  const int top = std::bit_width(n) - 1;  // n >= 2^top
  const std::size_t quarter = std::size_t{1} << (top - 2);
  return (n + quarter - 1) / quarter * quarter;
}

class CpuCache {
 public:
  ~CpuCache() { release(); }

  void* allocate(std::size_t nbytes) {
    const std::size_t size = block_size(nbytes);
    if (size >= kMinCachedBlock) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= size;
        ++stats_.reused_blocks;
        return block;
      }
      ++stats_.fresh_blocks;
      stats_.fresh_bytes += size;
    } else {
      small_blocks_.fetch_add(1, std::memory_order_relaxed);
    }
    void* block = std::aligned_alloc(kAlignment, size);
    if (block == nullptr) {
      // Note [Out of memory] (tensor/factory.h): the cached blocks go back first.
      release();
      block = std::aligned_alloc(kAlignment, size);
    }
    if (block == nullptr) throw std::bad_alloc();
    return block;
  }

  void deallocate(void* block, std::size_t nbytes) {
    const std::size_t size = block_size(nbytes);
    if (size < kMinCachedBlock || size > kMaxCachedBytes) {
      std::free(block);
      return;
    }
    std::vector<void*> evicted;
    {
      std::lock_guard lock(mutex_);
      while (cached_bytes_ + size > kMaxCachedBytes) {
        auto largest = std::prev(free_.end());
        evicted.push_back(largest->second.back());
        largest->second.pop_back();
        cached_bytes_ -= largest->first;
        if (largest->second.empty()) free_.erase(largest);
      }
      free_[size].push_back(block);
      cached_bytes_ += size;
    }
    for (void* b : evicted) std::free(b);
  }

  std::size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

  CpuAllocatorStats stats() {
    std::lock_guard lock(mutex_);
    CpuAllocatorStats s = stats_;
    s.small_blocks = small_blocks_.load(std::memory_order_relaxed);
    return s;
  }

  void release() {
    std::map<std::size_t, std::vector<void*>> blocks;
    {
      std::lock_guard lock(mutex_);
      blocks.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [size, list] : blocks) {
      for (void* b : list) std::free(b);
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // block size -> free blocks of that size
  std::size_t cached_bytes_ = 0;
  CpuAllocatorStats stats_;                // under mutex_, but for small_blocks
  std::atomic<uint64_t> small_blocks_{0};  // under kMinCachedBlock: no lock taken for them
};

CpuCache& cpu_cache() {
  static CpuCache cache;
  return cache;
}

}  // namespace

void register_device_allocator(DeviceType type, DeviceAllocator* allocator) {
  if (type == DeviceType::CPU || type == DeviceType::Meta) {
    throw_error<Unsupported>("register_device_allocator: the {} allocator cannot be replaced",
                             type == DeviceType::CPU ? "CPU" : "meta");
  }
  g_device_allocators[static_cast<std::size_t>(type)].store(allocator);
}

DeviceAllocator* device_allocator(DeviceType type) {
  if (type == DeviceType::CPU) return nullptr;
  return g_device_allocators[static_cast<std::size_t>(type)].load();
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  void* data = nullptr;
  if (nbytes > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max())) {
    throw_error<OutOfMemoryError>(
        "Storage::allocate: cannot allocate {} bytes ({}) on {}: more than "
        "any allocation can hold",
        nbytes, bytes_str(nbytes), device);
  }
  if (device.is_cpu()) {
    try {
      data = cpu_cache().allocate(nbytes);
    } catch (const std::bad_alloc&) {
      throw_error<OutOfMemoryError>("Storage::allocate: cannot allocate {} bytes ({}) on {}",
                                    nbytes, bytes_str(nbytes), device);
    }
  } else if (device.is_meta()) {
    auto storage = std::shared_ptr<Storage>(new Storage(nullptr, nbytes, device));
    storage->meta_id_ = detail::meta_allocated(static_cast<int64_t>(nbytes));
    return storage;
  } else {
    DeviceAllocator* allocator = device_allocator(device.type);
    if (allocator == nullptr) {
      throw_error<Unsupported>("Storage::allocate: no allocator registered for device {}", device);
    }
    data = allocator->allocate(nbytes, device.index);
  }
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    cpu_cache().deallocate(data_, nbytes_);
  } else if (device_.is_meta()) {
    if (meta_id_ != 0) detail::meta_freed(meta_id_, static_cast<int64_t>(nbytes_));
  } else if (DeviceAllocator* allocator = device_allocator(device_.type)) {
    allocator->deallocate(data_, nbytes_, device_.index);
  }
}

std::size_t cpu_allocator_cached_bytes() {
  return cpu_cache().cached_bytes();
}

CpuAllocatorStats cpu_allocator_stats() {
  return cpu_cache().stats();
}

void cpu_allocator_release_cached() {
  cpu_cache().release();
}

}  // namespace spmd
