// tests/support/run_command.h: runs a command line as a child process and returns its exit code
// and output, for tests of programs (launch(), spmdrun, examples).
#pragma once

#include <string>

namespace spmd::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0.0;
};

// Runs `command` through /bin/sh with stderr merged into stdout (for every command of the line).
CommandResult run_command(const std::string& command);

// The OpenMPI environment of the mpi tests (notes §5), as "VAR=value ..." for a command prefix.
std::string mpi_env_prefix();

}  // namespace spmd::testing
