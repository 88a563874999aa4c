// spmd/backends/nccl/exit_notice.h: what the peers learn when this process ends; the nccl
// counterpart of backends/mpi/exit_notice.h.
//
// nccl sends no notice when a program returns: NcclBackend::shutdown finalizes the communicators
// and tells nobody, so a peer still waiting for this rank in a collective is ended by its own
// watchdog at the timeout (Note [NCCL watchdog]). A process that fails aborts every communicator
// instead (the driver's abort_job), and the peers blocked in a collective with it get an NCCL
// error at once rather than waiting.
#pragma once

namespace spmd {

// When an nccl backend is alive in this process: prints its last collectives and aborts every
// communicator (ncclCommAbort, waiting at most a few seconds), so peers blocked in a collective
// with this process see an error instead of waiting. Returns true when there was one. Used by
// abort_job() after a failure; the process must exit afterwards.
bool nccl_abort_communicators();

}  // namespace spmd
