// spmd/backends/nccl/bootstrap.cpp: NCCL versions, NCCL_COMM_ID, the unique id, devices per rank
// and the shared-GPU environment (Note [NCCL bootstrap]).
#include <spmd/backends/nccl/bootstrap.h>

#include <cstdlib>

#include <fmt/format.h>

#include <spmd/backends/nccl/unique_id.h>
#include <spmd/config.h>
#include <spmd/core/env.h>
#include <spmd/core/error.h>

#if SPMD_HAVE_MPI
#include <spmd/backends/mpi/state.h>
#endif

namespace spmd {

int nccl_runtime_version() {
  int version = 0;
  const ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    throw_error<CommError>("ncclGetVersion failed: {}", ncclGetErrorString(result));
  }
  return version;
}

std::string nccl_version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
}

bool use_native_alltoall_gather_scatter(int runtime_version, bool force_p2p) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
  return !force_p2p && runtime_version >= NCCL_VERSION(2, 28, 3);
#else
  (void)runtime_version;
  (void)force_p2p;
  return false;
#endif
}

std::optional<CommIdAddress> parse_nccl_comm_id(std::string_view text) {
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return std::nullopt;  // IPv6 needs brackets
  }
  if (host.empty() || port.empty() || port.size() > 5) return std::nullopt;
  for (char c : host) {
    if (c == ' ' || c == '\t' || c == '[' || c == ']') return std::nullopt;
  }
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 65535) return std::nullopt;
  return CommIdAddress{std::string(host), value};
}

std::string_view unique_id_source_name(UniqueIdSource source) {
  switch (source) {
    case UniqueIdSource::Launcher:
      return kUniqueIdVariable;
    case UniqueIdSource::CommId:
      return "NCCL_COMM_ID";
    case UniqueIdSource::MpiBroadcast:
      return "MPI_Bcast";
    case UniqueIdSource::Local:
      return "ncclGetUniqueId";
  }
  return "?";
}

UniqueIdSource choose_unique_id_source(const std::optional<std::string>& launcher_id_hex,
                                       const std::optional<std::string>& nccl_comm_id,
                                       std::string_view launcher, int processes, bool mpi_built) {
  if (launcher_id_hex) return UniqueIdSource::Launcher;
  if (nccl_comm_id) {
    if (!parse_nccl_comm_id(*nccl_comm_id)) {
      throw_error<ConfigError>(
          "NCCL_COMM_ID='{}' is not <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>",
          *nccl_comm_id);
    }
    return UniqueIdSource::CommId;
  }
  if ((launcher == "mpirun" || launcher == "srun") && mpi_built) {
    return UniqueIdSource::MpiBroadcast;
  }
  if (processes == 1) return UniqueIdSource::Local;
  throw_error<ConfigError>(
      "--spmd-backend=nccl: {} processes started by {} have no way to share NCCL's unique id: "
      "start them with spmdrun (which passes {}), set NCCL_COMM_ID=<rank 0's host>:<free port> "
      "in every process, or use mpirun with a build that has the MPI backend",
      processes, launcher.empty() ? std::string_view("hand") : launcher, kUniqueIdVariable);
}

ncclUniqueId obtain_unique_id(UniqueIdSource source, int process_rank) {
  ncclUniqueId id{};
  auto get_local = [&] {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw_error<CommError>("ncclGetUniqueId failed on process {}: {} ({})", process_rank,
                             ncclGetErrorString(result), ncclGetLastError(nullptr));
    }
  };
  switch (source) {
    case UniqueIdSource::Launcher: {
      const std::string text = env_value(kUniqueIdVariable).value_or("");
      const std::optional<ncclUniqueId> parsed = unique_id_from_hex(text);
      if (!parsed) {
        throw_error<ConfigError>("{} must be {} hex digits (spmdrun writes it), got {} characters",
                                 kUniqueIdVariable, 2 * NCCL_UNIQUE_ID_BYTES, text.size());
      }
      return *parsed;
    }
    case UniqueIdSource::CommId:
    case UniqueIdSource::Local:
      get_local();
      return id;
    case UniqueIdSource::MpiBroadcast: {
#if SPMD_HAVE_MPI
      mpi_initialize();
      if (mpi_world_rank() == 0) get_local();
      const int code = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
      if (code != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        throw_error<CommError>("MPI_Bcast of the NCCL unique id failed on rank {}: {}",
                               mpi_world_rank(), std::string(text, static_cast<size_t>(length)));
      }
      return id;
#else
      throw_error<Unsupported>(
          "MPI_Bcast of the NCCL unique id needs a build with the MPI backend");
#endif
    }
  }
  return id;
}

std::vector<int> rank_devices(int local_rank, int local_size, int per_process, int device_count,
                              bool share_gpu) {
  if (device_count < 1 || per_process < 1) {
    throw_error<InternalError>("rank_devices: {} devices, {} per process", device_count,
                               per_process);
  }
  if (per_process > device_count) {
    throw_error<ConfigError>(
        "--spmd-gpus-per-process={} but this process sees {} GPU(s); one process cannot drive one "
        "GPU twice (NCCL allows one rank per GPU per process)",
        per_process, device_count);
  }
  const int needed = local_size * per_process;
  if (!share_gpu && needed > device_count) {
    throw_error<ConfigError>(
        "--spmd-backend=nccl: {} ranks on this host need {} GPUs, but it has {} (NCCL runs one "
        "rank "
        "per GPU); start fewer ranks, or set SPMD_NCCL_SHARE_GPU=1 to run several ranks on one "
        "GPU (for tests: ranks then take turns on the GPU)",
        needed, needed, device_count);
  }
  std::vector<int> devices;
  for (int i = 0; i < per_process; ++i) {
    devices.push_back((local_rank * per_process + i) % device_count);
  }
  return devices;
}

std::vector<std::string> shared_gpu_env(int version, int process_rank) {
  if (version >= NCCL_VERSION(2, 30, 3)) return {"NCCL_MULTI_RANK_GPU_ENABLE=1"};
  return {fmt::format("NCCL_HOSTID=spmdsim-process{}", process_rank),
          "NCCL_SOCKET_IFNAME=lo",
          "NCCL_NET=Socket",
          "NCCL_IB_DISABLE=1",
          "NCCL_NVLS_ENABLE=0",
          "NCCL_MNNVL_ENABLE=0"};
}

std::vector<std::string> apply_shared_gpu_env(int version, int process_rank) {
  std::vector<std::string> applied;
  for (const std::string& entry : shared_gpu_env(version, process_rank)) {
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (env_value(name.c_str())) continue;
    setenv(name.c_str(), entry.substr(eq + 1).c_str(), 1);
    applied.push_back(entry);
  }
  return applied;
}

}  // namespace spmd
