// spmd/runtime/signal_report.cpp: the signal handlers and the watcher thread of Note [Signal
// reports].
#include <spmd/runtime/signal_report.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <thread>

#include <fmt/format.h>

namespace spmd {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM};
constexpr unsigned char kStop = 0;  // written by ~SignalReport: the watcher ends

// The pipe the handler writes to. Set before the handlers are installed, cleared after they are
// removed.
int g_pipe[2] = {-1, -1};
volatile sig_atomic_t g_signalled = 0;
std::atomic<bool> g_active{false};

struct Installed {
  std::function<void(int)> report;
  std::thread watcher;
  struct sigaction previous[std::size(kSignals)] = {};
  bool replaced[std::size(kSignals)] = {};
};
std::unique_ptr<Installed> g_installed;

// Ends the process by `signal` with its default action.
[[noreturn]] void die_by(int signal) {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, signal);
  pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  raise(signal);
  _exit(128 + signal);  // a default action that did not end the process (it always does)
}

void on_signal(int signal) {
  if (g_signalled != 0) die_by(signal);  // the second one: no report, end now
  g_signalled = signal;
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  if (write(g_pipe[1], &byte, 1) != 1) die_by(signal);
  errno = saved;
}

void watch(Installed* installed, int read_fd) {
  for (;;) {
    unsigned char byte = kStop;
    const ssize_t n = read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || byte == kStop) return;
    const int signal = byte;
    try {
      installed->report(signal);
    } catch (...) {
      // The signal ends the process either way.
    }
    std::fflush(stdout);
    std::fflush(stderr);
    die_by(signal);
  }
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return fmt::format("signal {}", signal);
  }
}

SignalReport::SignalReport(std::function<void(int signal)> report) {
  bool expected = false;
  if (!g_active.compare_exchange_strong(expected, true)) return;
  if (pipe2(g_pipe, O_CLOEXEC) != 0) {
    g_active = false;
    return;
  }
  active_ = true;
  g_signalled = 0;
  auto installed = std::make_unique<Installed>();
  installed->report = std::move(report);
  installed->watcher = std::thread(watch, installed.get(), g_pipe[0]);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(kSignals[i], nullptr, &installed->previous[i]);
    if (installed->previous[i].sa_handler == SIG_IGN) continue;
    sigaction(kSignals[i], &action, nullptr);
    installed->replaced[i] = true;
  }
  g_installed = std::move(installed);
}

SignalReport::~SignalReport() {
  if (!active_) return;
  Installed* installed = g_installed.get();
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    if (installed->replaced[i]) sigaction(kSignals[i], &installed->previous[i], nullptr);
  }
  const unsigned char stop = kStop;
  while (write(g_pipe[1], &stop, 1) < 0 && errno == EINTR) {
  }
  // A report under way ends the process; otherwise the watcher reads the stop byte and returns.
  installed->watcher.join();
  close(g_pipe[0]);
  close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
  g_installed.reset();
  g_active = false;
}

}  // namespace spmd
