// Context parallelism in local code: the sequence is split over cp and each rank rotates its
// piece of the queries with rotary_embedding's default positions 0..S/cp-1. Only the first cp
// rank's piece starts at position 0: the others need positions r*S/cp.. (rotary_embedding(x,
// positions) with the piece's offset). Shapes, SPMD types and collectives are all right; one
// device has no split and the right positions, so the parity run names the line.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "cp"});
    const Placements layout = {Shard{0}, Shard{1}};  // batch over dp, sequence over cp
    DTensor q = distribute_tensor(randn({4, 16, 2, 8}, 1), mesh, layout);
    DTensor k = distribute_tensor(randn({4, 16, 2, 8}, 2), mesh, layout);
    // BUG: the positions of each rank's piece count from 0.
    LocalTensor q_rot = rotary_embedding(q.to_local());
    DTensor qr = DTensor::from_local(q_rot, mesh, layout);  // REPORTED
    DTensor scores = sum(qr * k, {3});
    print_digest(world, {scores.to_local()});
  });
}
