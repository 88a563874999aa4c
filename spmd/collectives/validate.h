// spmd/collectives/validate.h: argument checks shared by every backend.
//
// check_local runs in the functional layer on each held rank's own input (every backend sees
// it); check_group runs where several ranks' inputs are visible at once (the sim backend, the
// threads backend's rendezvous). Both throw CommError naming the collective, the mesh dim, the
// group's ranks and the shapes, so a user can find the call.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/world.h>

namespace spmd {

// What one call is, for messages.
struct CollectiveCall {
  CollectiveKind kind;
  std::string dim_name;                     // mesh dim name
  const std::vector<int>* group = nullptr;  // the group's ranks, in group order
};

// "all_reduce over mesh dim 'tp' (group ranks [0, 1])".
std::string describe_call(const CollectiveCall& call);

// Checks that the mesh's world holds every rank of the input (`ranks`, ascending): a LocalTensor
// made for another World (a larger sim world, another rank thread's) would otherwise lose the
// ranks the mesh cannot see. CommError naming the call, the first such rank and the world.
void check_input_ranks(CollectiveKind kind, const std::string& dim_name,
                       const std::vector<int>& ranks, const World& world);
// Checks one rank's input against options that need no other rank's data: dims in range,
// divisibility by the group size, src/dst/destinations in range, split sizes that add up, reduce
// ops valid for the dtype. `group_size` is the size of the rank's group.
void check_local(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
                 const CollectiveOptions& options);

// Checks that the inputs of one group agree: same dtype and shape (a ragged collective's: same
// shape except dim 0, Note [Ragged collectives]). `inputs[i]` is group rank i's input
// (call.group gives the ranks).
void check_group(const CollectiveCall& call, const std::vector<const Tensor*>& inputs);
// all_to_all_single's part of it, run by its compute_group: each rank's out_splits[i] equal to
// rank i's in_splits[me].
void check_group_splits(const CollectiveCall& call, const std::vector<const Tensor*>& inputs,
                        const AllToAllSingleOptions& o);

// One member's call where each member passes its own options (the threads rendezvous): its global
// rank, its input's shape and its options, in group order.
struct MemberCall {
  int rank;
  const Shape* shape;
  const CollectiveOptions* options;
};

// How the per-rank values of a ragged collective's members fail to fit together: `what` they are
// ("split sizes") and one line per pair of members that disagree.
struct RaggedMismatch {
  std::string what;
  std::vector<std::string> lines;
};

// For members that issued the same ragged collective (Note [Ragged collectives]): how their
// per-rank values disagree, nullopt when they fit together. nullopt for other collectives.
std::optional<RaggedMismatch> ragged_mismatch(std::span<const MemberCall> members);
// The options compute_group takes for the group: a ragged collective's members' per-rank values
// merged into one options value (even splits spelled out); other collectives' first member's.
CollectiveOptions merge_ragged(std::span<const MemberCall> members);

// The split sizes rank `rank` uses for a dim of `size` rows over `group_size` peers: the given
// list, or an even split when it is empty.
std::vector<int64_t> resolve_splits(const PerRank<std::vector<int64_t>>& splits, int rank,
                                    int64_t size, int64_t group_size);

}  // namespace spmd
