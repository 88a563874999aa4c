// tests/runtime/launch_probe.cpp: a small launch() program the launch tests run as a process.
//
// It reports what launch() gave it ("probe: backend=sim size=8 held=8 coordinator=1 args=[x]"),
// runs one all_reduce, and on request misbehaves:
//   --probe-throw             throws a CommError on every rank
//   --probe-fail-rank=R       rank R throws while the others wait in a barrier
//   --probe-mismatch=shape    rank 1's all_reduce input has another shape than the others'
//   --probe-mismatch=kind     rank 1 calls all_gather while the others call all_reduce
//   --probe-exit=N            the program returns N
//   --probe-hang-rank=R       rank R sleeps for an hour instead of joining the all_reduce
//   --probe-kill-rank=R       rank R kills itself (SIGKILL) instead of joining the all_reduce
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) -> int {
    std::string args;
    std::string mismatch;
    int fail_rank = -1;
    int hang_rank = -1;
    int kill_rank = -1;
    int exit_code = 0;
    bool throw_everywhere = false;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--probe-throw") throw_everywhere = true;
      if (arg.starts_with("--probe-fail-rank=")) fail_rank = std::atoi(argv[i] + 18);
      if (arg.starts_with("--probe-mismatch=")) mismatch = std::string(arg.substr(17));
      if (arg.starts_with("--probe-exit=")) exit_code = std::atoi(argv[i] + 13);
      if (arg.starts_with("--probe-hang-rank=")) hang_rank = std::atoi(argv[i] + 18);
      if (arg.starts_with("--probe-kill-rank=")) kill_rank = std::atoi(argv[i] + 18);
      args += fmt::format("{}{}", args.empty() ? "" : " ", arg);
    }
    fmt::print("probe: backend={} size={} held={} coordinator={} args=[{}]\n", world.backend_name(),
               world.size(), world.held_ranks().size(), world.is_coordinator() ? 1 : 0, args);
    std::fflush(stdout);
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
    if (throw_everywhere) throw_error<CommError>("probe: failing on purpose");
    if (fail_rank >= 0) {
      if (world.holds(fail_rank))
        throw_error<CommError>("probe: rank {} fails on purpose", fail_rank);
      barrier(mesh);
    }
    if (world.holds(hang_rank)) std::this_thread::sleep_for(std::chrono::hours(1));
    if (world.holds(kill_rank)) kill(getpid(), SIGKILL);
    LocalTensor x = LocalTensor::from_fn(
        world, [&](int r) { return full({mismatch == "shape" && r == 1 ? 5 : 4}, r); });
    LocalTensor y = mismatch == "kind" && world.holds(1) && !world.holds(0)
                        ? all_gather(x, mesh, "all")
                        : all_reduce(x, mesh, "all");
    print_digest(world, {y});
    return exit_code;
  });
}
