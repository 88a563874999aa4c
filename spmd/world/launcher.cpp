// spmd/world/launcher.cpp: launcher detection from the environment.
#include <spmd/world/launcher.h>

#include <algorithm>
#include <charconv>
#include <thread>

#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>

namespace spmd {
namespace {

int env_int(const char* name, int fallback) {
  const auto value = env_value(name);
  if (!value) return fallback;
  int n = 0;
  const auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
  if (ec != std::errc() || end != value->data() + value->size()) {
    throw_error<ConfigError>("{}='{}' is not an integer", name, *value);
  }
  return n;
}

// `text` with every character but letters, digits, '.', '_' and '-' replaced by '_' (a job id
// becomes part of a file name).
std::string file_name_safe(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

// LauncherInfo::job_id for launcher `name`.
std::string job_id_of(std::string_view name) {
  if (name == "mpirun") {
    if (auto id = env_value("OMPI_MCA_ess_base_jobid")) return file_name_safe("ompi" + *id);
    if (auto id = env_value("PMIX_NAMESPACE")) return file_name_safe("pmix" + *id);
  } else if (name == "srun") {
    if (auto id = env_value("SLURM_JOB_ID")) {
      const auto step = env_value("SLURM_STEP_ID");
      return file_name_safe("slurm" + *id + (step ? "." + *step : ""));
    }
  } else if (auto id = env_value("SPMD_JOB_ID")) {
    return file_name_safe(*id);
  }
  return "";
}

}  // namespace

std::optional<LauncherInfo> detect_launcher() {
  struct Source {
    const char* name;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static constexpr Source kSources[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
      {"spmdrun", "SPMD_RANK", "SPMD_WORLD_SIZE", "SPMD_LOCAL_RANK", "SPMD_LOCAL_WORLD_SIZE"},
  };
  for (const Source& s : kSources) {
    if (!env_value(s.rank) || !env_value(s.size)) continue;
    LauncherInfo info;
    info.name = s.name;
    info.rank = env_int(s.rank, 0);
    info.size = env_int(s.size, 0);
    info.local_rank = env_int(s.local_rank, 0);
    info.local_size = s.local_size ? env_int(s.local_size, 0) : 0;
    info.size_variable = s.size;
    info.job_id = job_id_of(s.name);
    if (info.size < 1 || info.rank < 0 || info.rank >= info.size) {
      throw_error<ConfigError>("{}: {}={} and {}={} do not describe a rank of the job", s.name,
                               s.rank, info.rank, s.size, info.size);
    }
    return info;
  }
  return std::nullopt;
}

void share_cores(const LauncherInfo& launcher) {
  if (env_value("SPMD_NUM_THREADS") || launcher.local_size < 1) return;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_num_threads(std::max(1, cores / launcher.local_size));
}

}  // namespace spmd
