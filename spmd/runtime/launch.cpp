// spmd/runtime/launch.cpp: launch(), running the worlds a backend driver starts, and the error
// report.
#include <spmd/runtime/launch.h>

#include <cxxabi.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <typeinfo>

#include <fmt/ranges.h>

#include <spmd/collectives/backend.h>
#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/core/call_site.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/debug/checks.h>
#include <spmd/debug/parity.h>
#include <spmd/runtime/signal_report.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/backend_driver.h>
#include <spmd/world/topology.h>

namespace spmd {
namespace {

using Program = std::function<int(World&)>;

// Exit code of a launch that failed before the program ran.
constexpr int kLaunchErrorCode = 2;
// Exit code of a program that threw.
constexpr int kProgramErrorCode = 1;
// Collectives a signal report lists under sim (Note [Signal reports]).
constexpr size_t kReportedCollectives = 5;
// How long run_rank_threads still waits for the ranks running when the run timed out (Note
// [Threads timeout]): those that reach a collective now fail at once.
constexpr std::chrono::seconds kAbandonGrace{1};

// The World of the calling rank thread while run_rank_threads() runs its program, else null.
thread_local const World* t_rank_world = nullptr;

const BackendDriver& driver_of(const LaunchOptions& options) {
  return backend_driver(options.backend, options.backend_source);
}

// --spmd-debug with `all` replaced by the checks the backend supports (BackendDriver::debug_all).
DebugOptions resolved_debug(const LaunchOptions& options) {
  DebugOptions debug = options.debug;
  if (!debug.all) return debug;
  const DebugOptions& all = driver_of(options).debug_all;
  debug.check |= all.check;
  debug.replicate |= all.replicate;
  debug.fingerprint |= all.fingerprint;
  // `all` accepts infinities (-inf attention masks are meant) unless `nan` was listed too.
  if (all.nan && !debug.nan) debug.allow_inf = true;
  debug.nan |= all.nan;
  debug.divergence |= all.divergence;
  debug.types |= all.types;
  debug.parity |= all.parity;
  debug.all = false;
  // A dry run has no values to compare: `all` keeps the checks that need none.
  if (options.meta_tensors) debug.check = debug.replicate = debug.nan = debug.parity = false;
  return debug;
}

WorldRequest world_request(const LaunchOptions& options) {
  WorldRequest request;
  request.world_size = options.world_size;
  request.world_size_source = options.world_size_source;
  request.debug = resolved_debug(options);
  request.timeout_s = options.timeout_s.value_or(kDefaultTimeoutSeconds);
  request.gpus_per_process = options.gpus_per_process;
  request.launcher = detect_launcher();
  return request;
}

// Whether launch() keeps a flight recorder for `world` (Note [Flight recorder]).
bool has_flight_recorder(const World& world) {
  const BackendDriver* driver = find_backend_driver(world.backend_name());
  return driver != nullptr && driver->flight_recorder;
}

// The worlds the driver starts for `options`, with what every backend shares applied: the
// observers of the debug checks, the topology file and the trace settings. Each world's trace
// path is set when the session has one world; a session of several (threads) writes one trace
// for all of them (run_threads).
std::vector<World> start_worlds(const BackendDriver& driver, const LaunchOptions& options) {
  std::vector<World> worlds = driver.start(world_request(options));
  std::shared_ptr<const Topology> topology;
  if (!options.topology_path.empty()) {
    topology = std::make_shared<Topology>(Topology::load(options.topology_path));
  }
  for (World& world : worlds) {
    if (options.debug.any()) set_debug(world, resolved_debug(options));
    if (topology) world.set_topology(topology);
    if (!options.trace_path.empty() && worlds.size() == 1) {
      auto state = std::make_shared<WorldState>(world.state());
      state->trace_path = options.trace_path;
      world = World(std::move(state));
    }
  }
  if (!options.trace_path.empty()) {
    trace().set_capacity(0);
  } else if (driver.flight_recorder && flight_recorder_size() > 0) {
    trace().set_capacity(flight_recorder_size());
  }
  return worlds;
}

// "std::runtime_error": a C++ type as the program spells it.
std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(name);
}

// The name reports give an exception: the spmd::Error subclass's ("CommError"), else the C++ type
// ("std::out_of_range"), so an exception from the user's code or a library says what it is.
std::string error_type(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return std::string(error->type_name());
  return demangled(typeid(e).name());
}

// The C++ type of the exception being handled (in a catch block), or "unknown".
std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  return type != nullptr ? demangled(type->name()) : std::string("unknown");
}

std::string error_type(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return error_type(e);
  } catch (...) {
    return current_exception_type();
  }
}

// "[rank 3] ", "[ranks 0-7] ", "[ranks 0,1,5] " (ranks_text), or "" for none.
std::string ranks_prefix(const std::vector<int>& ranks) {
  return ranks.empty() ? "" : fmt::format("[{}] ", ranks_text(ranks));
}

// The ranks `world` holds, or the launcher's rank before a world exists.
std::string rank_prefix(const World& world) {
  if (world.defined()) return ranks_prefix(world.held_ranks());
  try {
    if (auto launcher = detect_launcher()) return fmt::format("[rank {}] ", launcher->rank);
  } catch (const Error&) {
    // The launcher's variables are what failed; report without a rank.
  }
  return "";
}

// ---- Note [Signal reports] ------------------------------------------------------------------

// "interrupted by SIGINT", "terminated by SIGTERM".
std::string signal_headline(int signal) {
  return fmt::format("{} by {}", signal == SIGINT ? "interrupted" : "terminated",
                     signal_name(signal));
}

// "all_reduce over 'tp' [4, 8] f32 op=sum at train.cpp:42 (pending)".
std::string event_text(const TraceEvent& e) {
  return fmt::format("{} over '{}' {} {}{}{} at {} ({})", e.kind, e.dim_name, shape_str(e.shape),
                     e.dtype, e.detail.empty() ? "" : " ", e.detail, site_text(e.file, e.line),
                     e.end_ns == 0 ? "pending" : "completed");
}

// Where a sim run is: in or outside a collective, and the last few collectives.
std::string sim_state() {
  const std::vector<TraceEvent> events = trace().events();
  if (events.empty()) return "before any collective";
  std::string out =
      events.back().end_ns == 0 ? "in the last collective below" : "outside any collective";
  const size_t shown = std::min(kReportedCollectives, events.size());
  out += fmt::format("; the last {} collective(s), oldest first:", shown);
  for (size_t i = events.size() - shown; i < events.size(); ++i) {
    out += "\n  " + event_text(events[i]);
  }
  return out;
}

void print_report(const std::string& text) {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

// The report of a world's process (sim, mpi, nccl).
void report_signal(const World& world, int signal) {
  const std::string headline = signal_headline(signal);
  const std::string prefix = ranks_prefix(world.held_ranks());
  if (has_flight_recorder(world)) {
    const std::string state =
        world.state().session ? world.state().session->describe_state() : std::string();
    print_report(
        fmt::format("{}{}{}{}\n", prefix, headline, state.empty() ? "" : " while ", state));
    dump_flight_recorder(world, headline);
    return;
  }
  print_report(fmt::format("{}{} {}\n", prefix, headline, sim_state()));
}

// launch() under threads: runs the rank threads, prints each failure once (ranks with the same
// error together, in the order they failed), writes the trace, returns the exit code.
int run_threads(const LaunchOptions& options, const Program& program) {
  const std::vector<RankOutcome> outcomes = run_rank_threads(options, program);
  std::vector<const RankOutcome*> failed;
  for (const RankOutcome& o : outcomes) {
    if (o.error) failed.push_back(&o);
  }
  std::sort(failed.begin(), failed.end(), [](const RankOutcome* a, const RankOutcome* b) {
    return a->failure_order < b->failure_order;
  });
  std::vector<std::pair<std::string, std::vector<int>>> reports;  // summary -> ranks
  std::vector<std::exception_ptr> errors;
  for (const RankOutcome* o : failed) {
    const std::string summary = error_text(o->error);
    auto it = std::find_if(reports.begin(), reports.end(),
                           [&](const auto& r) { return r.first == summary; });
    if (it == reports.end()) {
      reports.push_back({summary, {o->rank}});
      errors.push_back(o->error);
    } else {
      it->second.push_back(o->rank);
    }
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    std::vector<int>& ranks = reports[i].second;
    std::sort(ranks.begin(), ranks.end());
    report_error(errors[i], ranks);
  }
  std::vector<int> abandoned;
  for (const RankOutcome& o : outcomes) {
    if (o.abandoned) abandoned.push_back(o.rank);
  }
  int code = failed.empty() && abandoned.empty() ? 0 : kProgramErrorCode;
  for (const RankOutcome& o : outcomes) {
    if (code == 0 && o.code != 0) code = o.code;
  }
  if (!abandoned.empty()) {
    print_report(fmt::format(
        "{}still running when the run timed out; the process ends without waiting for {} (the "
        "TimeoutError above says where each rank is)\n",
        ranks_prefix(abandoned), abandoned.size() == 1 ? "it" : "them"));
  }
  if (!options.trace_path.empty()) {
    try {
      trace().to_chrome_json(options.trace_path);
    } catch (...) {
      report_error(std::current_exception(), std::vector<int>{});
      if (code == 0) code = kProgramErrorCode;
    }
  }
  if (!abandoned.empty()) {
    // A rank thread still runs the program, which may use anything the process would destroy
    // on the way out: end here, without running destructors.
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

// Discards what the program prints to stdout while it lives (the shadow run's output).
class QuietStdout {
 public:
  QuietStdout() {
    std::fflush(stdout);
    std::cout.flush();
    saved_ = ::dup(STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) ::dup2(null, STDOUT_FILENO);
    if (null >= 0) ::close(null);
  }
  ~QuietStdout() {
    std::fflush(stdout);
    std::cout.flush();
    if (saved_ >= 0) {
      ::dup2(saved_, STDOUT_FILENO);
      ::close(saved_);
    }
  }
  QuietStdout(const QuietStdout&) = delete;
  QuietStdout& operator=(const QuietStdout&) = delete;

 private:
  int saved_ = -1;
};

// `program` on `world` with its stdout discarded and nothing traced (the debug modes' extra runs:
// the shadow run, the parity run's reference); what it threw, or null.
std::exception_ptr run_quietly(const Program& program, World& world) {
  const QuietStdout quiet;
  const bool tracing = trace().enabled();
  trace().set_enabled(false);
  std::exception_ptr error;
  try {
    program(world);
  } catch (...) {
    error = std::current_exception();
  }
  trace().set_enabled(tracing);
  return error;
}

// The parity run's reference (Note [Parity run] in debug/parity.h): `program` on a world that
// holds rank 0 alone and whose meshes have every dim of size 1 but the kept ones (pp, and those
// the program's local collectives need: the run starts again with each, on as many ranks as the
// kept dims have), quiet and untraced, every DTensor it makes recorded. Returns whether the record
// is complete; `kept` says which dims beyond pp were kept and why. When the program fails there: a
// ConfigError when parity was asked for by name (`required`), else (under `all`) a note on stderr
// and no parity run.
bool run_parity_reference(const LaunchOptions& options, const Program& program, bool required,
                          std::string& kept) {
  LaunchOptions one = options;
  one.debug = DebugOptions{};
  one.trace_path.clear();
  int held = 1;
  std::vector<std::string> keep = {std::string(kParityKeptDim)};
  std::exception_ptr error;
  for (;;) {
    World started = make_world(one);
    const int size = started.size();
    auto state = std::make_shared<WorldState>(started.state());
    state->parity_reference = true;
    state->parity_kept_dims = keep;
    state->held_ranks.resize(static_cast<size_t>(held));
    std::iota(state->held_ranks.begin(), state->held_ranks.end(), 0);
    World reference(std::move(state));
    started = World();
    parity_record(reference);
    error = run_quietly(program, reference);
    reference = World();
    std::optional<ParityRestart> restart;
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ParityRestart& r) {
      restart = r;
    } catch (...) {
    }
    if (!restart) break;
    if (restart->ranks > size) {
      try {
        throw_error<MeshError>("the kept dims {} of a mesh have {} ranks but the world has {}",
                               keep, restart->ranks, size);
      } catch (...) {
        error = std::current_exception();
      }
      break;
    }
    if (restart->ranks > held) held = static_cast<int>(restart->ranks);
    if (!restart->keep_dim.empty()) {
      keep.push_back(restart->keep_dim);
      kept += fmt::format("{}'{}' ({} needs its ranks)", kept.empty() ? "" : ", ",
                          restart->keep_dim, restart->where);
    }
  }
  if (!error) return true;
  const std::string last = parity_last_recorded();
  parity_end();
  const std::string why = fmt::format(
      "--spmd-debug=parity: the program cannot run on one rank (every mesh dim but {} of size 1), "
      "so it has no one-rank run to compare with: {} ({}). Meshes from init_device_mesh and "
      "from_ranks collapse; code that indexes a mesh's ranks or coordinates beyond 0 on another "
      "dim, or needs such a dim larger than 1, does not run there",
      keep, error_text(error),
      last.empty() ? std::string("before its first DTensor op") : "after its DTensor op " + last);
  if (required) throw_error<ConfigError>("{}", why);
  print_report(fmt::format("spmd: {}; the other checks of --spmd-debug=all go on\n", why));
  return false;
}

// The program on `world`; with --spmd-debug=parity first on one rank (Note [Parity run] in
// debug/parity.h), with --spmd-debug=divergence first as a rank that is not the coordinator (Note
// [Shadow run] in debug/checks.h).
int run_program(const World& world, const Program& program, const LaunchOptions& options) {
  World real = world;
  std::string kept;
  const bool parity =
      world.debug().parity && run_parity_reference(options, program, options.debug.parity, kept);
  struct ParityEnd {
    bool on;
    ~ParityEnd() {
      if (on) parity_end();
    }
  } parity_end_guard{parity};
  auto run_real = [&] {
    if (parity) parity_compare(real);
    const int code = program(real);
    if (parity && options.debug.parity) {
      parity_end();
      parity_end_guard.on = false;
      print_report(fmt::format(
          "spmd: {}{}\n", parity_summary(),
          kept.empty() ? std::string()
                       : fmt::format("; kept at their size in the one-rank run: {}", kept)));
    }
    return code;
  };
  if (!world.debug().divergence) return run_real();
  auto state = std::make_shared<WorldState>(world.state());
  state->coordinator = false;
  state->trace_path.clear();
  World shadow_world(std::move(state));
  shadow_run_record();
  const std::exception_ptr shadow_error = run_quietly(program, shadow_world);
  shadow_world = World();
  shadow_run_compare(shadow_error == nullptr);
  int code = 0;
  try {
    code = run_real();
    shadow_run_finish();
  } catch (...) {
    shadow_run_end();
    throw;
  }
  shadow_run_end();
  if (shadow_error) {
    throw_error<DivergenceError>(
        "--spmd-debug=divergence: run as a rank other than the coordinator, the program fails "
        "where the coordinator does not (on a cluster every rank but 0 would): {}",
        error_text(shadow_error));
  }
  return code;
}

}  // namespace

World make_world(const LaunchOptions& options) {
  const BackendDriver& driver = driver_of(options);
  if (driver.thread_per_world) {
    if (t_rank_world == nullptr) {
      throw_error<ConfigError>(
          "--spmd-backend={}: its worlds exist only on the rank threads that launch() (or "
          "run_rank_threads()) starts, one per world",
          driver.name);
    }
    return *t_rank_world;
  }
  std::vector<World> worlds = start_worlds(driver, options);
  if (worlds.size() != 1) {
    throw_error<InternalError>("make_world: the {} driver started {} worlds, expected one",
                               driver.name, worlds.size());
  }
  return worlds.front();
}

void finish_world(const World& world) {
  if (!world.defined()) return;
  world.backend().finish_program();
  const std::string& path = world.state().trace_path;
  if (!path.empty()) write_world_trace(world, path);
  if (world.state().session) world.state().session->finish();
}

namespace {

// What the rank threads of one run share. Held by each thread too, so a thread that is
// abandoned (Note [Threads timeout]) finds it alive whenever it ends.
struct RankThreads {
  Program program;
  std::shared_ptr<BackendSession> session;
  std::mutex mutex;
  std::condition_variable ended;
  std::vector<RankOutcome> outcomes;
  std::vector<bool> done;
  // Each rank thread's trace (Note [Traces of rank threads] in collectives/trace.h).
  std::vector<std::unique_ptr<Trace>> traces;
  size_t running = 0;
  uint64_t failures = 0;
};

}  // namespace

std::vector<RankOutcome> run_rank_threads(const LaunchOptions& options,
                                          const std::function<int(World&)>& program) {
  std::vector<World> worlds = start_worlds(driver_of(options), options);
  auto run = std::make_shared<RankThreads>();
  run->program = program;
  run->session = worlds.front().state().session;
  run->outcomes.resize(worlds.size());
  run->done.resize(worlds.size());
  for (size_t i = 0; i < worlds.size(); ++i) run->traces.push_back(Trace::like(process_trace()));
  std::vector<int> all_ranks;
  for (size_t i = 0; i < worlds.size(); ++i) {
    run->outcomes[i].rank = worlds[i].held_ranks().front();
    for (int rank : worlds[i].held_ranks()) all_ranks.push_back(rank);
  }
  std::sort(all_ranks.begin(), all_ranks.end());
  // Each thread owns its world and drops it before reporting the rank finished.
  auto run_world = [run](size_t index, World world) {
    const std::vector<int> ranks = world.held_ranks();
    int code = 0;
    std::exception_ptr error;
    std::string how = "returned";
    const TraceScope own_trace(*run->traces[index]);
    t_rank_world = &world;
    try {
      code = run->program(world);
    } catch (...) {
      error = std::current_exception();
      how = fmt::format("threw {}", error_type(error));
      std::lock_guard lock(run->mutex);
      run->outcomes[index].failure_order = run->failures++;
    }
    t_rank_world = nullptr;
    world = World();
    if (run->session) {
      for (int rank : ranks) run->session->rank_finished(rank, how);
    }
    {
      std::lock_guard lock(run->mutex);
      run->outcomes[index].code = code;
      run->outcomes[index].error = error;
      run->done[index] = true;
      --run->running;
    }
    run->ended.notify_all();
  };
  // Note [Signal reports]: every rank's state.
  SignalReport report([run, all_ranks](int signal) {
    const std::string state = run->session ? run->session->describe_state() : std::string();
    print_report(fmt::format("{}{}; {}\n", ranks_prefix(all_ranks), signal_headline(signal),
                             state.empty() ? sim_state() : state));
  });
  std::vector<std::thread> threads(worlds.size());
  for (size_t i = 0; i < worlds.size(); ++i) {
    try {
      {
        std::lock_guard lock(run->mutex);
        ++run->running;
      }
      threads[i] = std::thread(run_world, i, std::move(worlds[i]));
    } catch (...) {
      // The worlds without a thread count as finished, so the started ones do not wait for them.
      const std::exception_ptr error = std::current_exception();
      std::vector<int> unstarted;
      {
        std::lock_guard lock(run->mutex);
        --run->running;
        for (size_t j = i; j < worlds.size(); ++j) {
          run->outcomes[j].error = error;
          run->outcomes[j].failure_order = run->failures++;
          run->done[j] = true;
          const std::vector<int> ranks = worlds[j].defined()
                                             ? worlds[j].held_ranks()
                                             : std::vector<int>{run->outcomes[j].rank};
          unstarted.insert(unstarted.end(), ranks.begin(), ranks.end());
          worlds[j] = World();
        }
      }
      if (run->session) {
        for (int rank : unstarted) {
          run->session->rank_finished(rank, "never started: its thread could not be created");
        }
      }
      break;
    }
  }
  // Every thread ends, unless the run timed out (Note [Threads timeout]): then the threads still
  // running get a short grace and are abandoned.
  {
    std::unique_lock lock(run->mutex);
    while (run->running > 0) {
      if (run->ended.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return run->running == 0; })) {
        break;
      }
      lock.unlock();
      const bool abandon = run->session && run->session->abandon_running_ranks();
      lock.lock();
      if (abandon) {
        run->ended.wait_for(lock, kAbandonGrace, [&] { return run->running == 0; });
        break;
      }
    }
  }
  std::vector<RankOutcome> outcomes;
  bool any_abandoned = false;
  {
    std::lock_guard lock(run->mutex);
    for (size_t i = 0; i < threads.size(); ++i) {
      if (!threads[i].joinable()) continue;
      if (run->done[i]) continue;
      run->outcomes[i].abandoned = true;
      any_abandoned = true;
    }
    outcomes = run->outcomes;
  }
  for (size_t i = 0; i < threads.size(); ++i) {
    if (!threads[i].joinable()) continue;
    if (outcomes[i].abandoned) {
      threads[i].detach();
    } else {
      threads[i].join();
    }
  }
  // Rank by rank (an abandoned thread's trace stays alive with `run`; what it holds so far joins).
  for (const std::unique_ptr<Trace>& rank_trace : run->traces) process_trace().append(*rank_trace);
  if (run->session && !any_abandoned) run->session->finish();
  return outcomes;
}

std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return fmt::format("{}: {}", error_type(e), e.what());
  } catch (...) {
    return fmt::format("{}: an exception that is not a std::exception", current_exception_type());
  }
}

void report_error(const std::exception_ptr& error, const std::vector<int>& ranks) {
  fmt::print(stderr, "{}{}\n", ranks_prefix(ranks), error_text(error));
  std::fflush(stderr);
}

void report_error(const std::exception_ptr& error, const World& world) {
  fmt::print(stderr, "{}{}\n", rank_prefix(world), error_text(error));
  std::fflush(stderr);
}

void abort_job(int code) {
  // In reverse catalog order, so a backend that bootstraps over another one's library ends its
  // own resources before that library ends the job.
  const std::vector<const BackendDriver*> drivers = backend_drivers();
  for (auto it = drivers.rbegin(); it != drivers.rend(); ++it) {
    if ((*it)->abort_job) (*it)->abort_job(code);
  }
}

namespace detail {

int launch_program(int& argc, char** argv, const std::function<int(World&)>& program) {
  World world;
  int failure_code = kLaunchErrorCode;
  try {
    const LaunchOptions options = parse_launch_options(argc, argv);
    if (options.meta_tensors && options.backend != "sim" && options.backend != "threads") {
      throw_error<Unsupported>(
          "--spmd-tensors=meta: shape-only tensors run under the sim and threads backends, not "
          "'{}' (a dry run needs no devices: use --spmd-backend=sim)",
          options.backend);
    }
    if (options.meta_tensors && !options.debug.all &&
        (options.debug.check || options.debug.replicate || options.debug.nan ||
         options.debug.parity)) {
      throw_error<ConfigError>(
          "--spmd-debug={} compares values, and a dry run (--spmd-tensors=meta) has none; drop "
          "check, replicate, nan and parity (divergence works on shapes)",
          options.debug.to_string());
    }
    if (options.meta_tensors && !options.debug.dump_values.empty()) {
      throw_error<ConfigError>(
          "--spmd-dump-values={}: a dry run (--spmd-tensors=meta) has no values to write",
          options.debug.dump_values);
    }
    // Process-wide (rank threads see it too) for the program's run, then as it was.
    struct MetaSetting {
      bool saved = meta_tensors();
      ~MetaSetting() { set_meta_tensors(saved); }
    } restore;
    if (options.meta_tensors) set_meta_tensors(true);
    if (driver_of(options).thread_per_world) return run_threads(options, program);
    world = make_world(options);
    failure_code = kProgramErrorCode;
    int code = 0;
    {
      // Note [Signal reports]; also while MPI_Finalize waits for the other ranks.
      SignalReport report([world](int signal) { report_signal(world, signal); });
      code = run_program(world, program, options);
      finish_world(world);
    }
    return code;
  } catch (...) {
    report_error(std::current_exception(), world);
    if (world.defined() && has_flight_recorder(world)) {
      dump_flight_recorder(world, error_text(std::current_exception()));
    }
    if (world.defined() && !world.state().trace_path.empty()) {
      try {
        write_world_trace(world, world.state().trace_path);
      } catch (...) {
        // The error above is the one to report.
      }
    }
    abort_job(failure_code);
    return failure_code;
  }
}

}  // namespace detail

int launch(int& argc, char** argv, const std::function<int(World&)>& program) {
  return detail::launch_program(argc, argv, program);
}

int launch(int& argc, char** argv, const std::function<void(World&)>& program) {
  return detail::launch_program(argc, argv, [&](World& world) {
    program(world);
    return 0;
  });
}

}  // namespace spmd
