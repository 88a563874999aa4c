// spmd/tensor/cuda/cuda_ops.h: the CUDA DeviceOps (internal to tensor/cuda; install_cuda()
// registers them).
#pragma once

#include <spmd/tensor/device_ops.h>

namespace spmd::gpu {

// The kernels of every tensor op on CUDA tensors (tensor/cuda/cuda_ops.cpp).
DeviceOps& device_ops();

}  // namespace spmd::gpu
