// spmd/backends/nccl/driver.cpp: the nccl backend's driver (Note [Backend drivers] in
// world/backend_driver.h): this process's ranks, one GPU each. Note [NCCL bootstrap]
// (backends/nccl/bootstrap.h) lists the steps of start_nccl, in this order.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <spmd/backends/nccl/backend.h>
#include <spmd/backends/nccl/bootstrap.h>
#include <spmd/backends/nccl/unique_id.h>
#include <spmd/config.h>
#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/tensor/cuda/device.h>
#include <spmd/world/backend_driver.h>

#if SPMD_HAVE_MPI
#include <spmd/backends/mpi/state.h>
#endif

namespace spmd {
namespace {

// Note [NCCL device placement]: a rank's tensors live on its GPU.
constexpr const char* kDeviceType = "cuda";

class NcclSession final : public BackendSession {
 public:
  explicit NcclSession(std::shared_ptr<NcclBackend> backend) : backend_(std::move(backend)) {}
  void finish() override {
    backend_->shutdown();
#if SPMD_HAVE_MPI
    // MPI was initialized when mpirun started the job (the unique id's MPI_Bcast).
    mpi_finalize();
#endif
  }

 private:
  std::shared_ptr<NcclBackend> backend_;
};

std::vector<World> start_nccl(const WorldRequest& request) {
  const std::optional<LauncherInfo>& launcher = request.launcher;
  const int processes = launcher ? launcher->size : 1;
  const int process_rank = launcher ? launcher->rank : 0;
  const int per_process = request.gpus_per_process;
  const int world_size = processes * per_process;
  // SPMD_WORLD_SIZE set by spmdrun counts processes; any other world size must be the ranks'.
  const bool launchers_count = launcher && request.world_size == launcher->size &&
                               request.world_size_source.starts_with(launcher->size_variable);
  if (request.world_size && *request.world_size != world_size && !launchers_count) {
    throw_error<ConfigError>(
        "{} disagrees with the launch: {} process(es) ({}) with {} GPU(s) each make {} ranks",
        request.world_size_source, processes, launcher ? launcher->name : "no launcher",
        per_process, world_size);
  }
  if (launcher) share_cores(*launcher);

  const CudaDevices gpus = probe_cuda_devices();
  if (gpus.count == 0) {
    throw_error<Unsupported>("--spmd-backend=nccl needs a CUDA GPU, and process {} has none: {}",
                             process_rank, gpus.error);
  }
  const bool share_gpu = env_value("SPMD_NCCL_SHARE_GPU").value_or("0") == "1";
  const std::vector<int> devices =
      rank_devices(launcher ? launcher->local_rank : 0, launcher ? launcher->local_size : 1,
                   per_process, gpus.count, share_gpu);
  const int version = nccl_runtime_version();
  if (share_gpu) apply_shared_gpu_env(version, process_rank);

  const UniqueIdSource source = choose_unique_id_source(
      env_value(kUniqueIdVariable), env_value("NCCL_COMM_ID"),
      launcher ? std::string_view(launcher->name) : std::string_view(), processes, SPMD_HAVE_MPI);
  NcclConfig config;
  config.id = obtain_unique_id(source, process_rank);
#if SPMD_HAVE_MPI
  if (source == UniqueIdSource::MpiBroadcast &&
      (mpi_world_size() != processes || mpi_world_rank() != process_rank)) {
    throw_error<ConfigError>(
        "--spmd-backend=nccl: MPI_COMM_WORLD has this process as rank {} of {}, but {} said rank "
        "{} of {}",
        mpi_world_rank(), mpi_world_size(), launcher->name, process_rank, processes);
  }
#endif
  config.world_size = world_size;
  for (int i = 0; i < per_process; ++i) config.ranks.push_back(process_rank * per_process + i);
  config.devices = devices;
  config.timeout_s = request.timeout_s;
  config.fingerprint = request.debug.fingerprint;
  config.native_alltoall_gather_scatter = use_native_alltoall_gather_scatter(
      version, env_value("SPMD_NCCL_P2P_COLLECTIVES").value_or("0") == "1");

  auto backend = std::make_shared<NcclBackend>(config);
  auto state = std::make_shared<WorldState>();
  state->size = world_size;
  state->held_ranks = config.ranks;
  for (int device : devices) state->devices.push_back(cuda(device));
  state->coordinator = process_rank == 0;
  state->backend_name = "nccl";
  state->device_type = kDeviceType;
  state->backend = backend;
  state->session = std::make_shared<NcclSession>(backend);
  state->debug = request.debug;
  return {World(std::move(state))};
}

std::optional<std::string> nccl_unavailable() {
  const CudaDevices gpus = probe_cuda_devices();
  if (gpus.count > 0) return std::nullopt;
  return "no usable GPU for the nccl backend: " + gpus.error;
}

void abort_nccl_job(int code) {
  // Peers blocked in a collective with this process see aborted communicators, not silence.
  if (!nccl_abort_communicators()) return;
#if SPMD_HAVE_MPI
  mpi_abort(code);
#endif
  // NCCL's threads and communicators are in no state for an orderly exit: end here, so the
  // launcher sees the code and stops the other ranks.
  std::fflush(nullptr);
  std::_Exit(code);
}

BackendDriver nccl_driver() {
  BackendDriver d;
  d.name = "nccl";
  d.debug_all = DebugOptions{.fingerprint = true, .nan = true, .types = true};
  d.device_type = kDeviceType;
  d.flight_recorder = true;
  d.start = start_nccl;
  d.unavailable = nccl_unavailable;
  d.abort_job = abort_nccl_job;
  return d;
}

}  // namespace
}  // namespace spmd

SPMD_REGISTER_BACKEND_DRIVER(nccl, spmd::nccl_driver)
