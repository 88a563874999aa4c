// spmd/world/local_tensor.h: LocalTensor, one Tensor shard per held rank.
//
// Under the sim backend a LocalTensor holds a shard for every rank of the world; under threads,
// mpi and nccl it holds the caller's rank (or ranks). Shards may differ in shape (uneven
// sharding) but share one dtype and one number of dims. Every Tensor op applies shard by shard
// (world/local_ops.h); collectives (collectives/functional.h) turn the shards of each group into
// the group's result. A LocalTensor may hold a subset of the world's ranks (MPMD-style code).
//
//   World world = World::sim(4);
//   LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
//   LocalTensor y = x * 2.0 + 1.0;             // shard by shard
//   fmt::print("{}\n", y);                     // one line per rank
//
// Note [Copy-on-write replicas]
// Shards known to be identical share one buffer: replicate() and the results of all_reduce,
// broadcast and all_gather hold the same Tensor for every rank, so a replicated LocalTensor over
// R ranks costs the memory of one shard (bytes_held() reports it). Shard-by-shard ops on a
// replicated LocalTensor compute once and share the result. A rank's shard is copied only when
// that rank writes to it through mutable_shard(); reading never copies. shard() hands out a
// const reference: a Tensor handle copied out of it aliases the shared buffer, so writing
// through such a copy would change every rank; write through mutable_shard() instead.
//
// Note [Shard classes]
// Shape-only shards (Note [Shape-only tensors] in tensor/meta.h) are equal when their shapes,
// strides and dtypes are, so a LocalTensor of meta shards keeps one shard per *class* of ranks
// whose shards are equal, plus the class of every rank (shared between the LocalTensors an op
// derives from one another). Shard-by-shard ops, DTensor ops and the sim backend's collectives
// compute once per class, so a dry run over 16384 ranks of a mesh whose shards have a handful of
// distinct shapes costs about what a handful of ranks cost. shard(), shard_at() and every
// accessor answer per rank as before; shards() builds the full per-rank vector on first use (an
// O(ranks) fallback for code that wants it); mutable_shard() and set_shard() expand the classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/call_site.h>
#include <spmd/core/format.h>

#include <spmd/tensor/autograd_meta.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/per_rank.h>
#include <spmd/world/world.h>

namespace spmd {

enum class SpmdType : uint8_t;  // world/spmd_types.h
struct SpmdTypes;

class LocalTensor {
 public:
  // An undefined LocalTensor (no ranks); defined() is false.
  LocalTensor() = default;
  // Shards for `ranks` (ascending, unique, non-empty), one per rank, all defined, with one
  // dtype and one dim count; Error otherwise, naming the offending ranks.
  LocalTensor(std::vector<int> ranks, std::vector<Tensor> shards);
  // The same ranks as `like` (no rank-list copy), with new shards.
  LocalTensor(const LocalTensor& like, std::vector<Tensor> shards);
  // The same ranks as `like`, shard classes (Note [Shard classes]): rank i (by position in
  // ranks()) holds class_shards[(*classes)[i]].
  LocalTensor(const LocalTensor& like, std::vector<Tensor> class_shards,
              std::shared_ptr<const std::vector<uint32_t>> classes);
  // The same over a shared rank list (ascending, unique, non-empty); null classes: one shard per
  // rank.
  LocalTensor(std::shared_ptr<const std::vector<int>> ranks, std::vector<Tensor> class_shards,
              std::shared_ptr<const std::vector<uint32_t>> classes);

  // A copy of `t` on every held rank of `world`, stored once per device (Note [Copy-on-write
  // replicas]); on each rank's device (World::device_of: a GPU under nccl).
  // With types on (world/spmd_types.h) the result is R on every axis, from the caller's line.
  static LocalTensor replicate(const World& world, const Tensor& t,
                               SourceLocation loc = SourceLocation::current());
  static LocalTensor replicate(const std::vector<int>& ranks, const Tensor& t);
  // fn(rank) for every held rank of `world`, moved to the rank's device (World::device_of: a GPU
  // under nccl, Note [NCCL device placement]). The rank-list forms leave shards where fn made them.
  // With types on the result is V on every axis, from the caller's line.
  static LocalTensor from_fn(const World& world, const std::function<Tensor(int rank)>& fn,
                             SourceLocation loc = SourceLocation::current());
  static LocalTensor from_fn(const std::vector<int>& ranks,
                             const std::function<Tensor(int rank)>& fn);

  bool defined() const { return ranks_ != nullptr; }
  const std::vector<int>& ranks() const;
  const std::shared_ptr<const std::vector<int>>& ranks_ptr() const { return ranks_; }
  std::size_t num_shards() const { return ranks_ ? ranks_->size() : 0; }
  bool holds(int rank) const;
  // Position of `rank` in ranks(), or nullopt when not held.
  std::optional<std::size_t> position_of(int rank) const;
  // Position of `rank` in ranks(); Error naming the held ranks when not held.
  std::size_t index_of(int rank) const;

  // The shard of `rank` (read-only; see the note). Error when `rank` is not held.
  const Tensor& shard(int rank) const { return shard_at(index_of(rank)); }
  // The shard of the i-th held rank (position in ranks()).
  const Tensor& shard_at(std::size_t i) const {
    return classes_ ? shards_[(*classes_)[i]] : shards_[i];
  }
  // Shards in ranks() order (built on first use when the shards are in classes).
  const std::vector<Tensor>& shards() const;

  // Note [Shard classes]: whether the shards are kept once per class; the distinct shards; the
  // class of each held rank by position (null when not in classes).
  bool has_classes() const { return classes_ != nullptr; }
  const std::vector<Tensor>& class_shards() const { return shards_; }
  const std::shared_ptr<const std::vector<uint32_t>>& classes() const { return classes_; }
  std::size_t num_classes() const { return shards_.size(); }
  // The shard of `rank`, made private to that rank first if its buffer is shared.
  Tensor& mutable_shard(int rank);
  // Replaces the shard of `rank` (same dtype and dim count).
  void set_shard(int rank, Tensor t);

  PerRank<Shape> shape() const;
  DType dtype() const;
  int64_t dim() const;
  PerRank<int64_t> size(int64_t d) const;
  PerRank<int64_t> numel() const;
  // True when every shard is the same view of one buffer (Note [Copy-on-write replicas]).
  bool is_replicated() const { return replicated_; }
  // Bytes of the distinct buffers the shards view.
  std::size_t bytes_held() const;

  // fn(rank, shard) for every held rank: the escape hatch for rank-specific (MPMD) code.
  // The result keeps the input's SPMD types (checked against the data under sim, Note [SPMD
  // types]).
  LocalTensor map(const std::function<Tensor(int rank, const Tensor& shard)>& fn,
                  SourceLocation loc = SourceLocation::current()) const;
  // The common value of all shards; DivergenceError naming the first rank and element index
  // that differ from the first held rank otherwise.
  Tensor reconcile() const;

  // Shard-by-shard views and copies (see Tensor for each one's meaning). Each member is its free
  // function of world/local_ops.h (t.narrow(0, 0, 1) is narrow(t, 0, 0, 1)): one op-table entry,
  // recorded by autograd and typed like any other op.
  LocalTensor narrow(int64_t d, int64_t start, int64_t length,
                     SourceLocation loc = SourceLocation::current()) const;
  LocalTensor select(int64_t d, int64_t index,
                     SourceLocation loc = SourceLocation::current()) const;
  LocalTensor transpose(int64_t a, int64_t b, SourceLocation loc = SourceLocation::current()) const;
  LocalTensor permute(const std::vector<int64_t>& dims,
                      SourceLocation loc = SourceLocation::current()) const;
  LocalTensor reshape(const Shape& shape, SourceLocation loc = SourceLocation::current()) const;
  LocalTensor unsqueeze(int64_t d, SourceLocation loc = SourceLocation::current()) const;
  LocalTensor squeeze(int64_t d, SourceLocation loc = SourceLocation::current()) const;
  LocalTensor expand(const Shape& shape, SourceLocation loc = SourceLocation::current()) const;
  LocalTensor contiguous(SourceLocation loc = SourceLocation::current()) const;
  LocalTensor clone(SourceLocation loc = SourceLocation::current()) const;
  LocalTensor to(DType dtype, SourceLocation loc = SourceLocation::current()) const;
  // Every shard on `device`. Not recorded by autograd: Unsupported when a shard must move while
  // this LocalTensor takes part in autograd (grad mode on), as for Tensor::to(Device).
  LocalTensor to(Device device) const;

  // One line per rank: "rank 0: [[1, 2], [3, 4]] shape=[2, 2] f32".
  std::string to_string() const;

  // ---- autograd (Note [Autograd] in ops/autograd.h) -----------------------------------------
  // Makes this LocalTensor a leaf whose gradient (a LocalTensor over the same ranks) backward()
  // accumulates; floating dtypes only; Error for one made by recorded ops. Returns *this.
  LocalTensor& requires_grad_(bool requires_grad = true);
  bool requires_grad() const;
  // The gradient accumulated into this leaf; undefined when there is none.
  LocalTensor grad() const;
  // The same shards without autograd state.
  LocalTensor detach() const;
  const std::shared_ptr<AutogradMeta>& autograd() const { return autograd_; }
  void set_autograd(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }

  // ---- SPMD types (Note [SPMD types] in world/spmd_types.h)
  // ---------------------------------------- The type of every axis named so far, and "*" for every
  // other axis; empty when untyped (types off, or a LocalTensor made without a world).
  std::map<std::string, SpmdType> types() const;
  // The types with their origins; null when untyped.
  const std::shared_ptr<const SpmdTypes>& spmd_types() const { return types_; }
  // The same shards with these types (no check: the layers that infer types call it).
  LocalTensor with_types(std::shared_ptr<const SpmdTypes> types) const&;
  LocalTensor with_types(std::shared_ptr<const SpmdTypes> types) &&;

  // Applies fn to every shard, once when the shards are one replicated buffer.
  LocalTensor apply(const std::function<Tensor(const Tensor&)>& fn) const;

 private:
  void check_defined(const char* op) const;
  void update_replicated();
  // Note [Shard classes]: keeps meta shards once per class; back to one shard per rank.
  void group_classes();
  void expand_classes();

  // Unsupported when this LocalTensor takes part in autograd and grad mode is on.
  void check_in_place(const char* op) const;

  std::shared_ptr<const std::vector<int>> ranks_;
  std::vector<Tensor> shards_;  // one per held rank, or one per class (classes_)
  std::shared_ptr<const std::vector<uint32_t>> classes_;
  // shards() of a LocalTensor in classes: built once, shared by copies.
  struct Expanded {
    std::once_flag once;
    std::vector<Tensor> shards;
  };
  std::shared_ptr<Expanded> expanded_;
  bool replicated_ = false;
  std::shared_ptr<AutogradMeta> autograd_;
  std::shared_ptr<const SpmdTypes> types_;
};

// A LocalTensor's autograd state: its gradient is a LocalTensor over the same ranks.
struct LocalAutogradMeta : AutogradMeta {
  LocalTensor local_grad;
};

std::ostream& operator<<(std::ostream& os, const LocalTensor& t);

namespace detail {
// Calls fn(i) for every shard index i < n. Shards are independent, so when `work` (the elements
// the call touches, summed over shards) is large they run in parallel on the thread pool (the
// sim backend would otherwise use one core for every rank's matmul); small calls stay inline.
// Results do not depend on the split. If shards throw, the lowest shard index's error is
// rethrown, so error messages are the same run to run.
void for_each_shard(std::size_t n, int64_t work, const std::function<void(std::size_t)>& fn);
// Elements of all shards together (the `work` of a shard-by-shard op over `t`).
int64_t total_numel(const LocalTensor& t);

// Note [Shard classes]: the classes of ranks for which every operand (all over the same ranks)
// holds the same shard, and one representative position per class. Empty `classes` when no
// operand is in classes (compute per rank as before).
struct JointClasses {
  std::shared_ptr<const std::vector<uint32_t>> classes;
  std::vector<std::size_t> representative;
};
JointClasses joint_classes(const LocalTensor* const* operands, std::size_t n);
}  // namespace detail

}  // namespace spmd

SPMD_FORMAT_AS_TEXT(spmd::LocalTensor, value.to_string())
