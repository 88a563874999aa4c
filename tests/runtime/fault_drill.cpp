// tests/runtime/fault_drill.cpp: a launch() program with planted faults, which the fault drills
// (fault_process_test, fault_mpi_test) run as processes under every backend.
//
//   fault_drill --drill=NAME [--drill-rank=R] [launch flags]
//
// Every rank prints "drill: rank R ready", runs one all_reduce over the world mesh 'all', then:
//   --drill=none          the others' barrier, and a clean end
//   --drill=stall         rank R sleeps for an hour while the others wait in a barrier
//   --drill=return        rank R returns while the others wait in a barrier
//   --drill=return-first  rank R returns before its first collective (the others wait to create
//                         the mesh's communicator, then in the all_reduce)
//   --drill=return-pair   on a (size/2, 2) mesh ('pairs', 'pair'), rank R and its pair partner
//                         return after one all_reduce over 'pair'; the other pairs make another
//                         and print "drill: pair done 2"
//   --drill=die           rank R kills itself (SIGKILL) while the others wait in a barrier
//   --drill=stop          rank R stops itself (SIGSTOP) while the others wait in a barrier; it
//                         goes on (to the barrier) when it gets SIGCONT
//   --drill=elsewhere     rank R makes an all_reduce over a new mesh's dim 'pair' (whose
//                         communicator every process must create) while the others wait in a
//                         barrier
//   --drill=throw         rank R throws a std::runtime_error (not an spmd::Error) while the others
//                         wait in a barrier
//   --drill=oom           every rank adds a [2^20, 1] and a [1, 2^20] f32 tensor: the broadcast
//                         result needs 4 TiB
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [&](World& world) {
    std::string drill = "none";
    int rank = -1;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.starts_with("--drill=")) drill = std::string(arg.substr(8));
      if (arg.starts_with("--drill-rank=")) rank = std::atoi(argv[i] + 13);
    }
    for (int r : world.held_ranks()) fmt::print("drill: rank {} ready\n", r);
    std::fflush(stdout);
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"all"});
    if (drill == "return-first" && world.holds(rank)) return;
    if (drill == "oom") {
      const int64_t n = int64_t{1} << 20;
      LocalTensor column = LocalTensor::from_fn(world, [&](int) { return zeros({n, 1}); });
      LocalTensor row = LocalTensor::from_fn(world, [&](int) { return zeros({1, n}); });
      LocalTensor sum = column + row;  // broadcasts to [2^20, 2^20] f32: 4 TiB on every rank
      fmt::print("drill: allocated {}\n", sum.shard(world.held_ranks()[0]).numel());
      return;
    }
    LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({4}, r); });
    LocalTensor y = all_reduce(x, mesh, "all");
    if (drill == "stall" && world.holds(rank)) std::this_thread::sleep_for(std::chrono::hours(1));
    if (drill == "return" && world.holds(rank)) return;
    if (drill == "die" && world.holds(rank)) {
      // The others go on to the barrier at once; a moment's wait makes sure they are waiting
      // there (not still between the calls) when mpirun sees this rank die and stops them.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    if (drill == "stop" && world.holds(rank)) {
      // As for die: the others are waiting in the barrier when this rank stops.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGSTOP);
    }
    if (drill == "elsewhere" && world.holds(rank)) {
      DeviceMesh pairs = init_device_mesh(world, {world.size() / 2, 2}, {"pairs", "pair"});
      all_reduce(x, pairs, "pair");
    }
    if (drill == "throw" && world.holds(rank)) throw std::runtime_error("drill: planted failure");
    if (drill == "return-pair") {
      DeviceMesh pairs = init_device_mesh(world, {world.size() / 2, 2}, {"pairs", "pair"});
      LocalTensor one = LocalTensor::from_fn(world, [](int) { return ones({4}); });
      all_reduce(one, pairs, "pair");
      if (world.holds(rank) || world.holds(rank ^ 1)) return;
      LocalTensor two = all_reduce(one, pairs, "pair");
      fmt::print("drill: pair done {}\n", two.shard(world.held_ranks()[0]).to_vector<float>()[0]);
      return;
    }
    barrier(mesh);
    fmt::print("drill: done {}\n", y.shard(world.held_ranks()[0]).to_vector<float>()[0]);
  });
}
