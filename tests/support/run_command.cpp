// tests/support/run_command.cpp: child processes for tests.
#include "tests/support/run_command.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

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

CommandResult run_command_signalled(const std::string& command, const std::string& marker,
                                    int count, int signal, double delay_s, double limit_s) {
  using Clock = std::chrono::steady_clock;
  CommandResult result;
  int fds[2];
  if (pipe(fds) != 0) return result;
  const std::string line = "exec 2>&1; " + command;
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) return result;
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  auto seen = [&] {
    int n = 0;
    for (size_t at = result.output.find(marker); at != std::string::npos;
         at = result.output.find(marker, at + 1)) {
      ++n;
    }
    return n >= count;
  };
  Clock::time_point signal_at{};
  bool signalled = false;
  for (;;) {
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - start).count() > limit_s) {
      kill(-pid, SIGKILL);
      result.output += "\n[run_command_signalled: killed after the limit]";
      break;
    }
    if (!signalled && signal_at == Clock::time_point{} && seen()) {
      signal_at =
          now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s));
    }
    if (!signalled && signal_at != Clock::time_point{} && now >= signal_at) {
      kill(-pid, signal);
      signalled = true;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

bool process_alive(int pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close_paren = text.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= text.size() ||
         text[close_paren + 2] != 'Z';
}

std::string mpi_env_prefix() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader MPIEXEC_TIMEOUT=60 ";
}

CommandResult run_mpirun(const std::string& mpiexec, int n, const std::string& program,
                         const std::string& args, const std::string& env) {
  return run_command(mpi_env_prefix() + env + " " + mpiexec + " -n " + std::to_string(n) + " " +
                     program + " " + args);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string fresh_temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace spmd::testing
