// spmd/runtime/launch.cpp: launch(), the backend switch and the error report.
#include <spmd/runtime/launch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include <fmt/ranges.h>

#include <spmd/backends/threads/backend.h>
#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/trace.h>
#include <spmd/config.h>
#include <spmd/core/env.h>
#include <spmd/core/error.h>
#include <spmd/core/parallel.h>

#if SPMD_HAVE_MPI
#include <spmd/backends/mpi/backend.h>
#endif
#if SPMD_HAVE_NCCL
#include <spmd/backends/nccl/backend.h>
#include <spmd/backends/nccl/bootstrap.h>
#include <spmd/backends/nccl/unique_id.h>
#include <spmd/tensor/cuda/device.h>
#endif

namespace spmd {
namespace {

using Program = std::function<int(World&)>;

// Exit code of a launch that failed before the program ran.
constexpr int kLaunchErrorCode = 2;
// Exit code of a program that threw.
constexpr int kProgramErrorCode = 1;

// The world size of a real backend: the launcher's, which --spmd-world-size may only repeat.
// (Unused in builds without a real backend.)
[[maybe_unused]] void check_world_size(const LaunchOptions& options, const LauncherInfo& launcher) {
  if (options.world_size && *options.world_size != launcher.size) {
    throw_error<ConfigError>("{} disagrees with the launcher: {} started {} processes ({}={})",
                             options.world_size_source, launcher.name, launcher.size,
                             launcher.size_variable, launcher.size);
  }
}

// Under a real backend each process is one rank: its thread pool gets its share of the cores
// unless SPMD_NUM_THREADS says otherwise.
[[maybe_unused]] void share_cores(const LauncherInfo& launcher) {
  if (env_value("SPMD_NUM_THREADS") || launcher.local_size < 1) return;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_num_threads(std::max(1, cores / launcher.local_size));
}

World make_sim_world(const LaunchOptions& options) {
  return World::sim(options.world_size.value_or(8));
}

World make_mpi_world(const LaunchOptions& options) {
#if !SPMD_HAVE_MPI
  (void)options;
  throw_error<Unsupported>("this build has no MPI backend; configure with -DSPMD_WITH_MPI=ON");
#else
  const auto launcher = detect_launcher();
  if (!launcher) {
    throw_error<ConfigError>("--spmd-backend=mpi needs a launcher: run it with mpirun -n N ...");
  }
  if (launcher->name == "spmdrun") {
    throw_error<ConfigError>(
        "--spmd-backend=mpi cannot run under spmdrun, whose processes share no MPI job: run it "
        "with mpirun -n N ... (or srun)");
  }
  check_world_size(options, *launcher);
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
  state->backend = std::make_shared<MpiBackend>(options.debug.fingerprint);
  return World(std::move(state));
#endif
}

// Note [NCCL bootstrap] (backends/nccl/bootstrap.h) lists the steps, in this order.
World make_nccl_world(const LaunchOptions& options) {
#if !SPMD_HAVE_NCCL
  (void)options;
  throw_error<Unsupported>("this build has no NCCL backend; configure with -DSPMD_WITH_NCCL=ON");
#else
  const auto launcher = detect_launcher();
  const int processes = launcher ? launcher->size : 1;
  const int process_rank = launcher ? launcher->rank : 0;
  const int per_process = options.gpus_per_process;
  const int world_size = processes * per_process;
  // SPMD_WORLD_SIZE set by spmdrun counts processes; any other world size must be the ranks'.
  const bool launchers_count = launcher && options.world_size == launcher->size &&
                               options.world_size_source.starts_with(launcher->size_variable);
  if (options.world_size && *options.world_size != world_size && !launchers_count) {
    throw_error<ConfigError>(
        "{} disagrees with the launch: {} process(es) ({}) with {} GPU(s) each make {} ranks",
        options.world_size_source, processes, launcher ? launcher->name : "no launcher",
        per_process, world_size);
  }
  if (launcher) share_cores(*launcher);

  const CudaDevices gpus = probe_cuda_devices();
  if (gpus.count == 0) {
    throw_error<Unsupported>("--spmd-backend=nccl needs a CUDA GPU, and process {} has none: {}",
                             process_rank, gpus.error);
  }
  const bool share_gpu = env_value("SPMD_NCCL_SHARE_GPU").value_or("0") == "1";
  const std::vector<int> devices =
      rank_devices(launcher ? launcher->local_rank : 0, launcher ? launcher->local_size : 1,
                   per_process, gpus.count, share_gpu);
  const int version = nccl_runtime_version();
  if (share_gpu) apply_shared_gpu_env(version, process_rank);

  const UniqueIdSource source = choose_unique_id_source(
      env_value(kUniqueIdVariable), env_value("NCCL_COMM_ID"),
      launcher ? std::string_view(launcher->name) : std::string_view(), processes, SPMD_HAVE_MPI);
  NcclConfig config;
  config.id = obtain_unique_id(source, process_rank);
#if SPMD_HAVE_MPI
  if (source == UniqueIdSource::MpiBroadcast &&
      (mpi_world_size() != processes || mpi_world_rank() != process_rank)) {
    throw_error<ConfigError>(
        "--spmd-backend=nccl: MPI_COMM_WORLD has this process as rank {} of {}, but {} said rank "
        "{} of {}",
        mpi_world_rank(), mpi_world_size(), launcher->name, process_rank, processes);
  }
#endif
  config.world_size = world_size;
  for (int i = 0; i < per_process; ++i) config.ranks.push_back(process_rank * per_process + i);
  config.devices = devices;
  config.timeout_s = options.nccl_timeout_s.value_or(300.0);
  config.fingerprint = options.debug.fingerprint;
  config.native_alltoall_gather_scatter = use_native_alltoall_gather_scatter(
      version, env_value("SPMD_NCCL_P2P_COLLECTIVES").value_or("0") == "1");

  auto state = std::make_shared<WorldState>();
  state->size = world_size;
  state->held_ranks = config.ranks;
  for (int device : devices) state->devices.push_back(cuda(device));
  state->coordinator = process_rank == 0;
  state->backend_name = "nccl";
  state->backend = std::make_shared<NcclBackend>(config);
  return World(std::move(state));
#endif
}

// The World of the calling rank thread while run_rank_threads() runs its program, else null.
thread_local const World* t_rank_world = nullptr;

// Real backends keep a flight recorder (Note [Flight recorder]); sim holds every rank's trace.
bool has_flight_recorder(const World& world) {
  return world.backend_name() == "mpi" || world.backend_name() == "nccl";
}

// A world of a single process (sim, mpi, nccl) with the options every backend shares applied.
World configure(World world, const LaunchOptions& options) {
  if (options.debug.any()) world.set_debug(options.debug);
  if (!options.topology_path.empty()) {
    world.set_topology(std::make_shared<Topology>(Topology::load(options.topology_path)));
  }
  if (!options.trace_path.empty()) {
    trace().set_capacity(0);
    auto state = std::make_shared<WorldState>(world.state());
    state->trace_path = options.trace_path;
    world = World(std::move(state));
  } else if (has_flight_recorder(world) && flight_recorder_size() > 0) {
    trace().set_capacity(flight_recorder_size());
  }
  return world;
}

std::string_view error_type(const std::exception& e) {
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const MeshError*>(&e)) return "MeshError";
  if (dynamic_cast<const PlacementError*>(&e)) return "PlacementError";
  if (dynamic_cast<const CommError*>(&e)) return "CommError";
  if (dynamic_cast<const DivergenceError*>(&e)) return "DivergenceError";
  if (dynamic_cast<const DeadlockError*>(&e)) return "DeadlockError";
  if (dynamic_cast<const CollectiveMismatchError*>(&e)) return "CollectiveMismatchError";
  if (dynamic_cast<const NonFiniteError*>(&e)) return "NonFiniteError";
  if (dynamic_cast<const Unsupported*>(&e)) return "Unsupported";
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const InternalError*>(&e)) return "InternalError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "error";
}

std::string_view error_type(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return error_type(e);
  } catch (...) {
    return "error";
  }
}

// "[rank 3] ", "[ranks 0-7] ", "[ranks 0-2,5] " (ascending ranks), or "" for none.
std::string ranks_prefix(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  if (ranks.size() == 1) return fmt::format("[rank {}] ", ranks[0]);
  std::string list;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    list += fmt::format("{}{}", list.empty() ? "" : ",", ranks[i]);
    if (j > i) list += fmt::format("-{}", ranks[j]);
    i = j + 1;
  }
  return fmt::format("[ranks {}] ", list);
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

// launch() under threads: runs the rank threads, prints each failure once (ranks with the same
// error together, in the order they failed), writes the trace, returns the exit code.
int run_threads(const LaunchOptions& options, const Program& program) {
  if (!options.trace_path.empty()) trace().set_capacity(0);
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
  int code = failed.empty() ? 0 : kProgramErrorCode;
  for (const RankOutcome& o : outcomes) {
    if (code == 0 && o.code != 0) code = o.code;
  }
  if (!options.trace_path.empty()) {
    try {
      trace().to_chrome_json(options.trace_path);
    } catch (...) {
      report_error(std::current_exception(), std::vector<int>{});
      if (code == 0) code = kProgramErrorCode;
    }
  }
  return code;
}

}  // namespace

World make_world(const LaunchOptions& options) {
  // The backend switch: one branch per backend.
  if (options.backend == "threads") {
    if (t_rank_world == nullptr) {
      throw_error<ConfigError>(
          "--spmd-backend=threads: threads worlds exist only on the rank threads that launch() "
          "(or run_rank_threads()) starts, one per rank");
    }
    return *t_rank_world;
  }
  World world;
  if (options.backend == "sim") {
    world = make_sim_world(options);
  } else if (options.backend == "mpi") {
    world = make_mpi_world(options);
  } else if (options.backend == "nccl") {
    world = make_nccl_world(options);
  } else {
    throw_error<ConfigError>("unknown backend '{}'; valid backends: {}", options.backend,
                             backend_list());
  }
  return configure(std::move(world), options);
}

std::string trace_file_for(const World& world, const std::string& path) {
  if (world.held_ranks().size() == static_cast<size_t>(world.size())) return path;
  const std::string tag = world.held_ranks().size() == 1
                              ? fmt::format("rank{}", world.held_ranks()[0])
                              : fmt::format("ranks{}", fmt::join(world.held_ranks(), "_"));
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1)) {
    return fmt::format("{}.{}", path, tag);
  }
  return fmt::format("{}.{}{}", path.substr(0, dot), tag, path.substr(dot));
}

void finish_world(const World& world) {
  if (!world.defined()) return;
  const std::string& path = world.state().trace_path;
  if (!path.empty()) trace().to_chrome_json(trace_file_for(world, path));
#if SPMD_HAVE_NCCL
  if (world.backend_name() == "nccl") dynamic_cast<NcclBackend&>(world.backend()).shutdown();
#endif
#if SPMD_HAVE_MPI
  // The nccl backend initializes MPI too when mpirun started it (the unique id's MPI_Bcast).
  if (world.backend_name() == "mpi" || world.backend_name() == "nccl") mpi_finalize();
#endif
}

std::vector<RankOutcome> run_rank_threads(const LaunchOptions& options,
                                          const std::function<int(World&)>& program) {
  const int size = options.world_size.value_or(8);
  std::shared_ptr<const Topology> topology;
  if (!options.topology_path.empty()) {
    topology = std::make_shared<Topology>(Topology::load(options.topology_path));
  }
  auto hub = std::make_shared<ThreadsHub>(size);
  std::vector<RankOutcome> outcomes(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) outcomes[static_cast<size_t>(rank)].rank = rank;
  std::atomic<uint64_t> failures{0};
  auto run_rank = [&](int rank) {
    RankOutcome& outcome = outcomes[static_cast<size_t>(rank)];
    std::string how = "returned";
    {
      auto state = std::make_shared<WorldState>();
      state->size = size;
      state->held_ranks = {rank};
      state->coordinator = rank == 0;
      state->backend_name = "threads";
      state->backend = std::make_shared<ThreadsBackend>(hub, rank);
      state->topology = topology;
      state->debug = options.debug;
      World world(std::move(state));
      t_rank_world = &world;
      try {
        outcome.code = program(world);
      } catch (...) {
        outcome.error = std::current_exception();
        outcome.failure_order = failures++;
        how = fmt::format("threw {}", error_type(outcome.error));
      }
      t_rank_world = nullptr;
    }
    hub->rank_finished(rank, how);
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    try {
      threads.emplace_back(run_rank, rank);
    } catch (...) {
      // The ranks without a thread count as finished, so the started ones do not wait for them.
      for (int r = rank; r < size; ++r) {
        outcomes[static_cast<size_t>(r)].error = std::current_exception();
        outcomes[static_cast<size_t>(r)].failure_order = failures++;
        hub->rank_finished(r, "never started: its thread could not be created");
      }
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  hub->close();
  return outcomes;
}

std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return fmt::format("{}: {}", error_type(e), e.what());
  } catch (...) {
    return "error: an exception that is not a std::exception";
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
#if SPMD_HAVE_NCCL
  // Peers blocked in a collective with this process see aborted communicators, not silence.
  const bool nccl = nccl_abort_communicators();
#endif
#if SPMD_HAVE_MPI
  mpi_abort(code);
#endif
#if SPMD_HAVE_NCCL
  if (nccl) {
    // NCCL's threads and communicators are in no state for an orderly exit: end here, so the
    // launcher sees the code and stops the other ranks.
    std::fflush(nullptr);
    std::_Exit(code);
  }
#endif
  (void)code;
}

namespace detail {

int launch_program(int& argc, char** argv, const std::function<int(World&)>& program) {
  World world;
  int failure_code = kLaunchErrorCode;
  try {
    const LaunchOptions options = parse_launch_options(argc, argv);
    if (options.backend == "threads") return run_threads(options, program);
    world = make_world(options);
    failure_code = kProgramErrorCode;
    const int code = program(world);
    finish_world(world);
    return code;
  } catch (...) {
    report_error(std::current_exception(), world);
    if (world.defined() && has_flight_recorder(world)) {
      dump_flight_recorder(world, error_text(std::current_exception()));
    }
    if (world.defined() && !world.state().trace_path.empty()) {
      try {
        trace().to_chrome_json(trace_file_for(world, world.state().trace_path));
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
