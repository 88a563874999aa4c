// spmd/debug/parity.h: the run on one rank that every DTensor of the real run is compared with.
//
// Note [Parity run]
// "The loss changes when I change the mesh": --spmd-debug=parity (sim, part of `all` there) makes
// launch() run the program twice in this process. First on a reference world that holds rank 0
// alone: every mesh made on it (init_device_mesh, DeviceMesh::from_ranks) has the same dim names
// with every dim of size 1, so every collective is an identity and every DTensor is its full
// tensor on one rank. World::size() stays the requested size, so a program that derives its mesh
// shape from it, or checks it, runs unchanged.
//   Kept dims. A dim named "pp" keeps its size there: a pipeline's stages hold different layers,
// not pieces of one tensor, and its schedule runs the same on both worlds; its coordinates become
// ranks 0..pp-1 of the reference, each stage computing on one rank (a stage mesh made from the
// reference's rank table is the stage's rank; one from hard-coded ranks it does not hold is rank
// 0). A dim over which local code issues a collective whose arguments need its real size (a
// permute's dst_of or all_to_all's splits with one entry per real rank, a broadcast from rank 1)
// is kept too: the collective throws ParityRestart (world/world.h) there and the reference starts
// again keeping that dim (the summary names it and the collective's line). A kept dim is the
// same in both runs, so a bug along it is not found; the other dims still are. Its stdout is
// discarded and nothing is traced. Then on the requested world, as usual. Randomness is
// mesh-invariant (a random DTensor is a function of its seed and global shape, dtensor/random.h),
// so init, dropout masks and data are the same in both runs. At every user call site that makes a
// DTensor (a table op, redistribute, from_local, full_tensor, the gradient arriving at a to_local,
// and in an optimizer step each parameter's gradient and new value) the reference run records its
// full value; the real run compares its own full value with the one recorded at the same line for
// the same op, occurrence by occurrence. The first that differs by more than the tolerance is a
// ParityError at that line, naming the op, the worst index with both values, the placements and the
// last site that still agreed. Local code is covered through the DTensors it feeds (from_local, the
// gradient at to_local).
//   The difference is norm-wise relative: max |got - ref| / max |ref| over the tensor (an element
// near zero weighs no more than the largest). Tolerance by dtype: F64 1e-9, F32 1e-3, BF16 and F16
// 5e-2 (sums in another order, carried through a few training steps: F32 AdamW on the GPT departs
// by 2e-4 in its second step); --spmd-parity-tol=X sets it for
// every float dtype; integers and bool compare exactly. The dtype is the DTensor's: F32 master
// weights trained in BF16 (Note [Mixed precision]) have F32 gradients with BF16's rounding, and
// need --spmd-parity-tol=5e-2. Measured on llama BF16 with F32 masters under FSDP: the gradients
// depart by 2e-3, and after one AdamW step the BF16 weights by up to 0.16 of their largest (Adam's
// first update is about lr times the gradient's sign, and BF16 rounding flips the sign of
// near-zero gradient elements): compare such runs over their first step. An optimizer step's new
// values get 100 times the tolerance: Adam divides each gradient element by its root mean square
// plus eps, so an element near 0 turns the last bits of a sum's order into a visible part of its
// update (a wrong learning rate, a missing or doubled step still differ by far more; the gradients
// themselves are compared at the plain tolerance).
//   Not compared: calls inside another public call (nested_call in core/call_site.h: an op inside
// nn::moe, a redistribution inside an op, a derivative; their sequence may depend on the mesh, a
// ring has cp steps), sites whose global shapes differ between the runs, and occurrences only
// one run reaches (a loop over a mesh size). The report counts them.
//   A program that still cannot run there (it indexes a mesh's ranks beyond the first on a
// collapsed dim, or needs such a dim larger than 1) fails the parity run: a ConfigError naming
// the error and its line. A program that sizes its data by World::size() rather than by
// its mesh makes DTensors of other global shapes there: those are not compared. Under
// `all` the parity run is then skipped with a note on stderr and the other checks go on.
//   Tensors above kParitySampleLimit elements keep every k-th element only. Cost: a second run of
// the program on one rank plus one full copy per DTensor made (bench/parity_bench: 2.09x the plain
// run at the GPT example's shape, 2.47x at d_model 256, on 2 cores).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spmd/dtensor/dtensor.h>
#include <spmd/tensor/dtype.h>

namespace spmd {

// Tensors with more elements are sampled (every k-th flat element, k the smallest that keeps at
// most this many).
inline constexpr int64_t kParitySampleLimit = int64_t{1} << 20;

// The largest norm-wise relative difference parity accepts for `dtype`: `override` when above 0
// and `dtype` is a float type, else the defaults of Note [Parity run] (0 for integers and bool).
double parity_tolerance(DType dtype, double override = 0.0);

// The full value of one DTensor at one call site, as parity keeps it.
struct ParityValue {
  Shape shape;
  DType dtype = DType::F32;
  std::string placements;  // "(S(0), R) on DeviceMesh((dp=2, tp=4), ...)"
  int64_t stride = 1;      // every stride-th flat element is kept
  std::vector<double> values;
};

// Where two values of one site differ most: the flat index kept, the two values and the
// norm-wise relative difference.
struct ParityDeparture {
  int64_t flat = 0;
  double got = 0.0;
  double expected = 0.0;
  double relative = 0.0;
};

// `tensor` (a full value) as parity keeps it.
ParityValue parity_value(const Tensor& tensor, std::string placements);
// The worst element of `got` against `expected` when their relative difference exceeds `tol`;
// nullopt when they agree. Both must have the same shape and stride.
std::optional<ParityDeparture> parity_departure(const ParityValue& got, const ParityValue& expected,
                                                double tol);

// launch()'s phases of a parity run (Note [Parity run]): record every DTensor made on `reference`
// (the one-rank world, WorldState::parity_reference); end the recording; compare every DTensor made
// on `world` with the record (ParityError at the first that departs); end (drops the record).
void parity_record(const World& reference);
void parity_compare(const World& world);
void parity_end();
// The last DTensor the record phase saw ("'mul' at train.cpp:42 (occurrence 3)"), "" before
// any: where a one-rank run that failed had got to.
std::string parity_last_recorded();
// "parity: 1520 DTensors compared at 61 call sites, 12 not compared (...)": what the last compare
// phase did, for tests and the --spmd-debug note.
std::string parity_summary();

}  // namespace spmd
