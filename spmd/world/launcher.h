// spmd/world/launcher.h: which process launcher (mpirun, srun, spmdrun) started this process, read
// from its environment. Backend drivers (world/backend_driver.h) decide from it how many processes
// the job has and which rank this one is.
//
//   if (auto l = detect_launcher()) fmt::print("{} rank {} of {}\n", l->name, l->rank, l->size);
#pragma once

#include <optional>
#include <string>

namespace spmd {

// The process launcher that started this process, from its environment.
struct LauncherInfo {
  std::string name;           // "mpirun", "srun" or "spmdrun"
  int rank = 0;               // this process's rank in the job
  int size = 0;               // processes in the job
  int local_rank = 0;         // rank among the processes on this host
  int local_size = 0;         // processes on this host; 0 when the launcher does not say
  std::string size_variable;  // the variable the size came from, e.g. "OMPI_COMM_WORLD_SIZE"
  // The job's id, the same in every process of the job and different for another job running
  // beside it: "ompi503119873" (OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE), "slurm123.0"
  // (SLURM_JOB_ID.SLURM_STEP_ID), spmdrun's SPMD_JOB_ID; only letters, digits, '.', '_' and '-'.
  // Empty when the launcher's environment gives none.
  std::string job_id;
};

// mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID) or spmdrun (SPMD_RANK, SPMD_WORLD_SIZE, SPMD_LOCAL_RANK, SPMD_LOCAL_WORLD_SIZE),
// checked in that order; nullopt when none is set. ConfigError when a variable is not a number or
// the rank is outside 0..size-1.
std::optional<LauncherInfo> detect_launcher();

// Gives this process's thread pool (core/parallel.h) its share of the host's cores, the cores
// divided by launcher.local_size, unless SPMD_NUM_THREADS says otherwise or the launcher does not
// say how many processes share the host. For backends that run one process per rank.
void share_cores(const LauncherInfo& launcher);

}  // namespace spmd
