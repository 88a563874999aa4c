// spmd/backends/nccl/bootstrap.h: what an nccl world needs before its first communicator: GPUs,
// devices per rank, the unique id, and the environment for several ranks on one GPU.
//
// Note [NCCL bootstrap]
// make_nccl_world (runtime/launch.cpp) does, in this order:
//   1. The launcher's rank and size (spmdrun, mpirun, srun; none: one process). A process holds
//      K consecutive ranks (--spmd-gpus-per-process=K, default 1), one GPU each: world size is
//      processes * K.
//   2. The GPUs: probe_cuda_devices() (tensor/cuda/device.h). Any cudaGetDeviceCount error or no
//      device ends the launch with Unsupported naming that error, before NCCL is touched.
//   3. Devices per held rank (rank_devices) and, when several ranks share a GPU
//      (SPMD_NCCL_SHARE_GPU=1, for tests), the NCCL environment that permits it
//      (shared_gpu_env), set before the first NCCL call of the process: NCCL reads it once.
//   4. The unique id (choose_unique_id_source, then obtain_unique_id), from the first that
//      applies: SPMD_NCCL_UNIQUE_ID (spmdrun's hex, backends/nccl/unique_id.h); NCCL_COMM_ID
//      (every process calls ncclGetUniqueId itself and gets the same id; rank 0 listens at that
//      address during init); MPI_Bcast from rank 0 (under mpirun, in builds with the MPI backend);
//      ncclGetUniqueId in this process (a single process). More than one process with none of
//      these is a ConfigError.
//   5. NcclBackend (backends/nccl/backend.h): the world communicator of each held rank.
#pragma once

#include <nccl.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

// ---- NCCL versions ---------------------------------------------------------------------------

// ncclGetVersion of the NCCL library this process runs with (which may differ from the headers
// the build used): e.g. 22809 for 2.28.9.
int nccl_runtime_version();
// "2.28.9" for 22809 (codes of NCCL >= 2.9) and "2.8.4" for 2804 (the older encoding).
std::string nccl_version_string(int code);
// Whether all_to_all, gather and scatter use NCCL's own ncclAlltoAll/ncclGather/ncclScatter (new
// in 2.28.3): only when the build's nccl.h declares them and the library at run time has them.
// `force_p2p` (SPMD_NCCL_P2P_COLLECTIVES=1) composes them from grouped send/recv instead.
bool use_native_alltoall_gather_scatter(int runtime_version, bool force_p2p);

// ---- NCCL_COMM_ID ----------------------------------------------------------------------------

struct CommIdAddress {
  std::string host;  // an IPv4 address, an IPv6 address (without brackets) or a host name
  int port = 0;
};
// NCCL's forms "<ipv4>:<port>", "[<ipv6>]:<port>" and "<hostname>:<port>"; nullopt for anything
// else (no port, a port outside 1..65535, an empty host, an unbracketed IPv6 address).
std::optional<CommIdAddress> parse_nccl_comm_id(std::string_view text);

// ---- the unique id ---------------------------------------------------------------------------

enum class UniqueIdSource { Launcher, CommId, MpiBroadcast, Local };
// "SPMD_NCCL_UNIQUE_ID", "NCCL_COMM_ID", "MPI_Bcast", "ncclGetUniqueId".
std::string_view unique_id_source_name(UniqueIdSource source);

// Step 4 of Note [NCCL bootstrap] as a decision: `launcher` is the launcher's name ("spmdrun",
// "mpirun", "srun" or "" for none), `processes` the number of processes. ConfigError when more
// than one process has no way to agree on an id, or NCCL_COMM_ID is malformed.
UniqueIdSource choose_unique_id_source(const std::optional<std::string>& launcher_id_hex,
                                       const std::optional<std::string>& nccl_comm_id,
                                       std::string_view launcher, int processes, bool mpi_built);

// The id from `source`. Launcher: decodes SPMD_NCCL_UNIQUE_ID (ConfigError when it is not 256 hex
// digits). MpiBroadcast: initializes MPI and broadcasts rank 0's id. CommError naming the NCCL or
// MPI call when one fails.
ncclUniqueId obtain_unique_id(UniqueIdSource source, int process_rank);

// ---- devices ---------------------------------------------------------------------------------

// The CUDA device of each of the `per_process` ranks of a process that is `local_rank` of
// `local_size` processes on its host (local_size 0: unknown) with `device_count` GPUs: device
// (local_rank * per_process + i) mod device_count. ConfigError when the host's ranks need more
// GPUs than it has and `share_gpu` is false, or when one process would drive one GPU twice.
std::vector<int> rank_devices(int local_rank, int local_size, int per_process, int device_count,
                              bool share_gpu);

// Note [Several ranks on one GPU]
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"). For tests on a one-GPU machine,
// SPMD_NCCL_SHARE_GPU=1 makes each process apply, before its first NCCL call: with NCCL >= 2.30.3
// NCCL_MULTI_RANK_GPU_ENABLE=1 (the supported switch); older, a distinct NCCL_HOSTID per process
// so every rank counts as its own host, with NCCL_SOCKET_IFNAME=lo, NCCL_NET=Socket,
// NCCL_IB_DISABLE=1, NCCL_NVLS_ENABLE=0 and NCCL_MNNVL_ENABLE=0 (all traffic over loopback TCP;
// ../shared/notes/backends_nccl_mpi.md §3). Ranks on one GPU run time-sliced: correctness only.
// The variables to set, as "NAME=value", for NCCL `version` and process `process_rank`.
std::vector<std::string> shared_gpu_env(int version, int process_rank);
// Sets shared_gpu_env's variables that the environment does not already set; returns those set.
std::vector<std::string> apply_shared_gpu_env(int version, int process_rank);

}  // namespace spmd
