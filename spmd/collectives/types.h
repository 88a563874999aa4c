// spmd/collectives/types.h: collective kinds, the options aggregate of each collective, and
// CollectiveOptions, the variant of them all.
//
// Options are small values with == and hashing (STYLE.md, c10d): backends take them, the trace
// records them, and the threads backend compares them across ranks. Roots (src/dst) are ranks
// *within the group* (0 .. group_size-1), never global ranks.
//
// Note [One collective, one options struct]
// A collective is its options struct. The struct names its kind and its functional-API name, and
// lists its fields once (fields()); CollectiveOptions holds one alternative per collective in
// CollectiveKind order. Everything generic is derived from that: the kind of a variant is its
// index, collective_name() reads the structs' names, hash_value() and describe() walk the fields,
// and the cross-rank comparisons (the threads rendezvous, the real backends' fingerprints) walk
// the fields that are not per-rank (Note [Ragged collectives]). Static assertions below keep the
// enum, the names and the variant in one order. The functional layer, the backends, the checks,
// the group math, the type rules and the cost model dispatch on the variant (std::visit, or
// visit_kind on a kind) with one overload per collective and no fallback, so a collective one of
// them does not handle is a compile error there (docs/design.md, "Adding a collective").
//
// Note [Ragged collectives]
// A collective whose members pass different values by design is ragged: all_to_all_single, whose
// ranks each send and receive their own numbers of rows. Its options struct says so with
// `static constexpr bool kRagged = true` and holds the values that differ in PerRank<...> fields
// (a struct has PerRank fields exactly when it is ragged: a static assertion below checks it).
// What follows from the trait, without code that names the collective:
//   - the cross-rank comparisons leave the PerRank fields out (shared_hash,
//     shared_field_differences: the threads rendezvous, the real backends' fingerprints);
//   - the members' inputs may differ in dim 0 (the rows each sends): check_group, the
//     fingerprints' shape hash, the threads rendezvous and `spmd trace diff` compare the rest;
//   - equal shards do not make equal checks or results (Note [Shard classes]): the functional
//     layer checks, and sim computes, every rank on its own;
//   - where each member passes only its own values (the threads rendezvous), ragged_mismatch and
//     merge_ragged (collectives/validate.h) check that they fit together and merge them for
//     compute_group: a ragged collective without those overloads does not compile.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/format.h>
#include <spmd/core/hash.h>
#include <spmd/tensor/reduce_op.h>
#include <spmd/world/per_rank.h>

namespace spmd {

// In the order of CollectiveOptions' alternatives; Barrier stays last.
enum class CollectiveKind {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllToAllSingle,
  Broadcast,
  Scatter,
  Gather,
  Reduce,
  Permute,
  Send,
  Recv,
  Barrier,
};

// One field of an options struct: its name (as describe() prints it) and its value.
template <class T>
struct OptionField {
  std::string_view name;
  const T& value;
};
template <class T>
OptionField(std::string_view, const T&) -> OptionField<T>;

struct AllReduceOptions {
  static constexpr CollectiveKind kind = CollectiveKind::AllReduce;
  static constexpr std::string_view name = "all_reduce";
  ReduceOp op = ReduceOp::Sum;
  auto fields() const { return std::tuple{OptionField{"op", op}}; }
  bool operator==(const AllReduceOptions&) const = default;
};

// Every rank's shard is concatenated along gather_dim, in group order.
struct AllGatherOptions {
  static constexpr CollectiveKind kind = CollectiveKind::AllGather;
  static constexpr std::string_view name = "all_gather";
  int64_t gather_dim = 0;
  auto fields() const { return std::tuple{OptionField{"gather_dim", gather_dim}}; }
  bool operator==(const AllGatherOptions&) const = default;
};

// The reduction is split into group_size equal pieces along scatter_dim (divisible sizes
// only); group rank i keeps piece i.
struct ReduceScatterOptions {
  static constexpr CollectiveKind kind = CollectiveKind::ReduceScatter;
  static constexpr std::string_view name = "reduce_scatter";
  ReduceOp op = ReduceOp::Sum;
  int64_t scatter_dim = 0;
  auto fields() const {
    return std::tuple{OptionField{"op", op}, OptionField{"scatter_dim", scatter_dim}};
  }
  bool operator==(const ReduceScatterOptions&) const = default;
};

// Group rank i splits its shard into group_size equal pieces along split_dim and sends piece j
// to group rank j; rank j concatenates the pieces it receives along concat_dim in source order.
struct AllToAllOptions {
  static constexpr CollectiveKind kind = CollectiveKind::AllToAll;
  static constexpr std::string_view name = "all_to_all";
  int64_t split_dim = 0;
  int64_t concat_dim = 0;
  auto fields() const {
    return std::tuple{OptionField{"split_dim", split_dim}, OptionField{"concat_dim", concat_dim}};
  }
  bool operator==(const AllToAllOptions&) const = default;
};

// Variable all-to-all along dim 0: on rank r, in_splits[j] rows go to group rank j and
// out_splits[i] rows arrive from group rank i. Empty split lists mean an even split. Ragged: the
// split sizes, and so the inputs' dim 0, differ per rank (Note [Ragged collectives]).
struct AllToAllSingleOptions {
  static constexpr CollectiveKind kind = CollectiveKind::AllToAllSingle;
  static constexpr std::string_view name = "all_to_all_single";
  static constexpr bool kRagged = true;
  PerRank<std::vector<int64_t>> out_splits;
  PerRank<std::vector<int64_t>> in_splits;
  auto fields() const {
    return std::tuple{OptionField{"out_splits", out_splits}, OptionField{"in_splits", in_splits}};
  }
  bool operator==(const AllToAllSingleOptions& other) const;
};

// Group rank `src`'s shard is copied to every member.
struct BroadcastOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Broadcast;
  static constexpr std::string_view name = "broadcast";
  int src = 0;
  auto fields() const { return std::tuple{OptionField{"src", src}}; }
  bool operator==(const BroadcastOptions&) const = default;
};

// Group rank `src`'s shard is split into group_size equal pieces along scatter_dim; rank i gets
// piece i. Every member passes a tensor of src's shape and dtype (only src's values are read), so
// every rank knows the result shape without communication.
struct ScatterOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Scatter;
  static constexpr std::string_view name = "scatter";
  int src = 0;
  int64_t scatter_dim = 0;
  auto fields() const {
    return std::tuple{OptionField{"src", src}, OptionField{"scatter_dim", scatter_dim}};
  }
  bool operator==(const ScatterOptions&) const = default;
};

// Group rank `dst` receives every member's shard concatenated along gather_dim; the other
// members get an empty tensor: the input's shape with gather_dim of size 0.
struct GatherOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Gather;
  static constexpr std::string_view name = "gather";
  int dst = 0;
  int64_t gather_dim = 0;
  auto fields() const {
    return std::tuple{OptionField{"dst", dst}, OptionField{"gather_dim", gather_dim}};
  }
  bool operator==(const GatherOptions&) const = default;
};

// Group rank `dst` receives the reduction; the other members get an empty tensor: the input's
// shape with dim 0 of size 0 (so a 0-d input is a CommError: reshape it to [1]).
struct ReduceOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Reduce;
  static constexpr std::string_view name = "reduce";
  ReduceOp op = ReduceOp::Sum;
  int dst = 0;
  auto fields() const { return std::tuple{OptionField{"op", op}, OptionField{"dst", dst}}; }
  bool operator==(const ReduceOptions&) const = default;
};

// Group rank i sends its shard to group rank dst_of[i] (-1: sends nothing). Destinations are
// distinct; a rank that receives nothing gets zeros of its own shape (jax.lax.ppermute).
struct PermuteOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Permute;
  static constexpr std::string_view name = "permute";
  std::vector<int> dst_of;
  auto fields() const { return std::tuple{OptionField{"dst_of", dst_of}}; }
  bool operator==(const PermuteOptions&) const = default;
};

// Note [Point-to-point]
// send and recv move one tensor from one rank to another along a mesh dim: `peer` is a group rank
// of that dim (the receiver of a send, the sender of a recv), so one call under sim (every rank
// of a pipeline stage sends to the next stage) reads as one call per rank on a real backend. They
// are point-to-point (`kPointToPoint`): only the two ranks of a transfer take part, so they are
// not matched by the group's sequence numbers but paired as NCCL pairs them: the k-th send from
// rank a to rank b on a communicator meets the k-th recv at b from a (FIFO, per communicator and
// pair, tags play no part in the pairing). What the sender sends besides the data, its envelope
// (collectives/p2p.h: tag, dtype, shape, whether it carries a gradient, the pipeline stage and
// microbatch, the call site), is compared with what the receiver expects; a difference is a
// CollectiveMismatchError naming both lines, and when a later message from the same sender would
// have matched, the report says the messages were paired out of order (Megatron-LM #5271: NCCL
// pairs tagless sends in FIFO order, so two shapes sent in one order and received in the other
// are silently swapped on a cluster). Per backend:
//   sim      a mailbox per (communicator, sender, receiver): a send is enqueued and completes at
//            once, a recv takes the oldest message. One program runs every rank in program order,
//            so a recv whose message is not sent yet is an error (under sim a send must come
//            before its recv in the program: lockstep), and messages never received are an error
//            when the program returns (launch()).
//   threads  a transfer is a rendezvous of its two ranks: the send waits for its recv, as NCCL's
//            does, so two ranks that both send before they receive deadlock here as they would on
//            GPUs, and are reported (Note [Threads deadlock detection]); isend and
//            batch_isend_irecv post without waiting.
//   mpi      the envelope, then the data (MPI_Isend/MPI_Irecv on the dim's communicator, waited
//            for with the exit notices' polling); the receiver compares the envelope.
//   nccl     ncclSend/ncclRecv of the envelope and the data in one group.
// A matched pair is a copy (group_math.cpp's compute). The send's result is a token: the
// input's ranks with an empty [0] tensor, on which backward() receives the input's gradient
// (the backward of a send is a recv of the gradient; the backward of a recv sends it back).
struct SendOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Send;
  static constexpr std::string_view name = "send";
  static constexpr bool kPointToPoint = true;
  int peer = 0;  // the group rank that receives
  int64_t tag = 0;
  auto fields() const { return std::tuple{OptionField{"peer", peer}, OptionField{"tag", tag}}; }
  bool operator==(const SendOptions&) const = default;
};

struct RecvOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Recv;
  static constexpr std::string_view name = "recv";
  static constexpr bool kPointToPoint = true;
  int peer = 0;  // the group rank that sends
  int64_t tag = 0;
  auto fields() const { return std::tuple{OptionField{"peer", peer}, OptionField{"tag", tag}}; }
  bool operator==(const RecvOptions&) const = default;
};

struct BarrierOptions {
  static constexpr CollectiveKind kind = CollectiveKind::Barrier;
  static constexpr std::string_view name = "barrier";
  auto fields() const { return std::tuple{}; }
  bool operator==(const BarrierOptions&) const = default;
};

// Every collective: the alternative says which (Note [One collective, one options struct]).
using CollectiveOptions =
    std::variant<AllReduceOptions, AllGatherOptions, ReduceScatterOptions, AllToAllOptions,
                 AllToAllSingleOptions, BroadcastOptions, ScatterOptions, GatherOptions,
                 ReduceOptions, PermuteOptions, SendOptions, RecvOptions, BarrierOptions>;
inline constexpr int kNumCollectiveKinds = static_cast<int>(std::variant_size_v<CollectiveOptions>);

namespace detail {

template <class T, class Variant>
struct IsAlternative : std::false_type {};
template <class T, class... Ts>
struct IsAlternative<T, std::variant<Ts...>> : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {
};

template <std::size_t... I>
constexpr bool kinds_follow_the_variant(std::index_sequence<I...>) {
  return (
      (std::variant_alternative_t<I, CollectiveOptions>::kind == static_cast<CollectiveKind>(I)) &&
      ...);
}

template <std::size_t... I>
constexpr std::array<std::string_view, sizeof...(I)> collective_names(std::index_sequence<I...>) {
  return {std::variant_alternative_t<I, CollectiveOptions>::name...};
}

}  // namespace detail

// One of CollectiveOptions' alternatives: AllReduceOptions, ..., BarrierOptions.
template <class T>
concept CollectiveOptionsType = detail::IsAlternative<T, CollectiveOptions>::value;

static_assert(detail::kinds_follow_the_variant(std::make_index_sequence<kNumCollectiveKinds>()),
              "CollectiveOptions' alternatives must be in CollectiveKind order");
static_assert(static_cast<int>(CollectiveKind::Barrier) + 1 == kNumCollectiveKinds,
              "one CollectiveOptions alternative per CollectiveKind");

// Whether collective `Options` is ragged (Note [Ragged collectives]): it sets kRagged.
template <CollectiveOptionsType Options>
constexpr bool is_ragged() {
  return requires {
    requires Options::kRagged;
  };
}

// Whether collective `Options` is point-to-point (Note [Point-to-point]): it sets kPointToPoint.
template <CollectiveOptionsType Options>
constexpr bool is_point_to_point() {
  return requires {
    requires Options::kPointToPoint;
  };
}

namespace detail {

template <class Fields>
struct HasPerRankField;
template <class... T>
struct HasPerRankField<std::tuple<OptionField<T>...>>
    : std::bool_constant<(IsPerRank<T>::value || ...)> {};

template <class Options>
constexpr bool has_per_rank_field() {
  return HasPerRankField<decltype(std::declval<const Options&>().fields())>::value;
}

template <std::size_t... I>
constexpr bool ragged_exactly_with_per_rank_fields(std::index_sequence<I...>) {
  return ((is_ragged<std::variant_alternative_t<I, CollectiveOptions>>() ==
           has_per_rank_field<std::variant_alternative_t<I, CollectiveOptions>>()) &&
          ...);
}

template <std::size_t... I>
constexpr std::array<bool, sizeof...(I)> ragged_kinds(std::index_sequence<I...>) {
  return {is_ragged<std::variant_alternative_t<I, CollectiveOptions>>()...};
}

template <std::size_t... I>
constexpr std::array<bool, sizeof...(I)> point_to_point_kinds(std::index_sequence<I...>) {
  return {is_point_to_point<std::variant_alternative_t<I, CollectiveOptions>>()...};
}

}  // namespace detail

static_assert(
    detail::ragged_exactly_with_per_rank_fields(std::make_index_sequence<kNumCollectiveKinds>()),
    "an options struct has PerRank fields exactly when it sets kRagged (Note [Ragged "
    "collectives])");

// Whether collective `kind` is ragged; false for a value that is no CollectiveKind.
constexpr bool is_ragged(CollectiveKind kind) {
  constexpr std::array<bool, kNumCollectiveKinds> kRagged =
      detail::ragged_kinds(std::make_index_sequence<kNumCollectiveKinds>());
  const auto i = static_cast<std::size_t>(kind);
  return i < kRagged.size() && kRagged[i];
}

// Whether collective `kind` is point-to-point (send, recv); false for a value that is no
// CollectiveKind.
constexpr bool is_point_to_point(CollectiveKind kind) {
  constexpr std::array<bool, kNumCollectiveKinds> kP2P =
      detail::point_to_point_kinds(std::make_index_sequence<kNumCollectiveKinds>());
  const auto i = static_cast<std::size_t>(kind);
  return i < kP2P.size() && kP2P[i];
}

// The collective an options value is for.
inline CollectiveKind kind_of(const CollectiveOptions& options) {
  return static_cast<CollectiveKind>(options.index());
}

// f(std::type_identity<Options>{}) for the options struct of `kind`: dispatch on a kind alone with
// std::visit's exhaustiveness (with an Overloaded f, a collective it has no overload for does not
// compile). Every overload returns the same type.
template <class F>
decltype(auto) visit_kind(CollectiveKind kind, F&& f) {
  return [&]<std::size_t... I>(std::index_sequence<I...>)->decltype(auto) {
    using R = decltype(f(std::type_identity<std::variant_alternative_t<0, CollectiveOptions>>{}));
    constexpr R (*kTable[])(F&) = {+[](F& g) -> R {
      return g(std::type_identity<std::variant_alternative_t<I, CollectiveOptions>>{});
    }...};
    return kTable[static_cast<std::size_t>(kind)](f);
  }
  (std::make_index_sequence<kNumCollectiveKinds>());
}

// "all_reduce", "all_gather", ... (the names of the functional API).
std::string_view collective_name(CollectiveKind kind);
std::optional<CollectiveKind> parse_collective(std::string_view name);

namespace detail {

std::size_t hash_field(const PerRank<std::vector<int64_t>>& splits);
template <class T>
std::size_t hash_field(const std::vector<T>& values) {
  return hash_range(values);
}
template <class T>
std::size_t hash_field(const T& value) {
  return std::hash<T>{}(value);
}

// Appends a field's value as describe() prints it. Integers and reduce ops without fmt: the trace
// describes every call's options.
void append_field_text(std::string& out, const PerRank<std::vector<int64_t>>& splits);  // "even"
void append_field_text(std::string& out, ReduceOp op);                                  // "sum"
void append_field_text(std::string& out, int64_t value);
template <class T>
void append_field_text(std::string& out, const T& value) {
  if constexpr (std::is_integral_v<T>) {
    append_field_text(out, static_cast<int64_t>(value));
  } else {
    out += fmt::format("{}", value);
  }
}

// fn(field) for every field of `o`; with `shared_only`, for the fields every member of a group
// passes alike (all but PerRank fields).
template <bool shared_only, class Options, class Fn>
void for_each_field(const Options& o, Fn&& fn) {
  std::apply(
      [&](const auto&... field) {
        [[maybe_unused]] auto one = [&](const auto& f) {
          using T = std::remove_cvref_t<decltype(f.value)>;
          if constexpr (!shared_only || !IsPerRank<T>::value) fn(f);
        };
        (one(field), ...);
      },
      o.fields());
}

template <bool shared_only, class Options>
std::size_t hash_fields(const Options& o) {
  std::size_t seed = static_cast<std::size_t>(Options::kind);
  for_each_field<shared_only>(o, [&](const auto& f) { hash_combine(seed, hash_field(f.value)); });
  return seed;
}

}  // namespace detail

// The hash of every field (and the kind).
template <CollectiveOptionsType Options>
std::size_t hash_value(const Options& o) {
  return detail::hash_fields<false>(o);
}
std::size_t hash_value(const CollectiveOptions& o);

// The hash of the fields every member of a group must pass alike: all but the per-rank ones, so
// all_to_all_single's split sizes are left out (the fingerprints of the real backends compare
// this; Note [Collective fingerprint]).
std::size_t shared_hash(const CollectiveOptions& o);

// The names of the fields every member must pass alike in which `a` and `b` differ ("op",
// "src", ...); empty when they agree or are options of different collectives.
std::vector<std::string_view> shared_field_differences(const CollectiveOptions& a,
                                                       const CollectiveOptions& b);

// Short text of an options value for traces and error reports: "op=sum", "src=1",
// "split_dim=0 concat_dim=1", "" for barrier.
template <CollectiveOptionsType Options>
std::string describe(const Options& o) {
  std::string out;
  detail::for_each_field<false>(o, [&](const auto& f) {
    if (!out.empty()) out += ' ';
    out += f.name;
    out += '=';
    detail::append_field_text(out, f.value);
  });
  return out;
}
std::string describe(const CollectiveOptions& o);

}  // namespace spmd

template <spmd::CollectiveOptionsType Options>
struct std::hash<Options> {
  std::size_t operator()(const Options& o) const { return spmd::hash_value(o); }
};

SPMD_FORMAT_AS_TEXT(spmd::CollectiveKind, spmd::collective_name(value))
