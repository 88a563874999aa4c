// spmd/sim/local_ops.cpp: Tensor ops applied to LocalTensor shard by shard.
#include <spmd/sim/local_ops.h>

#include <atomic>

#include <spmd/core/error.h>
#include <spmd/tensor/random.h>

namespace spmd {
namespace {

std::atomic<LocalOpObserver> g_observer{nullptr};

// `result`, after the observer (if any) has seen it.
LocalTensor observed(const char* op, std::initializer_list<const LocalTensor*> inputs,
                     LocalTensor result) {
  if (LocalOpObserver observer = g_observer.load(std::memory_order_relaxed)) [[unlikely]] {
    observer(op, std::span<const LocalTensor* const>(inputs.begin(), inputs.size()), result);
  }
  return result;
}

void check_same_ranks(const LocalTensor& a, const LocalTensor& b, const char* op) {
  if (!a.defined() || !b.defined()) throw_error<Error>("{}: LocalTensor operand is undefined", op);
  if (a.ranks_ptr() != b.ranks_ptr() && a.ranks() != b.ranks()) {
    throw_error<Error>("{}: LocalTensor operands hold different ranks: {} vs {}", op, a.ranks(),
                       b.ranks());
  }
}

template <class F>
LocalTensor binary(const LocalTensor& a, const LocalTensor& b, const char* op, F&& f) {
  check_same_ranks(a, b, op);
  const size_t n = a.num_shards();
  if (a.is_replicated() && b.is_replicated()) {
    return observed(op, {&a, &b},
                    LocalTensor(a, std::vector<Tensor>(n, f(a.shards()[0], b.shards()[0]))));
  }
  std::vector<Tensor> out(n);
  detail::for_each_shard(n, detail::total_numel(a) + detail::total_numel(b),
                         [&](size_t i) { out[i] = f(a.shards()[i], b.shards()[i]); });
  return observed(op, {&a, &b}, LocalTensor(a, std::move(out)));
}

template <class F>
LocalTensor with_tensor(const LocalTensor& a, F&& f) {
  return a.apply(std::forward<F>(f));
}

// An op that can produce NaN or Inf: its result goes to the observer.
template <class F>
LocalTensor arithmetic(const char* op, const LocalTensor& a, F&& f) {
  return observed(op, {&a}, a.apply(std::forward<F>(f)));
}

}  // namespace

#define SPMD_LOCAL_BINARY_IMPL_(name)                                                        \
  LocalTensor name(const LocalTensor& a, const LocalTensor& b) {                             \
    return binary(a, b, #name, [](const Tensor& x, const Tensor& y) { return name(x, y); }); \
  }                                                                                          \
  LocalTensor name(const LocalTensor& a, const Tensor& b) {                                  \
    return arithmetic(#name, a, [&](const Tensor& x) { return name(x, b); });                \
  }                                                                                          \
  LocalTensor name(const Tensor& a, const LocalTensor& b) {                                  \
    return arithmetic(#name, b, [&](const Tensor& y) { return name(a, y); });                \
  }
SPMD_LOCAL_BINARY_IMPL_(add)
SPMD_LOCAL_BINARY_IMPL_(sub)
SPMD_LOCAL_BINARY_IMPL_(mul)
SPMD_LOCAL_BINARY_IMPL_(div)
SPMD_LOCAL_BINARY_IMPL_(maximum)
SPMD_LOCAL_BINARY_IMPL_(minimum)
SPMD_LOCAL_BINARY_IMPL_(matmul)
SPMD_LOCAL_BINARY_IMPL_(bmm)
#undef SPMD_LOCAL_BINARY_IMPL_

#define SPMD_LOCAL_OPERATOR_IMPL_(op, name)                               \
  LocalTensor operator op(const LocalTensor& a, const LocalTensor& b) {   \
    return name(a, b);                                                    \
  }                                                                       \
  LocalTensor operator op(const LocalTensor& a, const Tensor& b) {        \
    return name(a, b);                                                    \
  }                                                                       \
  LocalTensor operator op(const Tensor& a, const LocalTensor& b) {        \
    return name(a, b);                                                    \
  }                                                                       \
  LocalTensor operator op(const LocalTensor& a, double b) {               \
    return arithmetic(#name, a, [&](const Tensor& x) { return x op b; }); \
  }                                                                       \
  LocalTensor operator op(double a, const LocalTensor& b) {               \
    return arithmetic(#name, b, [&](const Tensor& y) { return a op y; }); \
  }
SPMD_LOCAL_OPERATOR_IMPL_(+, add)
SPMD_LOCAL_OPERATOR_IMPL_(-, sub)
SPMD_LOCAL_OPERATOR_IMPL_(*, mul)
SPMD_LOCAL_OPERATOR_IMPL_(/, div)
#undef SPMD_LOCAL_OPERATOR_IMPL_

LocalTensor operator-(const LocalTensor& a) {
  return neg(a);
}

LocalTensor addmm(const LocalTensor& c, const LocalTensor& a, const LocalTensor& b, double beta,
                  double alpha) {
  check_same_ranks(c, a, "addmm");
  check_same_ranks(a, b, "addmm");
  const size_t n = a.num_shards();
  if (c.is_replicated() && a.is_replicated() && b.is_replicated()) {
    Tensor one = addmm(c.shards()[0], a.shards()[0], b.shards()[0], beta, alpha);
    return observed("addmm", {&c, &a, &b}, LocalTensor(a, std::vector<Tensor>(n, one)));
  }
  std::vector<Tensor> out(n);
  detail::for_each_shard(n, detail::total_numel(a) + detail::total_numel(b), [&](size_t i) {
    out[i] = addmm(c.shards()[i], a.shards()[i], b.shards()[i], beta, alpha);
  });
  return observed("addmm", {&c, &a, &b}, LocalTensor(a, std::move(out)));
}

#define SPMD_LOCAL_UNARY_IMPL_(name)                                      \
  LocalTensor name(const LocalTensor& t) {                                \
    return arithmetic(#name, t, [](const Tensor& x) { return name(x); }); \
  }
SPMD_LOCAL_UNARY_IMPL_(neg)
SPMD_LOCAL_UNARY_IMPL_(abs)
SPMD_LOCAL_UNARY_IMPL_(exp)
SPMD_LOCAL_UNARY_IMPL_(log)
SPMD_LOCAL_UNARY_IMPL_(sqrt)
SPMD_LOCAL_UNARY_IMPL_(tanh)
SPMD_LOCAL_UNARY_IMPL_(relu)
SPMD_LOCAL_UNARY_IMPL_(gelu)
#undef SPMD_LOCAL_UNARY_IMPL_

#define SPMD_LOCAL_REDUCTION_IMPL_(name)                                                   \
  LocalTensor name(const LocalTensor& t) {                                                 \
    return arithmetic(#name, t, [](const Tensor& x) { return name(x); });                  \
  }                                                                                        \
  LocalTensor name(const LocalTensor& t, const std::vector<int64_t>& dims, bool keepdim) { \
    return arithmetic(#name, t, [&](const Tensor& x) { return name(x, dims, keepdim); });  \
  }
SPMD_LOCAL_REDUCTION_IMPL_(sum)
SPMD_LOCAL_REDUCTION_IMPL_(mean)
SPMD_LOCAL_REDUCTION_IMPL_(amax)
SPMD_LOCAL_REDUCTION_IMPL_(amin)
#undef SPMD_LOCAL_REDUCTION_IMPL_

LocalTensor softmax(const LocalTensor& t, int64_t d) {
  return arithmetic("softmax", t, [&](const Tensor& x) { return softmax(x, d); });
}
LocalTensor log_softmax(const LocalTensor& t, int64_t d) {
  return arithmetic("log_softmax", t, [&](const Tensor& x) { return log_softmax(x, d); });
}

namespace {
template <class F>
LocalTensor join(const std::vector<LocalTensor>& tensors, const char* op, F&& f) {
  if (tensors.empty()) throw_error<Error>("{}: needs at least one LocalTensor", op);
  for (const LocalTensor& t : tensors) check_same_ranks(tensors[0], t, op);
  const size_t n = tensors[0].num_shards();
  std::vector<Tensor> out;
  out.reserve(n);
  std::vector<Tensor> parts(tensors.size());
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < tensors.size(); ++k) parts[k] = tensors[k].shards()[i];
    out.push_back(f(parts));
  }
  return LocalTensor(tensors[0], std::move(out));
}
}  // namespace

LocalTensor cat(const std::vector<LocalTensor>& tensors, int64_t d) {
  return join(tensors, "cat", [&](const std::vector<Tensor>& p) { return cat(p, d); });
}
LocalTensor stack(const std::vector<LocalTensor>& tensors, int64_t d) {
  return join(tensors, "stack", [&](const std::vector<Tensor>& p) { return stack(p, d); });
}

LocalTensor pad(const LocalTensor& t, int64_t d, int64_t before, int64_t after, double value) {
  return with_tensor(t, [&](const Tensor& x) { return pad(x, d, before, after, value); });
}

LocalTensor pad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                const PerRank<int64_t>& after, double value) {
  if (before.is_uniform() && after.is_uniform())
    return pad(t, d, *before.uniform(), *after.uniform(), value);
  return t.map([&](int r, const Tensor& x) { return pad(x, d, before.at(r), after.at(r), value); });
}

LocalTensor unpad(const LocalTensor& t, int64_t d, const PerRank<int64_t>& before,
                  const PerRank<int64_t>& after) {
  if (before.is_uniform() && after.is_uniform()) {
    const int64_t b = *before.uniform();
    const int64_t a = *after.uniform();
    return with_tensor(t, [&](const Tensor& x) { return unpad(x, d, b, a); });
  }
  return t.map([&](int r, const Tensor& x) { return unpad(x, d, before.at(r), after.at(r)); });
}

PerRank<bool> equal(const LocalTensor& a, const LocalTensor& b) {
  check_same_ranks(a, b, "equal");
  std::vector<bool> out;
  for (size_t i = 0; i < a.num_shards(); ++i) out.push_back(equal(a.shards()[i], b.shards()[i]));
  return PerRank<bool>(a.ranks(), std::move(out));
}

PerRank<bool> allclose(const LocalTensor& a, const LocalTensor& b, double rtol, double atol) {
  check_same_ranks(a, b, "allclose");
  std::vector<bool> out;
  for (size_t i = 0; i < a.num_shards(); ++i) {
    out.push_back(allclose(a.shards()[i], b.shards()[i], rtol, atol));
  }
  return PerRank<bool>(a.ranks(), std::move(out));
}

LocalTensor zeros(const World& world, const Shape& shape, DType dtype) {
  return LocalTensor(world.held_ranks(),
                     std::vector<Tensor>(world.held_ranks().size(), zeros(shape, dtype)));
}
LocalTensor ones(const World& world, const Shape& shape, DType dtype) {
  return LocalTensor(world.held_ranks(),
                     std::vector<Tensor>(world.held_ranks().size(), ones(shape, dtype)));
}
LocalTensor full(const World& world, const Shape& shape, double value, DType dtype) {
  return LocalTensor(world.held_ranks(),
                     std::vector<Tensor>(world.held_ranks().size(), full(shape, value, dtype)));
}

void set_local_op_observer(LocalOpObserver observer) {
  g_observer.store(observer, std::memory_order_relaxed);
}

LocalTensor randn_per_rank(const World& world, const Shape& shape, uint64_t seed, DType dtype) {
  return LocalTensor::from_fn(
      world, [&](int r) { return randn(shape, seed + static_cast<uint64_t>(r), dtype); });
}

}  // namespace spmd
