// spmd/spmd.h: the umbrella header of spmdsim. One include brings in the whole user API.
//
//   #include <spmd/spmd.h>
//   using namespace spmd;
//
//   void train(World& world) {
//     DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
//     DTensor w = distribute_tensor(randn({16, 32}, 0), mesh, {Replicate{}, Shard{1}});
//     DTensor x = distribute_tensor(randn({8, 16}, 1), mesh, {Shard{0}, Replicate{}});
//     DTensor y = matmul(x, w);                 // sharding propagation picks the plan
//     Tensor full = y.full_tensor();            // same on every rank
//   }
//   int main(int argc, char** argv) { return launch(argc, argv, train); }
//
// The same program runs under --spmd-backend=sim (default, every rank in this process),
// threads, mpi and nccl. See docs/ for the guide.
#pragma once

#include <spmd/config.h>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/collectives/typed.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>
#include <spmd/debug/checks.h>
#include <spmd/debug/dry_run.h>
#include <spmd/debug/trace_diff.h>
#include <spmd/debug/trace_file.h>
#include <spmd/debug/visualize.h>
#include <spmd/dtensor/dispatch.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/hooks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/random.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/dtensor/spec.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/mesh/layout.h>
#include <spmd/nn/checkpoint.h>
#include <spmd/nn/context_parallel.h>
#include <spmd/nn/grad_scaler.h>
#include <spmd/nn/loss.h>
#include <spmd/nn/moe.h>
#include <spmd/nn/optim.h>
#include <spmd/nn/parallel.h>
#include <spmd/nn/recompute.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/placement.h>
#include <spmd/ops/strategy.h>
#include <spmd/pipeline/runner.h>
#include <spmd/pipeline/schedule.h>
#include <spmd/pipeline/timeline.h>
#include <spmd/runtime/digest.h>
#include <spmd/runtime/launch.h>
#include <spmd/runtime/options.h>
#include <spmd/tensor/compare.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/meta.h>
#include <spmd/tensor/random.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/backend_driver.h>
#include <spmd/world/launcher.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/local_tensor.h>
#include <spmd/world/per_rank.h>
#include <spmd/world/spmd_types.h>
#include <spmd/world/topology.h>
#include <spmd/world/world.h>
