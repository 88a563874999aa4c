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

#include "spmd/config.h"

#include "collectives/cost_model.h"
#include "collectives/functional.h"
#include "collectives/trace.h"
#include "core/check.h"
#include "core/error.h"
#include "core/parallel.h"
#include "debug/checks.h"
#include "debug/trace_diff.h"
#include "debug/trace_file.h"
#include "debug/visualize.h"
#include "dtensor/dispatch.h"
#include "dtensor/dtensor.h"
#include "dtensor/hooks.h"
#include "dtensor/ops.h"
#include "dtensor/placement.h"
#include "dtensor/random.h"
#include "dtensor/redistribute.h"
#include "dtensor/spec.h"
#include "mesh/device_mesh.h"
#include "mesh/layout.h"
#include "runtime/digest.h"
#include "runtime/launch.h"
#include "runtime/options.h"
#include "sim/local_ops.h"
#include "sim/local_tensor.h"
#include "sim/per_rank.h"
#include "sim/world.h"
#include "tensor/device_ops.h"
#include "tensor/dtype.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
