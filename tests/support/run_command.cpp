// tests/support/run_command.cpp: child processes for tests.
#include "tests/support/run_command.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>

namespace spmd::testing {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(("exec 2>&1; " + command).c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

std::string mpi_env_prefix() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader MPIEXEC_TIMEOUT=60 ";
}

}  // namespace spmd::testing
