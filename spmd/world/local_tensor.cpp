// spmd/world/local_tensor.cpp: LocalTensor construction, access, copy-on-write and printing.
#include <spmd/world/local_tensor.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include <spmd/core/error.h>
#include <spmd/core/format.h>
#include <spmd/core/parallel.h>
#include <spmd/tensor/compare.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/spmd_types.h>

namespace spmd {
namespace {

LocalTensor replicate_on_devices(const World& world, const Tensor& t);
LocalTensor from_fn_on_devices(const World& world, const std::function<Tensor(int)>& fn);
// Two meta shards that no computation can tell apart (Note [Shard classes]).
bool same_meta(const Tensor& a, const Tensor& b) {
  return a.is_same(b) || (a.dtype() == b.dtype() && a.shape() == b.shape() &&
                          a.strides() == b.strides() && a.is_meta() && b.is_meta());
}

std::size_t meta_hash(const Tensor& t) {
  std::size_t h = static_cast<std::size_t>(t.dtype());
  for (int64_t s : t.shape()) h = h * 1000003u ^ static_cast<std::size_t>(s);
  for (int64_t s : t.strides()) h = h * 10007u ^ static_cast<std::size_t>(s);
  return h;
}

}  // namespace

LocalTensor::LocalTensor(std::vector<int> ranks, std::vector<Tensor> shards)
    : shards_(std::move(shards)) {
  if (ranks.empty()) throw_error<Error>("LocalTensor: needs at least one rank");
  if (ranks.size() != shards_.size()) {
    throw_error<Error>("LocalTensor: {} ranks {} but {} shards", ranks.size(), ranks_str(ranks),
                       shards_.size());
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0) throw_error<Error>("LocalTensor: negative rank {}", ranks[i]);
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      throw_error<Error>("LocalTensor: ranks must be ascending and unique, got {}",
                         ranks_str(ranks));
    }
    if (!shards_[i].defined())
      throw_error<Error>("LocalTensor: shard of rank {} is undefined", ranks[i]);
    if (shards_[i].dtype() != shards_[0].dtype()) {
      throw_error<Error>("LocalTensor: shards must share one dtype: rank {} has {}, rank {} has {}",
                         ranks[0], shards_[0].dtype(), ranks[i], shards_[i].dtype());
    }
    if (shards_[i].dim() != shards_[0].dim()) {
      throw_error<ShapeError>(
          "LocalTensor: shards must have the same number of dims: rank {} has shape {}, rank {} "
          "has shape {}",
          ranks[0], shape_str(shards_[0].shape()), ranks[i], shape_str(shards_[i].shape()));
    }
  }
  ranks_ = std::make_shared<const std::vector<int>>(std::move(ranks));
  group_classes();
  update_replicated();
}

LocalTensor::LocalTensor(const LocalTensor& like, std::vector<Tensor> shards)
    : ranks_(like.ranks_), shards_(std::move(shards)) {
  like.check_defined("LocalTensor");
  if (shards_.size() != ranks_->size()) {
    throw_error<Error>("LocalTensor: {} ranks but {} shards", ranks_->size(), shards_.size());
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!shards_[i].defined()) {
      throw_error<Error>("LocalTensor: shard of rank {} is undefined", (*ranks_)[i]);
    }
    if (shards_[i].dtype() != shards_[0].dtype() || shards_[i].dim() != shards_[0].dim()) {
      throw_error<Error>(
          "LocalTensor: shards must share dtype and dim count: rank {} has {} {}, rank {} has {} "
          "{}",
          (*ranks_)[0], shards_[0].dtype(), shape_str(shards_[0].shape()), (*ranks_)[i],
          shards_[i].dtype(), shape_str(shards_[i].shape()));
    }
  }
  group_classes();
  update_replicated();
}

namespace {
const std::shared_ptr<const std::vector<int>>& ranks_of(const LocalTensor& like) {
  if (!like.defined()) throw_error<Error>("LocalTensor: the LocalTensor is undefined");
  return like.ranks_ptr();
}
}  // namespace

LocalTensor::LocalTensor(const LocalTensor& like, std::vector<Tensor> class_shards,
                         std::shared_ptr<const std::vector<uint32_t>> classes)
    : LocalTensor(ranks_of(like), std::move(class_shards), std::move(classes)) {}

LocalTensor::LocalTensor(std::shared_ptr<const std::vector<int>> ranks,
                         std::vector<Tensor> class_shards,
                         std::shared_ptr<const std::vector<uint32_t>> classes)
    : ranks_(std::move(ranks)), shards_(std::move(class_shards)), classes_(std::move(classes)) {
  if (!ranks_ || ranks_->empty()) throw_error<Error>("LocalTensor: needs at least one rank");
  const std::size_t expected = classes_ ? shards_.size() : ranks_->size();
  if ((classes_ && classes_->size() != ranks_->size()) || shards_.size() != expected ||
      shards_.empty()) {
    throw_error<Error>("LocalTensor: {} ranks but {} shards ({} class entries)", ranks_->size(),
                       shards_.size(), classes_ ? classes_->size() : 0);
  }
  for (size_t c = 0; c < shards_.size(); ++c) {
    if (!shards_[c].defined()) throw_error<Error>("LocalTensor: shard {} is undefined", c);
    if (shards_[c].dtype() != shards_[0].dtype() || shards_[c].dim() != shards_[0].dim()) {
      throw_error<Error>(
          "LocalTensor: shards must share dtype and dim count: shard 0 has {} {}, shard {} has {} "
          "{}",
          shards_[0].dtype(), shape_str(shards_[0].shape()), c, shards_[c].dtype(),
          shape_str(shards_[c].shape()));
    }
  }
  if (classes_) {
    expanded_ = std::make_shared<Expanded>();
  } else {
    group_classes();
  }
  update_replicated();
}

void LocalTensor::group_classes() {
  if (classes_ || shards_.size() < 2) return;
  for (const Tensor& t : shards_) {
    if (!t.is_meta()) return;
  }
  auto classes = std::make_shared<std::vector<uint32_t>>(shards_.size());
  std::vector<Tensor> distinct;
  std::unordered_multimap<std::size_t, uint32_t> by_hash;
  uint32_t last = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const Tensor& t = shards_[i];
    uint32_t c = UINT32_MAX;
    if (!distinct.empty() && same_meta(distinct[last], t)) {
      c = last;
    } else {
      const std::size_t h = meta_hash(t);
      auto [lo, hi] = by_hash.equal_range(h);
      for (auto it = lo; it != hi && c == UINT32_MAX; ++it) {
        if (same_meta(distinct[it->second], t)) c = it->second;
      }
      if (c == UINT32_MAX) {
        c = static_cast<uint32_t>(distinct.size());
        distinct.push_back(t);
        by_hash.emplace(h, c);
      }
    }
    (*classes)[i] = c;
    last = c;
  }
  shards_ = std::move(distinct);
  classes_ = std::move(classes);
  expanded_ = std::make_shared<Expanded>();
}

void LocalTensor::expand_classes() {
  if (!classes_) return;
  std::vector<Tensor> all = shards();
  shards_ = std::move(all);
  classes_ = nullptr;
  expanded_ = nullptr;
}

const std::vector<Tensor>& LocalTensor::shards() const {
  if (!classes_) return shards_;
  std::call_once(expanded_->once, [&] {
    expanded_->shards.reserve(classes_->size());
    for (uint32_t c : *classes_) expanded_->shards.push_back(shards_[c]);
  });
  return expanded_->shards;
}

LocalTensor LocalTensor::replicate(const World& world, const Tensor& t, SourceLocation loc) {
  LocalTensor out = replicate_on_devices(world, t);
  if (types_active()) {
    out.types_ = uniform_types(SpmdType::R, "replicate", user_site_or(loc), world);
  }
  return out;
}

namespace {
LocalTensor replicate_on_devices(const World& world, const Tensor& t) {
  const std::vector<Device>& devices = world.state().devices;
  if (devices.empty()) return LocalTensor::replicate(world.held_ranks(), t);
  if (!t.defined()) throw_error<Error>("LocalTensor::replicate: tensor is undefined");
  // One copy per device the held ranks use (Note [NCCL device placement]).
  std::vector<Tensor> shards;
  for (size_t i = 0; i < devices.size(); ++i) {
    size_t same = 0;
    while (same < i && devices[same] != devices[i]) ++same;
    shards.push_back(same < i                   ? shards[same]
                     : t.device() == devices[i] ? t.clone()
                                                : t.to(devices[i]));
  }
  return LocalTensor(world.held_ranks(), std::move(shards));
}
}  // namespace

LocalTensor LocalTensor::replicate(const std::vector<int>& ranks, const Tensor& t) {
  if (!t.defined()) throw_error<Error>("LocalTensor::replicate: tensor is undefined");
  Tensor copy = t.clone();
  return LocalTensor(ranks, std::vector<Tensor>(ranks.size(), copy));
}

LocalTensor LocalTensor::from_fn(const World& world, const std::function<Tensor(int)>& fn,
                                 SourceLocation loc) {
  LocalTensor out = from_fn_on_devices(world, fn);
  if (types_active()) {
    out.types_ = uniform_types(SpmdType::V, "from_fn", user_site_or(loc), world);
  }
  return out;
}

namespace {
LocalTensor from_fn_on_devices(const World& world, const std::function<Tensor(int)>& fn) {
  const std::vector<Device>& devices = world.state().devices;
  if (devices.empty()) return LocalTensor::from_fn(world.held_ranks(), fn);
  const std::vector<int>& ranks = world.held_ranks();
  std::vector<Tensor> shards;
  shards.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    Tensor shard = fn(ranks[i]);
    if (!shard.defined()) {
      throw_error<Error>("LocalTensor: shard of rank {} is undefined", ranks[i]);
    }
    shards.push_back(shard.to(devices[i]));
  }
  return LocalTensor(ranks, std::move(shards));
}
}  // namespace

LocalTensor LocalTensor::from_fn(const std::vector<int>& ranks,
                                 const std::function<Tensor(int)>& fn) {
  std::vector<Tensor> shards;
  shards.reserve(ranks.size());
  for (int r : ranks) shards.push_back(fn(r));
  return LocalTensor(ranks, std::move(shards));
}

void LocalTensor::check_defined(const char* op) const {
  if (!ranks_) throw_error<Error>("LocalTensor::{}: the LocalTensor is undefined", op);
}

const std::vector<int>& LocalTensor::ranks() const {
  check_defined("ranks");
  return *ranks_;
}

bool LocalTensor::holds(int rank) const {
  return position_of(rank).has_value();
}

std::optional<std::size_t> LocalTensor::position_of(int rank) const {
  if (!ranks_) return std::nullopt;
  const std::vector<int>& r = *ranks_;
  // Ranks are usually a contiguous range: answer without searching.
  if (rank < r.front() || rank > r.back()) return std::nullopt;
  const size_t guess = static_cast<size_t>(rank - r.front());
  if (guess < r.size() && r[guess] == rank) return guess;
  auto it = std::lower_bound(r.begin(), r.end(), rank);
  if (it != r.end() && *it == rank) return static_cast<size_t>(it - r.begin());
  return std::nullopt;
}

std::size_t LocalTensor::index_of(int rank) const {
  check_defined("shard");
  if (auto position = position_of(rank)) return *position;
  throw_error<Error>("LocalTensor: rank {} is not held (held ranks {})", rank, ranks_str(*ranks_));
}

void LocalTensor::check_in_place(const char* op) const {
  if (autograd_ != nullptr && grad_enabled() && (autograd_->requires_grad || autograd_->grad_fn)) {
    throw_error<Unsupported>(
        "LocalTensor::{}: an in-place write to a LocalTensor that takes part in autograd: autograd "
        "records no in-place ops; write a new LocalTensor, or do it under NoGradGuard",
        op);
  }
}

LocalTensor& LocalTensor::requires_grad_(bool requires_grad) {
  check_defined("requires_grad_");
  if (requires_grad && !is_floating(dtype())) {
    throw_error<Unsupported>(
        "LocalTensor::requires_grad_: only floating tensors can require gradients, this one is {}",
        dtype());
  }
  if (autograd_ != nullptr && autograd_->grad_fn != nullptr) {
    throw_error<Error>(
        "LocalTensor::requires_grad_: this LocalTensor was made by recorded ops, so its gradient "
        "flows to their inputs; only leaves can be marked (call detach() for a new leaf)");
  }
  if (autograd_ == nullptr) {
    if (!requires_grad) return *this;
    autograd_ = std::make_shared<LocalAutogradMeta>();
  }
  autograd_->requires_grad = requires_grad;
  return *this;
}

bool LocalTensor::requires_grad() const {
  return autograd_ != nullptr && (autograd_->requires_grad || autograd_->grad_fn != nullptr);
}

LocalTensor LocalTensor::grad() const {
  const auto* meta = dynamic_cast<const LocalAutogradMeta*>(autograd_.get());
  return meta != nullptr ? meta->local_grad : LocalTensor();
}

std::map<std::string, SpmdType> LocalTensor::types() const {
  std::map<std::string, SpmdType> out;
  if (types_ == nullptr) return out;
  for (const AxisType& t : types_->axes) out.emplace(t.axis, t.type);
  out.emplace("*", types_->rest.type);
  return out;
}

LocalTensor LocalTensor::with_types(std::shared_ptr<const SpmdTypes> types) const& {
  LocalTensor out = *this;
  out.types_ = std::move(types);
  return out;
}

LocalTensor LocalTensor::with_types(std::shared_ptr<const SpmdTypes> types) && {
  types_ = std::move(types);
  return std::move(*this);
}

LocalTensor LocalTensor::detach() const {
  LocalTensor out = *this;
  out.autograd_ = nullptr;
  return out;
}

Tensor& LocalTensor::mutable_shard(int rank) {
  check_in_place("mutable_shard");
  expand_classes();
  const size_t i = index_of(rank);
  Tensor& shard = shards_[i];
  // Note [Copy-on-write replicas]: any other handle on the buffer (another rank's shard, or a
  // view kept elsewhere) means this rank must get its own copy before writing.
  if (shard.storage().use_count() > 1) {
    shard = shard.clone();
  } else {
    // use_count() is a relaxed load: seeing 1 does not order this rank's writes after the reads
    // another rank thread made before dropping its handle (threads backend, shared results). A
    // copy and release of the handle is an acquire-release decrement of the same counter, which
    // synchronizes with that thread's release of its handle.
    std::shared_ptr<Storage> acquire = shard.storage();
  }
  replicated_ = shards_.size() == 1;
  expanded_ = nullptr;
  return shard;
}

void LocalTensor::set_shard(int rank, Tensor t) {
  check_in_place("set_shard");
  const size_t i = index_of(rank);
  if (!t.defined())
    throw_error<Error>("LocalTensor::set_shard: tensor for rank {} is undefined", rank);
  if (t.dtype() != dtype()) {
    throw_error<Error>("LocalTensor::set_shard: rank {} gets {} {} but the LocalTensor holds {}",
                       rank, t.dtype(), shape_str(t.shape()), dtype());
  }
  if (t.dim() != dim()) {
    throw_error<ShapeError>(
        "LocalTensor::set_shard: rank {} gets shape {} but the LocalTensor's shards have {} dims",
        rank, shape_str(t.shape()), dim());
  }
  expand_classes();
  shards_[i] = std::move(t);
  update_replicated();
}

void LocalTensor::update_replicated() {
  if (classes_) {
    replicated_ = shards_.size() == 1;
    return;
  }
  replicated_ = true;
  for (size_t i = 1; i < shards_.size() && replicated_; ++i) {
    replicated_ = shards_[i].is_same(shards_[0]);
  }
}

PerRank<Shape> LocalTensor::shape() const {
  check_defined("shape");
  if (replicated_) return std::move(PerRank<Shape>(shards_[0].shape())).with_ranks(*ranks_);
  std::vector<Shape> shapes;
  shapes.reserve(num_shards());
  for (size_t i = 0; i < num_shards(); ++i) shapes.push_back(shard_at(i).shape());
  return PerRank<Shape>(*ranks_, std::move(shapes));
}

DType LocalTensor::dtype() const {
  check_defined("dtype");
  return shards_[0].dtype();
}

int64_t LocalTensor::dim() const {
  check_defined("dim");
  return shards_[0].dim();
}

PerRank<int64_t> LocalTensor::size(int64_t d) const {
  check_defined("size");
  std::vector<int64_t> sizes;
  sizes.reserve(num_shards());
  for (size_t i = 0; i < num_shards(); ++i) sizes.push_back(shard_at(i).size(d));
  return PerRank<int64_t>(*ranks_, std::move(sizes));
}

PerRank<int64_t> LocalTensor::numel() const {
  check_defined("numel");
  std::vector<int64_t> n;
  n.reserve(num_shards());
  for (size_t i = 0; i < num_shards(); ++i) n.push_back(shard_at(i).numel());
  return PerRank<int64_t>(*ranks_, std::move(n));
}

std::size_t LocalTensor::bytes_held() const {
  std::unordered_set<const Storage*> seen;
  std::size_t total = 0;
  for (const Tensor& s : shards_) {
    if (seen.insert(s.storage().get()).second) total += s.storage()->nbytes();
  }
  return total;
}

namespace detail {

// Below this many elements per call, waking a pool thread costs more than it saves.
constexpr int64_t kParallelShardWork = int64_t{1} << 16;

void for_each_shard(std::size_t n, int64_t work, const std::function<void(std::size_t)>& fn) {
  if (n < 2 || work < kParallelShardWork) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::exception_ptr> errors(n);
  parallel_for(static_cast<int64_t>(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        fn(static_cast<std::size_t>(i));
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int64_t total_numel(const LocalTensor& t) {
  // Shards in classes are shape-only (Note [Shard classes]): no arithmetic to spread.
  if (t.has_classes()) return 0;
  int64_t total = 0;
  for (const Tensor& s : t.class_shards()) total += s.numel();
  return total;
}

JointClasses joint_classes(const LocalTensor* const* operands, std::size_t n) {
  JointClasses out;
  const LocalTensor* shared = nullptr;  // an operand in classes whose classes all others share
  bool any = false;
  bool same = true;
  for (std::size_t k = 0; k < n; ++k) {
    const LocalTensor& t = *operands[k];
    if (t.has_classes()) {
      any = true;
      if (shared == nullptr) {
        shared = &t;
      } else if (t.classes() != shared->classes() && *t.classes() != *shared->classes()) {
        same = false;
      }
    } else if (!t.is_replicated()) {
      same = false;
    }
  }
  if (!any) return out;
  const std::size_t ranks = operands[0]->num_shards();
  if (same) {
    out.classes = shared->classes();
    out.representative.assign(shared->num_classes(), SIZE_MAX);
    for (std::size_t i = 0; i < ranks; ++i) {
      std::size_t& rep = out.representative[(*out.classes)[i]];
      if (rep == SIZE_MAX) rep = i;
    }
    return out;
  }
  // Mixed: a rank's joint class is the tuple of its operands' classes (a per-rank operand
  // counts as its own class at every rank).
  auto classes = std::make_shared<std::vector<uint32_t>>(ranks);
  std::map<std::vector<std::size_t>, uint32_t> seen;
  std::vector<std::size_t> key(n);
  for (std::size_t i = 0; i < ranks; ++i) {
    for (std::size_t k = 0; k < n; ++k) {
      const LocalTensor& t = *operands[k];
      key[k] = t.has_classes() ? (*t.classes())[i] : t.is_replicated() ? 0 : i;
    }
    auto [it, inserted] = seen.emplace(key, static_cast<uint32_t>(out.representative.size()));
    if (inserted) out.representative.push_back(i);
    (*classes)[i] = it->second;
  }
  out.classes = std::move(classes);
  return out;
}

}  // namespace detail

LocalTensor LocalTensor::map(const std::function<Tensor(int, const Tensor&)>& fn,
                             SourceLocation loc) const {
  check_defined("map");
  std::vector<Tensor> out(num_shards());
  detail::for_each_shard(num_shards(), detail::total_numel(*this),
                         [&](std::size_t i) { out[i] = fn((*ranks_)[i], shard_at(i)); });
  LocalTensor result(*this, std::move(out));
  // The escape hatch keeps the types: a rank-dependent fn on an R or I axis is what the data check
  // is for (Note [Types against the data]).
  if (types_ != nullptr) [[unlikely]] {
    result.types_ = types_;
    check_types_against_data(result, "map", user_site_or(loc));
  }
  return result;
}

LocalTensor LocalTensor::apply(const std::function<Tensor(const Tensor&)>& fn) const {
  check_defined("apply");
  if (classes_) {
    std::vector<Tensor> out;
    out.reserve(shards_.size());
    for (const Tensor& t : shards_) out.push_back(fn(t));
    return LocalTensor(*this, std::move(out), classes_);
  }
  if (replicated_) {
    Tensor one = fn(shards_[0]);
    LocalTensor result(*this, std::vector<Tensor>(shards_.size(), one));
    result.types_ = types_;
    return result;
  }
  std::vector<Tensor> out(shards_.size());
  detail::for_each_shard(shards_.size(), detail::total_numel(*this),
                         [&](std::size_t i) { out[i] = fn(shards_[i]); });
  LocalTensor result(*this, std::move(out));
  result.types_ = types_;
  return result;
}

Tensor LocalTensor::reconcile() const {
  check_defined("reconcile");
  const Tensor& first = shards_[0];
  if (classes_) {
    // Shape-only shards: equal when their shapes are.
    for (size_t i = 1; i < num_shards(); ++i) {
      if (shard_at(i).shape() != first.shape()) {
        throw_error<DivergenceError>(
            "LocalTensor::reconcile: shards differ: rank {} has shape {}, rank {} has shape {}",
            (*ranks_)[0], shape_str(first.shape()), (*ranks_)[i], shape_str(shard_at(i).shape()));
      }
    }
    return first.clone();
  }
  if (!replicated_) {
    for (size_t i = 1; i < shards_.size(); ++i) {
      const Tensor& other = shards_[i];
      if (other.shape() != first.shape()) {
        throw_error<DivergenceError>(
            "LocalTensor::reconcile: shards differ: rank {} has shape {}, rank {} has shape {}",
            (*ranks_)[0], shape_str(first.shape()), (*ranks_)[i], shape_str(other.shape()));
      }
      if (!equal(first, other)) {
        std::vector<double> a = first.to_vector<double>();
        std::vector<double> b = other.to_vector<double>();
        size_t at = 0;
        while (at < a.size() && (a[at] == b[at] || (a[at] != a[at] && b[at] != b[at]))) ++at;
        throw_error<DivergenceError>(
            "LocalTensor::reconcile: shards differ: rank {} and rank {} first differ at flat "
            "index {} ({} vs {}), shape {}",
            (*ranks_)[0], (*ranks_)[i], at, at < a.size() ? a[at] : 0.0,
            at < b.size() ? b[at] : 0.0, shape_str(first.shape()));
      }
    }
  }
  return first.clone();
}

LocalTensor LocalTensor::narrow(int64_t d, int64_t start, int64_t length,
                                SourceLocation loc) const {
  return spmd::narrow(*this, d, start, length, loc);
}
LocalTensor LocalTensor::select(int64_t d, int64_t index, SourceLocation loc) const {
  return spmd::select(*this, d, index, loc);
}
LocalTensor LocalTensor::transpose(int64_t a, int64_t b, SourceLocation loc) const {
  return spmd::transpose(*this, a, b, loc);
}
LocalTensor LocalTensor::permute(const std::vector<int64_t>& dims, SourceLocation loc) const {
  return spmd::permute(*this, dims, loc);
}
LocalTensor LocalTensor::reshape(const Shape& shape, SourceLocation loc) const {
  return spmd::reshape(*this, shape, loc);
}
LocalTensor LocalTensor::unsqueeze(int64_t d, SourceLocation loc) const {
  return spmd::unsqueeze(*this, d, loc);
}
LocalTensor LocalTensor::squeeze(int64_t d, SourceLocation loc) const {
  return spmd::squeeze(*this, d, loc);
}
LocalTensor LocalTensor::expand(const Shape& shape, SourceLocation loc) const {
  return spmd::expand(*this, shape, loc);
}
LocalTensor LocalTensor::contiguous(SourceLocation loc) const {
  return spmd::contiguous(*this, loc);
}
LocalTensor LocalTensor::clone(SourceLocation loc) const {
  return spmd::clone(*this, loc);
}
LocalTensor LocalTensor::to(DType dtype, SourceLocation loc) const {
  return spmd::to(*this, dtype, loc);
}
LocalTensor LocalTensor::to(Device device) const {
  check_defined("to");
  const bool moves = std::any_of(shards_.begin(), shards_.end(),
                                 [&](const Tensor& t) { return t.device() != device; });
  if (!moves) return *this;
  if (grad_enabled() && requires_grad()) {
    throw_error<Unsupported>(
        "LocalTensor::to: moving a LocalTensor that takes part in autograd to {} is not "
        "differentiable; move it before requires_grad_() or under NoGradGuard",
        device);
  }
  return apply([&](const Tensor& t) { return t.to(device); });
}

std::string LocalTensor::to_string() const {
  if (!ranks_) return "LocalTensor(undefined)";
  std::string out = fmt::format("LocalTensor(ranks={}, dtype={}{})", ranks_str(*ranks_), dtype(),
                                replicated_ ? ", replicated" : "");
  if (classes_) {
    // One line per class of ranks with equal shards (Note [Shard classes]).
    for (size_t c = 0; c < shards_.size(); ++c) {
      std::vector<int> members;
      for (size_t i = 0; i < classes_->size(); ++i) {
        if ((*classes_)[i] == c) members.push_back((*ranks_)[i]);
      }
      const bool many = members.size() > 8;
      if (many) members.resize(8);
      out += fmt::format("\n  ranks {}{}: {}", ranks_str(members), many ? " ..." : "",
                         shards_[c].to_string());
    }
    return out;
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::string text = shards_[i].to_string();
    // Indent continuation lines of a multi-line shard under its rank label.
    std::string indented;
    for (char c : text) {
      indented += c;
      if (c == '\n') indented += "        ";
    }
    out += fmt::format("\n  rank {}: {}", (*ranks_)[i], indented);
  }
  return out;
}

std::ostream& operator<<(std::ostream& os, const LocalTensor& t) {
  return os << t.to_string();
}

}  // namespace spmd
