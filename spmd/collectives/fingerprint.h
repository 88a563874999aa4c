// spmd/collectives/fingerprint.h: the record the members of a group exchange before a collective on
// a real backend, and its comparison. One schema for the mpi and nccl backends.
//
// Note [Collective fingerprint]
// A real backend cannot see its peers' calls: if one member of a group issues another collective,
// another shape or dtype, or runs on a communicator that belongs to another group, MPI and NCCL
// hang, truncate or silently misread buffers. So before its library call every member builds one
// CollectiveFingerprint of what it is about to do, the group allgathers them over the group's own
// communicator (the raw bytes: MPI_Allgather of MPI_BYTE, ncclAllGather of ncclUint8, one struct
// per member in group order) and every member runs check_fingerprints on the same array, so all
// of them throw the same error instead of waiting.
//
// Fields (all fixed size; `memset` the struct first, the bytes travel as they are):
//   kind, dtype, ndim      CollectiveKind, DType, input dims (numeric values of the enums)
//   dims[8]                the input's first 8 sizes (messages only)
//   shape_hash             every size, but dim 0 for a ragged collective (its rows differ per
//                          rank: Note [Ragged collectives])
//   options_hash           the options every member must pass alike (shared_hash(options): every
//                          field but the per-rank ones, so not all_to_all_single's split sizes)
//   group_hash, group_size the group's ranks (in group order) and mesh dim name as this member
//                          sees them: a communicator reused by another group (communicators
//                          created in different orders) shows up here
//   sequence               fingerprint mode: calls issued on this communicator before this one
//                          (under an SPMD program the `seq` of this call's trace record)
//   dim_name, detail, site mesh dim, describe(options), "file.cpp:12" (fingerprint mode), for
//                          messages
//
// The comparison: a different kind, options, group or sequence is a CollectiveMismatchError
// listing every member's entry; a different shape or dtype is the CommError the sim backend gives
// ("inputs differ within the group"), or with fingerprint mode on, a CollectiveMismatchError with
// every member's entry and call site. Ranks that call on different groups wait in different
// exchanges: no fingerprint can see that; the flight recorder's dump shows each rank's pending
// call.
#pragma once

#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <spmd/collectives/types.h>
#include <spmd/collectives/validate.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

constexpr int kFingerprintDims = 8;

struct CollectiveFingerprint {
  int32_t kind;
  int32_t dtype;
  int32_t ndim;
  int32_t group_size;
  uint64_t shape_hash;
  uint64_t options_hash;
  uint64_t group_hash;
  uint64_t sequence;
  int64_t dims[kFingerprintDims];
  char dim_name[24];
  char detail[48];
  char site[72];
};
static_assert(std::is_trivially_copyable_v<CollectiveFingerprint>);
static_assert(sizeof(CollectiveFingerprint) == 256);

// What one member is about to do. `with_site`: fingerprint mode (sequence and call site filled).
struct FingerprintInput {
  const CollectiveOptions* options;  // the call: its kind, shared_hash and describe() text
  const Tensor* input;
  std::string_view dim_name;
  const std::vector<int>* group;  // the group's ranks, in group order
  bool with_site = false;
  uint64_t sequence = 0;
  std::source_location location = {};
};
CollectiveFingerprint make_fingerprint(const FingerprintInput& in);

// Throws when the members' fingerprints differ (the note says which error). `all[k]` is group
// rank k's, `members[k]` its global rank; `fingerprint`: fingerprint mode; `same_site`: the
// members must also call from the same line (the debug checks' own collectives,
// Communicator::is_internal; needs fingerprint mode).
void check_fingerprints(const CollectiveCall& call, std::span<const CollectiveFingerprint> all,
                        const std::vector<int>& members, bool fingerprint, bool same_site = false);

// "all_reduce [4, 8] f32 op=sum", with " (call #3 at train.cpp:12)" in fingerprint mode.
std::string fingerprint_text(const CollectiveFingerprint& f, bool fingerprint);

}  // namespace spmd
