// spmd/backends/mpi/driver.cpp: the mpi backend's driver (Note [Backend drivers] in
// world/backend_driver.h): one process per rank, started by mpirun or srun.
#include <memory>

#include <spmd/backends/mpi/backend.h>
#include <spmd/core/error.h>
#include <spmd/world/backend_driver.h>

namespace spmd {
namespace {

class MpiSession final : public BackendSession {
 public:
  // Note [Exit notices]: the peers still waiting for this rank learn that it returned.
  void finish() override { mpi_finish_program("returned from the program"); }
  std::string describe_state() override { return mpi_activity(); }
};

std::vector<World> start_mpi(const WorldRequest& request) {
  const std::optional<LauncherInfo>& launcher = request.launcher;
  if (!launcher) {
    throw_error<ConfigError>("--spmd-backend=mpi needs a launcher: run it with mpirun -n N ...");
  }
  if (launcher->name == "spmdrun") {
    throw_error<ConfigError>(
        "--spmd-backend=mpi cannot run under spmdrun, whose processes share no MPI job: run it "
        "with mpirun -n N ... (or srun)");
  }
  // The world size is the launcher's, which --spmd-world-size may only repeat.
  if (request.world_size && *request.world_size != launcher->size) {
    throw_error<ConfigError>("{} disagrees with the launcher: {} started {} processes ({}={})",
                             request.world_size_source, launcher->name, launcher->size,
                             launcher->size_variable, launcher->size);
  }
  share_cores(*launcher);
  mpi_initialize();
  if (mpi_world_size() != launcher->size || mpi_world_rank() != launcher->rank) {
    throw_error<ConfigError>(
        "--spmd-backend=mpi: MPI_COMM_WORLD has this process as rank {} of {}, but {} said rank "
        "{} of {} (was the program started by a different MPI's launcher?)",
        mpi_world_rank(), mpi_world_size(), launcher->name, launcher->rank, launcher->size);
  }
  auto state = std::make_shared<WorldState>();
  state->size = mpi_world_size();
  state->held_ranks = {mpi_world_rank()};
  state->coordinator = mpi_world_rank() == 0;
  state->backend_name = "mpi";
  state->backend = std::make_shared<MpiBackend>(request.debug.fingerprint, request.timeout_s);
  state->session = std::make_shared<MpiSession>();
  state->debug = request.debug;
  return {World(std::move(state))};
}

BackendDriver mpi_driver() {
  BackendDriver d;
  d.name = "mpi";
  d.debug_all = DebugOptions{
      .check = true, .replicate = true, .fingerprint = true, .nan = true, .types = true};
  d.flight_recorder = true;
  d.start = start_mpi;
  d.abort_job = mpi_abort;
  return d;
}

}  // namespace
}  // namespace spmd

SPMD_REGISTER_BACKEND_DRIVER(mpi, spmd::mpi_driver)
