// A minimal program against the installed spmdsim: the umbrella header beside the consumer's own
// core/error.h and tensor/tensor.h, then launch() running a tensor op, a mesh and a collective
// under the sim backend. Prints the backends the program links and "consumer ok" on success.
#include <spmd/spmd.h>

#include <cstdio>
#include <string>

#define CONSUMER_OWN_HEADERS
#include "core/error.h"
#include "tensor/tensor.h"
#undef CONSUMER_OWN_HEADERS

int main(int argc, char** argv) {
  const consumer::Error mine("the consumer's own Error");
  const consumer::Tensor own{4};
  std::string linked;
  for (const spmd::BackendDriver* driver : spmd::backend_drivers()) {
    linked += (linked.empty() ? "" : ", ") + driver->name;
  }
  std::printf("backends linked: %s\n", linked.c_str());
  // The dry run's machine files are installed with the package (load throws ConfigError for a
  // missing or malformed file).
  try {
    const spmd::DeviceSpec h100 =
        spmd::DeviceSpec::load(SPMDSIM_MACHINES_DIR "/h100_sxm.device.json");
    std::printf("machine file: %s, %g TFLOP/s bf16\n", h100.name.c_str(), h100.tflops_bf16);
  } catch (const spmd::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return spmd::launch(argc, argv, [&](spmd::World& world) {
    using namespace spmd;
    DeviceMesh mesh = init_device_mesh(world, {world.size() / 2, 2}, {"dp", "tp"});
    LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
    Tensor total = all_reduce(x, mesh, "tp").shard(3);
    // Ranks 2 and 3 form the tp group of rank 3: 2 + 3 = 5.
    if (total.to_vector<float>() != std::vector<float>{5, 5} || own.elements != 4 ||
        mine.what().empty()) {
      return 1;
    }
    std::printf("consumer ok (spmdsim %s, %s backend, %d ranks)\n", SPMD_VERSION_STRING,
                world.backend_name().c_str(), world.size());
    return 0;
  });
}
