// spmd/world/per_rank.h: PerRank<T>, a value that may differ between ranks.
//
// Under the sim backend one process runs every rank, so a rank's coordinate or its local shard
// length is not one number but one per held rank. PerRank<T> holds held rank -> T and collapses
// to a single value when every rank agrees (so uniform values cost nothing and compare like T).
// Under threads, mpi and nccl a process holds one rank, and a PerRank simply holds that rank's
// value. Arithmetic applies rank by rank.
//
// Note [Divergence checks]
// Comparing PerRank values (==, !=, <, <=, >, >=) yields one bool, because C++ control flow
// needs one answer. When the per-rank answers differ, the program would branch differently on
// different ranks: on a real cluster that is how collectives get mismatched and jobs hang. So a
// comparison whose answer differs between ranks throws DivergenceError naming every rank's
// values, instead of silently taking one rank's branch. Use map() or LocalTensor::map for code
// that is meant to be rank-specific.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spmd/core/call_site.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>

namespace spmd {

template <class T>
class PerRank {
 public:
  using value_type = T;

  // An empty value (no ranks, not uniform). Most accessors throw on it.
  PerRank() = default;
  // The same value on every rank.
  PerRank(T value) : values_{std::move(value)}, uniform_(true) {}  // NOLINT: implicit by design
  // One value per rank (`ranks` ascending, unique, same length as `values`). Collapses to a
  // uniform value when all values are equal.
  PerRank(std::vector<int> ranks, std::vector<T> values)
      : ranks_(std::move(ranks)), values_(std::move(values)) {
    if (ranks_.size() != values_.size()) {
      throw_error<Error>("PerRank: {} ranks but {} values", ranks_.size(), values_.size());
    }
    if (!std::is_sorted(ranks_.begin(), ranks_.end()) ||
        std::adjacent_find(ranks_.begin(), ranks_.end()) != ranks_.end()) {
      throw_error<Error>("PerRank: ranks must be ascending and unique, got {}", ranks_);
    }
    collapse();
  }
  // fn(rank) for each rank.
  template <class F>
  static PerRank from_fn(const std::vector<int>& ranks, F&& fn) {
    std::vector<T> values;
    values.reserve(ranks.size());
    for (int r : ranks) values.push_back(fn(r));
    return PerRank(ranks, std::move(values));
  }

  // The value on `rank`. A uniform value answers for any rank; otherwise Error when the rank is
  // not held.
  const T& at(int rank) const {
    if (uniform_) return values_.front();
    auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank);
    if (it == ranks_.end() || *it != rank) {
      throw_error<Error>("PerRank::at: rank {} is not held (held ranks {})", rank,
                         ranks_str(ranks_));
    }
    return values_[static_cast<size_t>(it - ranks_.begin())];
  }
  // Ranks with their own value (empty for a value constructed as uniform).
  const std::vector<int>& ranks() const { return ranks_; }
  bool empty() const { return values_.empty(); }
  bool is_uniform() const { return uniform_; }
  // The common value when every rank agrees.
  std::optional<T> uniform() const {
    if (uniform_) return values_.front();
    return std::nullopt;
  }
  // The common value, or DivergenceError naming each rank's value (`what` says what it is).
  const T& value(std::string_view what = "value") const {
    if (!uniform_) {
      throw_error<DivergenceError>("PerRank: {} differs across ranks: {}", what, to_string());
    }
    return values_.front();
  }

  // fn applied rank by rank; the result collapses when uniform.
  template <class F>
  auto map(F&& fn) const -> PerRank<std::decay_t<std::invoke_result_t<F, const T&>>> {
    using U = std::decay_t<std::invoke_result_t<F, const T&>>;
    if (uniform_) {
      PerRank<U> out(fn(values_.front()));
      return std::move(out).with_ranks(ranks_);
    }
    std::vector<U> out;
    out.reserve(values_.size());
    for (const T& v : values_) out.push_back(fn(v));
    return PerRank<U>(ranks_, std::move(out));
  }
  // fn(a_r, b_r) rank by rank. Rank sets must match unless one side is uniform.
  template <class U, class F>
  auto zip(const PerRank<U>& other, F&& fn) const
      -> PerRank<std::decay_t<std::invoke_result_t<F, const T&, const U&>>> {
    using R = std::decay_t<std::invoke_result_t<F, const T&, const U&>>;
    if (uniform_ && other.is_uniform()) {
      PerRank<R> out(fn(values_.front(), *other.uniform()));
      return std::move(out).with_ranks(ranks_.size() >= other.ranks().size() ? ranks_
                                                                             : other.ranks());
    }
    const std::vector<int>& ranks = uniform_ ? other.ranks() : ranks_;
    if (!uniform_ && !other.is_uniform() && ranks_ != other.ranks()) {
      throw_error<Error>("PerRank: combining values held on different ranks ({} vs {})",
                         ranks_str(ranks_), ranks_str(other.ranks()));
    }
    std::vector<R> out;
    out.reserve(ranks.size());
    for (int r : ranks) out.push_back(fn(at(r), other.at(r)));
    return PerRank<R>(ranks, std::move(out));
  }

  // "5" when uniform, "{0: 5, 1: 6}" otherwise.
  std::string to_string() const {
    if (values_.empty()) return "<empty>";
    if (uniform_) return format_value(values_.front());
    std::string out = "{";
    for (size_t i = 0; i < ranks_.size(); ++i) {
      out += fmt::format("{}{}: {}", i ? ", " : "", ranks_[i], format_value(values_[i]));
    }
    return out + "}";
  }

  // Keeps the rank list of a uniform value (informational; at() answers for any rank anyway).
  PerRank with_ranks(std::vector<int> ranks) && {
    if (uniform_) ranks_ = std::move(ranks);
    return std::move(*this);
  }

 private:
  static std::string format_value(const T& v) {
    if constexpr (fmt::is_formattable<T>::value) {
      return fmt::format("{}", v);
    } else {
      return "<value>";
    }
  }
  void collapse() {
    if (values_.empty()) return;
    for (size_t i = 1; i < values_.size(); ++i) {
      if (!(values_[i] == values_[0])) return;
    }
    values_.resize(1);
    uniform_ = true;
  }

  std::vector<int> ranks_;
  std::vector<T> values_;
  bool uniform_ = false;
};

namespace detail {
template <class T>
struct IsPerRank : std::false_type {};
template <class T>
struct IsPerRank<PerRank<T>> : std::true_type {};

template <class T>
const PerRank<T>& as_per_rank(const PerRank<T>& v) {
  return v;
}

// The one answer of a per-rank comparison, or DivergenceError naming the comparison's line
// (Note [Divergence checks], Note [User call sites] in core/call_site.h).
template <class A, class B, class Cmp>
bool compare_uniformly(const PerRank<A>& a, const PerRank<B>& b, const char* op, Cmp cmp,
                       const SourceLocation& loc) {
  PerRank<bool> answers = a.zip(b, cmp);
  if (auto answer = answers.uniform()) return *answer;
  throw_error<DivergenceError>(
      "PerRank comparison `{}` at {} gives different answers on different ranks: {} for lhs {} "
      "and rhs {}; on a cluster each rank would take its own branch (collectives inside it "
      "mismatch or hang). Rank-dependent code must use PerRank::map or LocalTensor::map",
      op, site_text(loc), answers.to_string(), a.to_string(), b.to_string());
}
}  // namespace detail

#define SPMD_PER_RANK_ARITH_(op)                                                    \
  template <class T>                                                                \
  PerRank<T> operator op(const PerRank<T>& a, const PerRank<T>& b) {                \
    return a.zip(b, [](const T& x, const T& y) { return static_cast<T>(x op y); }); \
  }                                                                                 \
  template <class T>                                                                \
  PerRank<T> operator op(const PerRank<T>& a, const std::type_identity_t<T>& b) {   \
    return a.map([&](const T& x) { return static_cast<T>(x op b); });               \
  }                                                                                 \
  template <class T>                                                                \
  PerRank<T> operator op(const std::type_identity_t<T>& a, const PerRank<T>& b) {   \
    return b.map([&](const T& y) { return static_cast<T>(a op y); });               \
  }
SPMD_PER_RANK_ARITH_(+)
SPMD_PER_RANK_ARITH_(-)
SPMD_PER_RANK_ARITH_(*)
SPMD_PER_RANK_ARITH_(/)
SPMD_PER_RANK_ARITH_(%)
#undef SPMD_PER_RANK_ARITH_

template <class T>
PerRank<T> operator-(const PerRank<T>& a) {
  return a.map([](const T& x) { return static_cast<T>(-x); });
}

// The operand that is not deduced carries the comparison's location (At<T>: operators take no
// defaulted parameter).
#define SPMD_PER_RANK_CMP_(op)                                                              \
  template <class T>                                                                        \
  bool operator op(const PerRank<T>& a, At<PerRank<std::type_identity_t<T>>> b) {           \
    return detail::compare_uniformly(                                                       \
        a, b.value, #op, [](const T& x, const T& y) { return x op y; }, b.loc);             \
  }                                                                                         \
  template <class T>                                                                        \
  bool operator op(const PerRank<T>& a, At<std::type_identity_t<T>> b) {                    \
    return detail::compare_uniformly(                                                       \
        a, PerRank<T>(b.value), #op, [](const T& x, const T& y) { return x op y; }, b.loc); \
  }                                                                                         \
  template <class T>                                                                        \
  bool operator op(At<std::type_identity_t<T>> a, const PerRank<T>& b) {                    \
    return detail::compare_uniformly(                                                       \
        PerRank<T>(a.value), b, #op, [](const T& x, const T& y) { return x op y; }, a.loc); \
  }
SPMD_PER_RANK_CMP_(==)
SPMD_PER_RANK_CMP_(!=)
SPMD_PER_RANK_CMP_(<)
SPMD_PER_RANK_CMP_(<=)
SPMD_PER_RANK_CMP_(>)
SPMD_PER_RANK_CMP_(>=)
#undef SPMD_PER_RANK_CMP_

}  // namespace spmd

template <class T>
struct fmt::formatter<spmd::PerRank<T>> : ::spmd::detail::TextFormatterBase {
  template <class Ctx>
  auto format(const spmd::PerRank<T>& v, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "{}", v.to_string());
  }
};
