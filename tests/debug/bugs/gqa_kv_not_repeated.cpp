// Grouped-query attention with 8 query heads and 2 key/value heads, the heads split over tp: the
// key/value heads are passed to attention as they are, neither repeated to the query heads
// (repeat_interleave) nor declared grouped (enable_gqa). Attention refuses the shapes at this
// line instead of broadcasting or reading past the kv heads.
#include <spmd/spmd.h>

using namespace spmd;

int main(int argc, char** argv) {
  return launch(argc, argv, [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"tp"});
    DTensor q = distribute_tensor(randn({2, 8, 16, 4}, 0), mesh, {Shard{1}});
    DTensor k = distribute_tensor(randn({2, 2, 16, 4}, 1), mesh, {Replicate{}});
    DTensor v = distribute_tensor(randn({2, 2, 16, 4}, 2), mesh, {Replicate{}});
    // BUG: k and v have 2 heads for 8 query heads.
    DTensor o = scaled_dot_product_attention(q, k, v, true);  // REPORTED
    print_digest(world, {o.to_local()});
  });
}
