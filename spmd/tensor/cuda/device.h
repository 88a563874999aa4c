// spmd/tensor/cuda/device.h: CUDA devices for tensors: discovery, one stream per device, the
// caching allocator, error checks, and install_cuda(), which plugs them into the tensor module.
//
// Built only with the NCCL backend (SPMD_HAVE_NCCL). After install_cuda(), tensors on cuda(i)
// allocate from a caching allocator and every op runs CUDA kernels (tensor/cuda/cuda_ops.cpp):
//
//   install_cuda();
//   Tensor x = randn({4, 8}, /*seed=*/0).to(cuda(0));   // host -> device copy
//   Tensor y = softmax(matmul(x, x.transpose(0, 1)), 1);  // runs on the GPU
//   fmt::print("{}\n", y);                               // copies back to print
//
// Note [CUDA streams and sync points]
// Each device has one stream (non-blocking with respect to the legacy default stream), used for
// every kernel, copy, cuBLAS call and NCCL collective on that device. Work is therefore ordered
// without events, and a buffer freed to the caching allocator can be handed to the next
// allocation at once: any later use is queued behind every earlier one. The host waits for the
// stream only where it must read results: device -> host copies (item, to_vector, printing,
// to(cpu())), the comparisons (equal, allclose, max_abs_diff, has_nonfinite), host -> device
// copies from pageable memory (CUDA synchronizes the stream before staging them), and the nccl
// backend's signature exchange before each collective. Everything else returns once enqueued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace spmd {

// Usable CUDA devices: count > 0, or count == 0 and `error` saying why. Any error of
// cudaGetDeviceCount counts as no GPU (on a machine without a driver it reports
// cudaErrorInsufficientDriver, not cudaErrorNoDevice); the error names the call, CUDA's error
// string and the error's name.
struct CudaDevices {
  int count = 0;
  std::string error;
};
CudaDevices probe_cuda_devices();

// Registers the CUDA allocator and kernels for DeviceType::CUDA. Idempotent; touches no GPU (each
// device's stream and cuBLAS handle are created on first use).
void install_cuda();

// Error messages about `device` name `rank` (the nccl backend's rank on that device).
void set_cuda_device_rank(int device, int rank);

namespace gpu {

// "rank 3 (cuda:0)", or "cuda:0" when no rank was set for the device.
std::string where(int device);
// Throws spmd::Error "<call> failed on <where(device)>: <CUDA's string> (<error name>)".
[[noreturn]] void throw_error(cudaError_t error, const char* call, int device);
inline void check(cudaError_t error, const char* call, int device) {
  if (error != cudaSuccess) throw_error(error, call, device);
}

// Makes `device` the calling thread's current device (cudaSetDevice when it is not already).
void set_device(int device);
// The device's stream (created on first use).
cudaStream_t stream(int device);
// Blocks until the device's stream has finished its work; throws like check().
void synchronize(int device);

// The caching allocator's bytes handed out / kept for reuse on `device`.
std::size_t allocated_bytes(int device);
std::size_t cached_bytes(int device);
// Frees the cached blocks of `device` (after synchronizing its stream).
void release_cached(int device);

}  // namespace gpu
}  // namespace spmd
