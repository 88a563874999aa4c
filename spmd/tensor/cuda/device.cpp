// spmd/tensor/cuda/device.cpp: CUDA discovery, per-device streams, error messages and the caching
// allocator.
#include <spmd/tensor/cuda/device.h>

#include <array>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/error.h>
#include <spmd/tensor/cuda/cuda_ops.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/storage.h>

namespace spmd {
namespace {

// Devices a process can address; more than any machine has.
constexpr int kMaxDevices = 64;

// Process-lifetime objects that must outlive every static Tensor: their destructors never run
// (a Storage freed during static destruction still finds its allocator).
template <class T>
class NoDestructor {
 public:
  NoDestructor() { ::new (static_cast<void*>(storage_)) T(); }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

void check_index(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw_error<Unsupported>("cuda:{}: device indices run from 0 to {}", device, kMaxDevices - 1);
  }
}

struct DeviceState {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::atomic<int> rank{-1};
};

std::array<DeviceState, kMaxDevices>& devices() {
  static NoDestructor<std::array<DeviceState, kMaxDevices>> states;
  return states.get();
}

// Note [CUDA caching allocator]
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, so freed blocks
// are kept per device and size class and handed to the next request of that class (classes as
// the CPU allocator's: multiples of 512 bytes below 1 MiB, four classes per power of two above).
// Reuse needs no event: every use of a block is on its device's one stream (Note [CUDA streams
// and sync points]), so a new use is queued after the last old one. When cudaMalloc runs out of
// memory, the device's cached blocks are freed and the allocation tried once more.
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
constexpr std::size_t kSmallUnit = 512;

std::size_t block_size(std::size_t n) {
  if (n < kSmallLimit)
    return (std::max<std::size_t>(n, 1) + kSmallUnit - 1) / kSmallUnit * kSmallUnit;
  const int top = std::bit_width(n) - 1;
  const std::size_t quarter = std::size_t{1} << (top - 2);
  return (n + quarter - 1) / quarter * quarter;
}

class CudaAllocator final : public DeviceAllocator {
 public:
  void* allocate(std::size_t nbytes, int device) override {
    check_index(device);
    Pool& pool = pools_[static_cast<std::size_t>(device)];
    const std::size_t size = block_size(nbytes);
    {
      std::lock_guard lock(pool.mutex);
      auto it = pool.free.find(size);
      if (it != pool.free.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        pool.cached -= size;
        pool.in_use += size;
        return block;
      }
    }
    gpu::set_device(device);
    void* block = nullptr;
    cudaError_t error = cudaMalloc(&block, size);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error before retrying
      release(device);
      error = cudaMalloc(&block, size);
    }
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t in_use = 0;
      {
        std::lock_guard lock(pool.mutex);
        in_use = pool.in_use;
      }
      const std::string message = fmt::format(
          "cudaMalloc of {} bytes failed on {}: {} ({}); the caching allocator holds {} bytes in "
          "live tensors",
          size, gpu::where(device), cudaGetErrorString(error), cudaGetErrorName(error), in_use);
      // Note [Out of memory] (tensor/factory.h): empty() adds the op and the shape.
      if (error == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
      throw Error(message);
    }
    std::lock_guard lock(pool.mutex);
    pool.in_use += size;
    return block;
  }

  void deallocate(void* ptr, std::size_t nbytes, int device) override {
    Pool& pool = pools_[static_cast<std::size_t>(device)];
    const std::size_t size = block_size(nbytes);
    std::lock_guard lock(pool.mutex);
    pool.free[size].push_back(ptr);
    pool.cached += size;
    pool.in_use -= size;
  }

  void release(int device) {
    Pool& pool = pools_[static_cast<std::size_t>(device)];
    std::map<std::size_t, std::vector<void*>> blocks;
    {
      std::lock_guard lock(pool.mutex);
      blocks.swap(pool.free);
      pool.cached = 0;
    }
    if (blocks.empty()) return;
    gpu::set_device(device);
    gpu::synchronize(device);
    for (auto& [size, list] : blocks) {
      for (void* block : list) gpu::check(cudaFree(block), "cudaFree", device);
    }
  }

  std::size_t cached(int device) {
    Pool& pool = pools_[static_cast<std::size_t>(device)];
    std::lock_guard lock(pool.mutex);
    return pool.cached;
  }

  std::size_t in_use(int device) {
    Pool& pool = pools_[static_cast<std::size_t>(device)];
    std::lock_guard lock(pool.mutex);
    return pool.in_use;
  }

 private:
  struct Pool {
    std::mutex mutex;
    std::map<std::size_t, std::vector<void*>> free;  // block size -> free blocks
    std::size_t cached = 0;
    std::size_t in_use = 0;
  };
  std::array<Pool, kMaxDevices> pools_;
};

CudaAllocator& allocator() {
  static NoDestructor<CudaAllocator> instance;
  return instance.get();
}

}  // namespace

CudaDevices probe_cuda_devices() {
  CudaDevices result;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    result.error = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorString(error),
                               cudaGetErrorName(error));
  } else if (count <= 0) {
    result.error = "cudaGetDeviceCount found no CUDA device";
  } else {
    result.count = count;
  }
  return result;
}

void install_cuda() {
  register_device_allocator(DeviceType::CUDA, &allocator());
  register_device_ops(DeviceType::CUDA, &gpu::device_ops());
}

void set_cuda_device_rank(int device, int rank) {
  check_index(device);
  devices()[static_cast<std::size_t>(device)].rank.store(rank);
}

namespace gpu {

std::string where(int device) {
  const int rank = device >= 0 && device < kMaxDevices
                       ? devices()[static_cast<std::size_t>(device)].rank.load()
                       : -1;
  if (rank < 0) return fmt::format("cuda:{}", device);
  return fmt::format("rank {} (cuda:{})", rank, device);
}

void throw_error(cudaError_t error, const char* call, int device) {
  ::spmd::throw_error<Error>("{} failed on {}: {} ({})", call, where(device),
                             cudaGetErrorString(error), cudaGetErrorName(error));
}

void set_device(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice", device);
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice", device);
}

cudaStream_t stream(int device) {
  check_index(device);
  DeviceState& state = devices()[static_cast<std::size_t>(device)];
  std::call_once(state.stream_once, [&] {
    set_device(device);
    check(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags", device);
  });
  return state.stream;
}

void synchronize(int device) {
  set_device(device);
  check(cudaStreamSynchronize(stream(device)), "cudaStreamSynchronize", device);
}

std::size_t allocated_bytes(int device) {
  check_index(device);
  return allocator().in_use(device);
}

std::size_t cached_bytes(int device) {
  check_index(device);
  return allocator().cached(device);
}

void release_cached(int device) {
  check_index(device);
  allocator().release(device);
}

}  // namespace gpu
}  // namespace spmd
