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

// Runs `command` as run_command does, in a process group of its own; once its output holds
// `marker` `count` times, waits `delay_s` and sends `signal` to the group (the shell and what it
// started). After `limit_s` the group is killed (SIGKILL) and the output ends with
// "[run_command_signalled: killed after the limit]".
CommandResult run_command_signalled(const std::string& command, const std::string& marker,
                                    int count, int signal, double delay_s, double limit_s = 60.0);

// Whether process `pid` still exists (a zombie counts as gone).
bool process_alive(int pid);

// Whether `text` contains `part` (the tests' check of a program's output).
bool contains(const std::string& text, const std::string& part);

// An empty folder TempDir()/name, removed first if it exists.
std::string fresh_temp_dir(const std::string& name);

// The OpenMPI environment of the mpi tests (notes §5), as "VAR=value ..." for a command prefix.
std::string mpi_env_prefix();
// Runs `mpiexec -n n program args` with that environment and `env` ("VAR=value ...") before it.
CommandResult run_mpirun(const std::string& mpiexec, int n, const std::string& program,
                         const std::string& args, const std::string& env = "");

}  // namespace spmd::testing
