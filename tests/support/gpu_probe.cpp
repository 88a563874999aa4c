// tests/support/gpu_probe.cpp: gpu_probe, which says whether this machine can run the GPU tests.
//
// Prints the GPUs, the CUDA driver and runtime versions and NCCL's version, and exits 0; or
// prints "no usable GPU: <cudaGetDeviceCount's error>" and exits 77 (CTest's skip code), the
// check every gpu-labelled test and scripts/gpu-check make first.
#include <cuda_runtime_api.h>

#include <cstdio>

#include <spmd/backends/nccl/bootstrap.h>
#include <spmd/tensor/cuda/device.h>

int main() {
  const spmd::CudaDevices gpus = spmd::probe_cuda_devices();
  const int nccl = spmd::nccl_runtime_version();
  if (gpus.count == 0) {
    std::printf("no usable GPU: %s (NCCL %s)\n", gpus.error.c_str(),
                spmd::nccl_version_string(nccl).c_str());
    return 77;
  }
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("gpus: %d, CUDA driver %d, runtime %d, NCCL %s (headers %s)\n", gpus.count, driver,
              runtime, spmd::nccl_version_string(nccl).c_str(),
              spmd::nccl_version_string(NCCL_VERSION_CODE).c_str());
  for (int i = 0; i < gpus.count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    std::printf("  cuda:%d %s, compute capability %d.%d, %.1f GiB\n", i, prop.name, prop.major,
                prop.minor, static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  }
  return 0;
}
