// bench/checkpoint_bench.cpp: checkpoint::save and checkpoint::load throughput (spmd/nn/
// checkpoint.h) against `cp -r` of the same folder, on 8 sim ranks in $TMPDIR (or /tmp):
//   save_gbps  bytes of the state / the seconds of save (every piece written once, the index, the
//              rename)
//   load_gbps  the same for load onto another mesh ((dp=4, tp=2) from (dp=2, tp=4): every piece
//              read from the chunks that overlap it)
//   cp_gbps    `cp -r` of the checkpoint folder: what the disk gives a plain copy
// State: 8 F32 matrices of 4096 x 2048 (256 MiB), sharded (dp, tp) on save, (tp, dp) on load.
//
//   build/bench/bench/checkpoint_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/spmd.h>

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void BM_checkpoint(benchmark::State& state) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string root = fmt::format("{}/spmd_checkpoint_bench", tmp != nullptr ? tmp : "/tmp");
  std::filesystem::remove_all(root);
  World world = World::sim(8);
  const DeviceMesh a = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const DeviceMesh b = init_device_mesh(world, {4, 2}, {"dp", "tp"});
  std::vector<DTensor> saved, loaded;
  for (int i = 0; i < 8; ++i) {
    saved.push_back(randn({4096, 2048}, a, {Shard{0}, Shard{1}}, static_cast<uint64_t>(i)));
    loaded.push_back(distribute_tensor(zeros({4096, 2048}), b, {Shard{1}, Shard{0}}));
  }
  checkpoint::StateDict out, in;
  for (int i = 0; i < 8; ++i) {
    out[fmt::format("w{}", i)] = &saved[static_cast<size_t>(i)];
    in[fmt::format("w{}", i)] = &loaded[static_cast<size_t>(i)];
  }
  const double bytes = 8.0 * 4096 * 2048 * 4;
  const std::string dir = root + "/ckpt";
  double save_s = 1e300, load_s = 1e300, cp_s = 1e300;
  for (auto _ : state) {
    for (int round = 0; round < 3; ++round) {
      save_s = std::min(save_s, seconds([&] { checkpoint::save(world, out, dir); }));
      load_s = std::min(load_s, seconds([&] { checkpoint::load(in, dir); }));
      std::filesystem::remove_all(root + "/copy");
      cp_s = std::min(cp_s, seconds([&] {
                        if (std::system(fmt::format("cp -r {} {}/copy", dir, root).c_str()) != 0) {
                          throw std::runtime_error("cp failed");
                        }
                      }));
    }
  }
  state.counters["save_gbps"] = bytes / save_s / 1e9;
  state.counters["load_gbps"] = bytes / load_s / 1e9;
  state.counters["cp_gbps"] = bytes / cp_s / 1e9;
  std::filesystem::remove_all(root);
}
BENCHMARK(BM_checkpoint)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace spmd
