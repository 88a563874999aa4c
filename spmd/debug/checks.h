// spmd/debug/checks.h: the checks of --spmd-debug=check,replicate,nan (fingerprint lives in the
// real backends, Note [Collective fingerprint] in collectives/fingerprint.h).
//
// Note [Check modes]
// launch() turns them on from --spmd-debug / SPMD_DEBUG; a test turns them on for one world:
//
//   World world = World::sim(4);
//   set_debug(world, DebugOptions{.check = true});
//
// While a world with any of them lives, an observer of every DTensor op (dtensor/hooks.h) is
// installed; it reads the debug options of the op's world, so other worlds pay one atomic load.
//   check      (sim) every DTensor op, redistribute included, is recomputed on full tensors: the
//              inputs' and the output's global values are assembled from every rank's piece
//              (Partial pieces reduced as Note [Reduction order] says), the op's reference runs
//              on the inputs, and the first op whose output differs beyond check_tolerance is a
//              DivergenceError naming the op, the placements and shapes, the largest error, its
//              index and the ranks holding that element. No collective runs for the check, so the
//              user's trace and the per-group sequence numbers stay as they are, and the
//              recomputation is plain Tensor code (no DTensor op, so no recursion).
//   replicate  (sim) for every input and the output of every DTensor op, the pieces of the ranks
//              along each Replicate mesh dim must be identical (bitwise; NaN equals NaN): the
//              first difference is a DivergenceError naming the op, the tensor, the mesh dim, the
//              two ranks, the group and the first differing index.
//   nan        the first op whose result holds NaN or Inf is a NonFiniteError naming the op, the
//              rank and the index, and saying whether its inputs were finite: DTensor ops (this
//              observer), collectives (set_collective_observer, collectives/functional.h) and
//              LocalTensor arithmetic (set_local_op_observer, world/local_ops.h). The LocalTensor
//              hook has no world, so it is on in the whole process while a world with nan lives
//              (the sharding and plan caches keep the worlds of past ops alive until the next
//              world is made, Note [Caches and worlds] in world/world.h, or clear_sharding_cache()
//              and clear_redistribute_cache()).
// check and replicate compare every rank's piece. Under sim the process holds them; under threads
// and mpi (one rank per thread or process) each check first gathers every piece of its inputs and
// output over the mesh with internal collectives (collectives/functional.h: own communicator, not
// traced), so every rank reaches the same verdict and the program's trace is unchanged. nccl
// refuses them (ConfigError): they would gather every piece onto every GPU. Both look at inputs
// first: an input whose replicas already differ is reported before the op is blamed, and
// from_local's Replicate claims are checked against the pieces it was given. Every report names
// the user's line of the op (OpEvent::location). fingerprint is read by a real backend when it is
// created (its driver gets the debug options in WorldRequest), not by set_debug.
//   nan:allow-inf  like nan, but only NaN is reported (-inf attention masks are meant).
//   types      SPMD types of local code (Note [SPMD types] in world/spmd_types.h): every
//              LocalTensor op, local collective, to_local and from_local infers and checks the
//              R/I/V/P type of each mesh axis (a TypeError at the user's line); under sim (part
//              of `all` there) the types are also checked against the data where they are claimed
//              (Note [Types against the data]). Under threads and mpi the rules run on each rank
//              without the data check (it would need every shard), so `all` leaves it out there;
//              list it to get the rules. Process-wide while a world with it lives, like nan.
//
// Note [Shadow run]
// Under sim one process plays every rank and World::is_coordinator() is true, so a collective
// inside `if (world.is_coordinator())` runs as if every rank called it; on a cluster only rank 0
// would, and the job hangs. --spmd-debug=divergence (sim, part of `all`) makes launch() run the
// program twice: first as a rank that is not the coordinator (is_coordinator() false, its stdout
// discarded, nothing traced), recording the kind, mesh dim and source line of every collective;
// then as usual, comparing each collective with the record at the same position. The first that
// differs is a DivergenceError at the coordinator's line naming what the other ranks issue there;
// a coordinator that ends with collectives left in the record is one at the other ranks' line.
// Costs a second run of the program; the program must not depend on state the first run changes
// (files it writes, globals).
#pragma once

#include <spmd/dtensor/dtensor.h>
#include <spmd/tensor/dtype.h>

namespace spmd {

// Turns the checks of --spmd-debug on or off for `world` (and every copy of its handle): stores the
// options in the world and, while any of check, replicate or nan is on, keeps their observers
// installed. launch() calls it with the parsed --spmd-debug. ConfigError for check or replicate on
// a world that holds neither every rank nor exactly one CPU rank (a world of one rank per process
// or thread gathers the pieces over internal collectives), for divergence outside sim, and for an
// unresolved `all`.
void set_debug(World& world, const DebugOptions& debug);

// Creates the communicator that check and replicate gather pieces over on `mesh` (internal: the
// flattened mesh of Note [Check modes]), which they otherwise create at the first op on the mesh;
// nothing when neither is on. Under mpi creating a communicator is collective over every process,
// so a program whose meshes only some processes use (pipeline stages, Note [Ranks outside the
// mesh] in dtensor/dtensor.h) calls this for each such mesh on every process, in the same order,
// before the first op.
void create_debug_communicators(const DeviceMesh& mesh);

// How far a sharded float result may be from the single-device one under check mode: elementwise
// |got - expected| <= atol + rtol * |expected| (reductions and matmuls sum in another order).
// F64: 1e-9, 1e-12; F32: 1e-4, 1e-5; BF16 and F16: 2e-2, 1e-2. Integers and bool: exact.
struct CheckTolerance {
  double rtol = 0.0;
  double atol = 0.0;
};
CheckTolerance check_tolerance(DType dtype);

// The shadow run's phases (launch() calls them; Note [Shadow run]): record the collectives of the
// worlds with divergence on; compare the next run's collectives with the record (DivergenceError
// at the first that differs; `shadow_completed` false when the recorded run threw part way, so
// only its calls are compared); after that run, DivergenceError when the record has more; end.
void shadow_run_record();
void shadow_run_compare(bool shadow_completed);
void shadow_run_finish();
void shadow_run_end();

// The global value of `tensor` built from the pieces this process holds, with no communication
// (Partial mesh dims reduced in group-rank order, innermost first). Needs every rank of the mesh
// held (sim); PlacementError otherwise.
Tensor assemble_full_tensor(const DTensor& tensor);

}  // namespace spmd
