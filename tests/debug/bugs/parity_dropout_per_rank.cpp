// Tensor parallel MLP in local code with dropout: each tp rank draws its mask for its own piece
// of the hidden activations from the same seed, so the pieces repeat one pattern (Megatron's
// "model-parallel RNG" class: the mask of one device is one draw over the whole activation).
// Nothing fails and the loss looks plausible; the parity run names the line where the masked
// activations become a DTensor again. The mesh-invariant way: a mask DTensor from
// rand(global shape, mesh, placements, seed) (dtensor/random.h), to_local'd.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
    DTensor x = distribute_tensor(randn({8, 16}, 1), mesh, {Shard{0}, Replicate{}});
    DTensor w = distribute_tensor(randn({16, 32}, 2), mesh, {Replicate{}, Shard{1}});
    DTensor h = relu(matmul(x, w));  // [8, 32] rows over dp, features over tp
    LocalTensor hl = h.to_local();
    // BUG: one seed for every rank's piece: a [4, 8] draw, not the block of one [8, 32] draw.
    LocalTensor keep = LocalTensor::from_fn(world, [&](int r) {
      return lt(rand(hl.shard(r).shape(), 7), scalar_tensor(0.9)).to(DType::F32);
    });
    DTensor dropped = DTensor::from_local(hl * keep * (1.0 / 0.9), mesh,  // REPORTED
                                          h.placements());
    print_digest(world, {sum(dropped).to_local()});
  });
}
