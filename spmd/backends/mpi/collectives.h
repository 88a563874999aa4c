// spmd/backends/mpi/collectives.h: the mpi backend's collectives: one run() per collective in
// collectives.cpp, the MPI calls of its collective, reached by run_collective's visit.
#pragma once

#include <spmd/backends/mpi/call.h>
#include <spmd/collectives/backend.h>

namespace spmd::mpi {

// Runs the collective `options` names for `c` (prepared, its signatures exchanged) and returns its
// completed Work.
WorkPtr run_collective(const Call& c, const LocalTensor& x, const CollectiveOptions& options);

}  // namespace spmd::mpi
