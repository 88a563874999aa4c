// spmd/backends/mpi/call.h: one collective call of the mpi backend: its checks and buffers, and
// the signature exchange that comes before its MPI calls.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include <spmd/backends/mpi/backend.h>
#include <spmd/collectives/backend.h>
#include <spmd/collectives/validate.h>
#include <spmd/tensor/tensor.h>

namespace spmd::mpi {

// One collective call of this process, prepared by prepare_call.
struct Call {
  MpiCommunicator* comm;
  CollectiveCall what;
  Tensor input;  // this rank's input, contiguous
  MPI_Datatype type;
  int n;                           // group size
  int index;                       // this rank's group rank
  int rank;                        // this process's rank
  uint64_t sequence;               // this call's number on the communicator (0 for point-to-point)
  const CallSite* site = nullptr;  // the caller's, alive for the call

  std::string describe() const { return describe_call(what); }
  auto context() const {
    return [this] { return describe(); };
  }
  MPI_Comm comm_handle() const { return comm->comm(); }
};

// The call's checks and buffers; nothing is exchanged yet.
Call prepare_call(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                  const CallSite& site, int rank);

// Note [Signature exchange]
// Before its MPI call, every member allgathers a CollectiveFingerprint of what it is about to do
// (Note [Collective fingerprint] in collectives/fingerprint.h). A member whose call differs would
// otherwise make MPI hang, truncate or silently misread buffers; with the fingerprints every member
// finds the same difference and throws the same error.
//
// `fingerprint`: also compare sequence numbers and report call sites (--spmd-debug=fingerprint).
void exchange_signatures(const Call& call, const CollectiveOptions& options, const CallSite& site,
                         bool fingerprint);

}  // namespace spmd::mpi
