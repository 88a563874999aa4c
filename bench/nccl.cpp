// bench/nccl.cpp: nccl_bench, the nccl backend at world size 1 on one GPU.
//
// Two tables, for nccl-tests-style sizes (bytes per rank):
//   overhead   time per call of the spmd collective (functional API, signature exchange, result
//              allocation, the host waits) next to the bare NCCL call on a blocking communicator
//              with a stream synchronize, both awaited each call; their difference is the host
//              overhead spmdsim adds. Best of 5 runs of `iters` calls each.
//   bandwidth  algbw = S / t and busbw = algbw * factor in nccl-tests conventions
//              (../shared/notes/backends_nccl_mpi.md §4): S = the per-rank buffer for
//              all_reduce, broadcast and reduce, the whole output for all_gather, the whole
//              input for reduce_scatter (all the per-rank size with one rank); t = `iters`
//              back-to-back calls then one synchronize, divided by iters. With one rank the
//              factors 2(n-1)/n and (n-1)/n are 0, so busbw is 0 except for broadcast and reduce
//              (factor 1): the numbers are a device copy's, for the raw NCCL call and for the
//              spmd collective (whose signature exchange waits for the stream every call).
// Several ranks on one GPU run time-sliced and are correctness checks only: no numbers here.
// Without a usable GPU it prints why and exits with 77.
//   build/bench/nccl_bench [--iters N] [--max-bytes B]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <spmd/spmd.h>

#include <spmd/backends/nccl/bootstrap.h>
#include <spmd/tensor/cuda/device.h>

namespace spmd {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    throw_error<CommError>("{} failed: {}", call, ncclGetErrorString(result));
  }
}

// Seconds per call: best over 5 runs of `iters` calls of `call`, each run after `sync`.
double per_call(int iters, const std::function<void()>& call, const std::function<void()>& sync) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    sync();
    const double t0 = now_s();
    for (int i = 0; i < iters; ++i) call();
    sync();
    best = std::min(best, (now_s() - t0) / iters);
  }
  return best;
}

std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

int run(int iters, int64_t max_bytes) {
  const CudaDevices gpus = probe_cuda_devices();
  if (gpus.count == 0) {
    fmt::print("nccl_bench: skipped: no usable GPU: {}\n", gpus.error);
    return 77;
  }
  LaunchOptions options;
  options.backend = "nccl";
  World world = make_world(options);
  DeviceMesh mesh = init_device_mesh(world, {1}, {"x"});
  const int device = world.device_of(0).index;
  cudaStream_t stream = gpu::stream(device);
  auto sync = [&] { gpu::synchronize(device); };

  // The bare NCCL communicator: blocking, so a call returns once enqueued.
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t raw = nullptr;
  gpu::set_device(device);
  check_nccl(ncclCommInitRank(&raw, 1, id, 0), "ncclCommInitRank");

  fmt::print("nccl_bench: world size 1 on cuda:{}, NCCL {}, {} calls per run\n\n", device,
             nccl_version_string(nccl_runtime_version()), iters);
  fmt::print("all_reduce (f32, sum), awaited each call:\n");
  fmt::print("{:>10} {:>12} {:>12} {:>14}\n", "size", "nccl_us", "spmd_us", "overhead_us");
  for (int64_t bytes : {int64_t{8}, int64_t{1024}, int64_t{65536}, int64_t{1} << 20}) {
    const int64_t n = bytes / 4;
    const LocalTensor x = LocalTensor::from_fn(world, [&](int) { return ones({n}); });
    const Tensor out = empty({n}, DType::F32, cuda(device));
    const Tensor& in = x.shard(0);
    const double nccl_s = per_call(
        iters,
        [&] {
          check_nccl(ncclAllReduce(in.data_ptr(), out.data_ptr(), static_cast<size_t>(n),
                                   ncclFloat32, ncclSum, raw, stream),
                     "ncclAllReduce");
          sync();
        },
        sync);
    const double spmd_s = per_call(
        iters,
        [&] {
          all_reduce(x, mesh, "x");
          sync();
        },
        sync);
    fmt::print("{:>10} {:>12.1f} {:>12.1f} {:>14.1f}\n", size_text(bytes), nccl_s * 1e6,
               spmd_s * 1e6, (spmd_s - nccl_s) * 1e6);
  }

  struct Op {
    const char* name;
    double factor;  // busbw / algbw for n = 1
    std::function<void(const LocalTensor&)> spmd;
    std::function<void(const Tensor&, const Tensor&, size_t)> nccl;
  };
  const std::vector<Op> ops = {
      {"all_reduce", 0.0, [&](const LocalTensor& x) { all_reduce(x, mesh, "x"); },
       [&](const Tensor& in, const Tensor& out, size_t n) {
         check_nccl(
             ncclAllReduce(in.data_ptr(), out.data_ptr(), n, ncclFloat32, ncclSum, raw, stream),
             "ncclAllReduce");
       }},
      {"all_gather", 0.0, [&](const LocalTensor& x) { all_gather(x, mesh, "x"); },
       [&](const Tensor& in, const Tensor& out, size_t n) {
         check_nccl(ncclAllGather(in.data_ptr(), out.data_ptr(), n, ncclFloat32, raw, stream),
                    "ncclAllGather");
       }},
      {"reduce_scatter", 0.0, [&](const LocalTensor& x) { reduce_scatter(x, mesh, "x"); },
       [&](const Tensor& in, const Tensor& out, size_t n) {
         check_nccl(
             ncclReduceScatter(in.data_ptr(), out.data_ptr(), n, ncclFloat32, ncclSum, raw, stream),
             "ncclReduceScatter");
       }},
      {"broadcast", 1.0, [&](const LocalTensor& x) { broadcast(x, mesh, "x", 0); },
       [&](const Tensor& in, const Tensor& out, size_t n) {
         check_nccl(ncclBroadcast(in.data_ptr(), out.data_ptr(), n, ncclFloat32, 0, raw, stream),
                    "ncclBroadcast");
       }},
      {"reduce", 1.0, [&](const LocalTensor& x) { reduce(x, mesh, "x", ReduceOp::Sum, 0); },
       [&](const Tensor& in, const Tensor& out, size_t n) {
         check_nccl(
             ncclReduce(in.data_ptr(), out.data_ptr(), n, ncclFloat32, ncclSum, 0, raw, stream),
             "ncclReduce");
       }},
  };
  fmt::print(
      "\nbandwidth (f32; nccl-tests algbw/busbw in GB/s; n = 1: busbw 0 for "
      "all_reduce/all_gather/reduce_scatter):\n");
  fmt::print("{:>14} {:>10} {:>12} {:>12} {:>12} {:>12}\n", "op", "size", "nccl_algbw",
             "nccl_busbw", "spmd_algbw", "spmd_busbw");
  for (const Op& op : ops) {
    for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 32) {
      const int64_t n = bytes / 4;
      const LocalTensor x = LocalTensor::from_fn(world, [&](int) { return ones({n}); });
      const Tensor out = empty({n}, DType::F32, cuda(device));
      const double nccl_s = per_call(
          iters, [&] { op.nccl(x.shard(0), out, static_cast<size_t>(n)); }, sync);
      const double spmd_s = per_call(
          iters, [&] { op.spmd(x); }, sync);
      const double s = static_cast<double>(bytes);
      fmt::print("{:>14} {:>10} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f}\n", op.name,
                 size_text(bytes), s / nccl_s / 1e9, s / nccl_s / 1e9 * op.factor, s / spmd_s / 1e9,
                 s / spmd_s / 1e9 * op.factor);
    }
  }
  check_nccl(ncclCommDestroy(raw), "ncclCommDestroy");
  finish_world(world);
  return 0;
}

}  // namespace
}  // namespace spmd

int main(int argc, char** argv) {
  int iters = 20;
  int64_t max_bytes = int64_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    if (arg == "--max-bytes" && i + 1 < argc) max_bytes = std::atoll(argv[++i]);
  }
  try {
    return spmd::run(iters, max_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bench: %s\n", e.what());
    return 1;
  }
}
