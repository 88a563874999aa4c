// spmd/tensor/host_device.h: SPMD_HD, the mark of a function that runs on the host and the GPU.
//
// Under nvcc a function marked SPMD_HD compiles for both (__host__ __device__, inlined); in a
// plain C++ build it is an inline function. The element math that the CPU and CUDA kernels share
// carries it: tensor/element_ops.h (every elementwise op) and tensor/half.h (the 16-bit floats'
// conversions). Free of other includes, so nvcc compiles the headers that use it alone.
#pragma once

#if defined(__CUDACC__)
#define SPMD_HD __host__ __device__ __forceinline__
#else
#define SPMD_HD inline
#endif
