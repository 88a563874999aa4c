// tools/spmdrun/spmdrun.cpp: spmdrun, the local launcher of spmdsim programs.
//
//   spmdrun -n 8 [--tag-output] [--timeout S] [--] ./train --spmd-backend=nccl
//
// Starts N processes of the program (posix_spawnp) with SPMD_RANK, SPMD_WORLD_SIZE,
// SPMD_LOCAL_RANK and SPMD_LOCAL_WORLD_SIZE set, which launch() reads (runtime/options.h), and
// SPMD_JOB_ID, this launch's id ("spmdrun-<pid>-<UTC start>", world/launcher.h). Each
// rank is the leader of a process group of its own, so what it starts belongs to its rank: the
// signals spmdrun forwards (SIGINT, SIGTERM, SIGHUP; the ranks start with their default
// handling) and the ones it sends to stop a rank reach the whole group. With --tag-output each
// line a rank prints is prefixed with "[rank] ". As soon as one process exits non-zero or dies by
// a signal, the others get SIGTERM (SIGKILL 5 s later) and spmdrun exits non-zero: the failed
// process's exit code, or 128 + its signal. --timeout S stops everything after S seconds with exit
// code 124. When the ranks have ended, whatever is left in their groups (a child a rank started
// and did not wait for) gets SIGTERM, and SIGKILL 2 s later, so nothing of the job outlives it.
// Being in groups of their own, the ranks are not in the terminal's foreground group: Ctrl-C
// reaches spmdrun, which forwards it, and a rank that reads the terminal is stopped (SIGTTIN).
//
// It is a launcher for backends that bootstrap themselves (nccl); MPI jobs need mpirun or srun.
// Built with NCCL, it also calls ncclGetUniqueId once (no GPU needed) and passes the id to every
// rank as 256 hex digits in SPMD_NCCL_UNIQUE_ID (backends/nccl/unique_id.h). The id's bootstrap
// root listens in this process, which stays alive until the ranks end.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#if SPMDRUN_WITH_NCCL
#include <spmd/backends/nccl/unique_id.h>
#endif

extern char** environ;

namespace {

constexpr const char* kUsage =
    "usage: spmdrun -n N [--tag-output] [--timeout S] [--] program [args...]\n"
    "\n"
    "Starts N local processes of `program`, rank r with SPMD_RANK=r, SPMD_WORLD_SIZE=N,\n"
    "SPMD_LOCAL_RANK=r, SPMD_LOCAL_WORLD_SIZE=N and SPMD_JOB_ID (this launch's id) in its\n"
    "environment.\n"
    "\n"
    "  -n N            number of processes (ranks), at least 1\n"
    "  --tag-output    prefix every line a rank prints with \"[rank] \"\n"
    "  --timeout S     stop every rank after S seconds (exit code 124)\n"
    "  -h, --help      this text\n"
    "\n"
    "Each rank runs in a process group of its own. SIGINT, SIGTERM and SIGHUP are forwarded to\n"
    "the ranks' groups. When a rank exits non-zero or dies by a signal, the others are stopped\n"
    "(SIGTERM, then SIGKILL after 5 s) and spmdrun exits with that rank's exit code (128 +\n"
    "signal for a signal). Processes a rank leaves behind in its group are stopped when the\n"
    "ranks have ended.\n";

struct Options {
  int n = 0;
  bool tag_output = false;
  double timeout_s = 0.0;  // 0: none
  std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string& message) {
  fmt::print(stderr, "spmdrun: {}\n\n{}", message, kUsage);
  std::exit(2);
}

std::optional<long> parse_long(std::string_view text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const std::string s(text);
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value_of = [&](std::string_view arg, std::string_view flag) -> std::string {
    if (arg.size() > flag.size()) {
      std::string_view rest = arg.substr(flag.size());
      if (rest.front() == '=') rest.remove_prefix(1);
      return std::string(rest);
    }
    if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", flag));
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kUsage);
      std::exit(0);
    }
    if (arg == "--tag-output") {
      o.tag_output = true;
    } else if (arg.substr(0, 2) == "-n" &&
               (arg.size() == 2 || arg[2] == '=' || (arg[2] >= '0' && arg[2] <= '9'))) {
      const std::string v = value_of(arg, "-n");
      const auto n = parse_long(v);
      if (!n || *n < 1 || *n > 4096)
        usage_error(fmt::format("-n wants a count from 1, got '{}'", v));
      o.n = static_cast<int>(*n);
    } else if (arg.substr(0, 9) == "--timeout") {
      const std::string v = value_of(arg, "--timeout");
      char* end = nullptr;
      o.timeout_s = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(o.timeout_s > 0) || !std::isfinite(o.timeout_s)) {
        usage_error(fmt::format("--timeout wants seconds > 0, got '{}'", v));
      }
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_error(fmt::format("unknown option '{}'", arg));
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.n == 0) usage_error("-n N is required");
  if (o.command.empty()) usage_error("no program given");
  return o;
}

// The NCCL unique id the ranks of this launch share, as hex; empty (with a warning) when NCCL
// cannot make one or spmdrun was built without it.
std::string nccl_unique_id_hex() {
#if SPMDRUN_WITH_NCCL
  ncclUniqueId id{};
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    fmt::print(stderr,
               "spmdrun: warning: ncclGetUniqueId failed ({}); ranks using the nccl backend need "
               "NCCL_COMM_ID instead\n",
               ncclGetErrorString(result));
    return {};
  }
  return spmd::unique_id_to_hex(id);
#else
  return {};
#endif
}

// This launch's id, for every rank's SPMD_JOB_ID (the flight recorder names its dumps by it):
// "spmdrun-<pid>-<UTC start time>", unique on the host and over time.
std::string job_id() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  return fmt::format("spmdrun-{}-{}", ::getpid(), stamp);
}

// The environment of rank `rank`'s process: spmdrun's own, without launcher variables a previous
// launch left behind, plus this rank's, the launch's id and its NCCL unique id (when there is
// one).
std::vector<std::string> child_environment(int rank, int size, const std::string& job,
                                           const std::string& nccl_id) {
  static constexpr std::string_view kOwn[] = {
      "SPMD_RANK=",           "SPMD_WORLD_SIZE=", "SPMD_LOCAL_RANK=", "SPMD_LOCAL_WORLD_SIZE=",
      "SPMD_NCCL_UNIQUE_ID=", "SPMD_JOB_ID="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    bool own = false;
    for (std::string_view prefix : kOwn) own |= entry.substr(0, prefix.size()) == prefix;
    if (!own) env.emplace_back(entry);
  }
  env.push_back(fmt::format("SPMD_RANK={}", rank));
  env.push_back(fmt::format("SPMD_WORLD_SIZE={}", size));
  env.push_back(fmt::format("SPMD_LOCAL_RANK={}", rank));
  env.push_back(fmt::format("SPMD_LOCAL_WORLD_SIZE={}", size));
  env.push_back(fmt::format("SPMD_JOB_ID={}", job));
  if (!nccl_id.empty()) env.push_back(fmt::format("SPMD_NCCL_UNIQUE_ID={}", nccl_id));
  return env;
}

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  g_signal = sig;
}

// One output stream of one rank under --tag-output: the read end of its pipe and the partial line.
struct Stream {
  int fd = -1;
  int rank = 0;
  int out_fd = 1;
  std::string pending;
};

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// Reads what is available; writes every complete line with its rank's prefix. Closes at EOF.
void pump(Stream& s) {
  char buffer[65536];
  const ssize_t n = read(s.fd, buffer, sizeof buffer);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    if (!s.pending.empty()) write_all(s.out_fd, fmt::format("[{}] {}\n", s.rank, s.pending));
    s.pending.clear();
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.pending.append(buffer, static_cast<size_t>(n));
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += fmt::format("[{}] ", s.rank);
    out.append(s.pending, start, nl + 1 - start);
  }
  s.pending.erase(0, start);
  if (!out.empty()) write_all(s.out_fd, out);
}

struct Child {
  pid_t pid = -1;
  bool running = false;
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return "stopped";
}

// Signals every rank's process group: the rank and what it started. A group outlives its
// leader while a member lives (its pid is not reused meanwhile); kill() fails for empty ones.
void signal_all(std::vector<Child>& children, int sig) {
  for (const Child& c : children) {
    if (c.pid > 0) kill(-c.pid, sig);
  }
}

// Whether any rank's group still has a process in it.
bool any_group_alive(const std::vector<Child>& children) {
  for (const Child& c : children) {
    if (c.pid > 0 && kill(-c.pid, 0) == 0) return true;
  }
  return false;
}

// The ranks have ended: stops what they left in their groups (SIGTERM, SIGKILL after 2 s).
void stop_leftovers(std::vector<Child>& children) {
  if (!any_group_alive(children)) return;
  signal_all(children, SIGTERM);
  const auto kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (any_group_alive(children)) {
    if (std::chrono::steady_clock::now() > kill_at) {
      signal_all(children, SIGKILL);
      break;
    }
    usleep(20000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);

  std::vector<char*> child_argv;
  for (const std::string& a : options.command) child_argv.push_back(const_cast<char*>(a.c_str()));
  child_argv.push_back(nullptr);

  const std::string nccl_id = nccl_unique_id_hex();
  const std::string job = job_id();
  std::vector<Child> children(static_cast<size_t>(options.n));
  std::vector<Stream> streams;
  int live = 0;
  int code = 0;
  bool stopping = false;
  std::string failure;
  for (int rank = 0; rank < options.n; ++rank) {
    std::vector<std::string> env = child_environment(rank, options.n, job, nccl_id);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // Its own process group (pgroup 0: the child's pid), with the forwarded signals handled by
    // default even where spmdrun's own caller ignores them (a background job of a script).
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setpgroup(&attributes, 0);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    if (options.tag_output) {
      for (int k = 0; k < 2; ++k) {
        if (pipe2(pipes[k], O_CLOEXEC) != 0) {
          fmt::print(stderr, "spmdrun: pipe failed: {}\n", std::strerror(errno));
          return 1;
        }
        posix_spawn_file_actions_adddup2(&actions, pipes[k][1], k + 1);
      }
    }
    pid_t pid = -1;
    const int err =
        posix_spawnp(&pid, child_argv[0], &actions, &attributes, child_argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    for (auto& p : pipes) {
      if (p[1] >= 0) close(p[1]);
    }
    if (err != 0) {
      for (auto& p : pipes) {
        if (p[0] >= 0) close(p[0]);
      }
      fmt::print(stderr, "spmdrun: cannot start '{}' for rank {}: {}\n", options.command[0], rank,
                 std::strerror(err));
      code = 127;
      stopping = true;
      signal_all(children, SIGTERM);
      break;
    }
    children[static_cast<size_t>(rank)] = Child{pid, true};
    ++live;
    if (options.tag_output) {
      streams.push_back(Stream{pipes[0][0], rank, 1, {}});
      streams.push_back(Stream{pipes[1][0], rank, 2, {}});
    }
  }

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point kill_at{};
  while (live > 0) {
    std::vector<pollfd> fds;
    for (const Stream& s : streams) {
      if (s.fd >= 0) fds.push_back(pollfd{s.fd, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), 50);
    for (Stream& s : streams) {
      for (const pollfd& p : fds) {
        if (p.fd == s.fd && (p.revents & (POLLIN | POLLHUP | POLLERR))) pump(s);
      }
    }

    if (const int sig = g_signal) {
      g_signal = 0;
      signal_all(children, sig);
      if (!stopping) {
        stopping = true;
        code = 128 + sig;
        kill_at = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (options.timeout_s > 0 && !stopping &&
        Clock::now() - start > std::chrono::duration<double>(options.timeout_s)) {
      failure = fmt::format("timed out after {} s; stopped every rank", options.timeout_s);
      stopping = true;
      code = 124;
      signal_all(children, SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(5);
    }

    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t rank = 0; rank < children.size(); ++rank) {
        Child& c = children[rank];
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        --live;
        const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        if (failed && !stopping) {
          stopping = true;
          code = exit_code_of(status);
          failure =
              fmt::format("rank {} {}; stopped the other ranks", rank, describe_status(status));
          signal_all(children, SIGTERM);
          kill_at = Clock::now() + std::chrono::seconds(5);
        }
      }
    }
    if (stopping && live > 0 && kill_at != Clock::time_point{} && Clock::now() > kill_at) {
      signal_all(children, SIGKILL);
      kill_at = Clock::time_point{};
    }
  }
  stop_leftovers(children);
  // What the ranks wrote last (a descendant keeping a pipe open only delays this by 1 s).
  const auto drain_until = Clock::now() + std::chrono::seconds(1);
  for (bool open = true; open && Clock::now() < drain_until;) {
    std::vector<pollfd> fds;
    for (const Stream& s : streams) {
      if (s.fd >= 0) fds.push_back(pollfd{s.fd, POLLIN, 0});
    }
    open = !fds.empty();
    if (!open) break;
    poll(fds.data(), fds.size(), 50);
    for (Stream& s : streams) {
      for (const pollfd& p : fds) {
        if (p.fd == s.fd && (p.revents & (POLLIN | POLLHUP | POLLERR))) pump(s);
      }
    }
  }
  if (!failure.empty()) {
    fmt::print(stderr, "spmdrun: {}\n", failure);
  }
  return code;
}
