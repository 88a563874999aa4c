// examples/moe_local.cpp: an expert-parallel mixture-of-experts layer trained in local code, with
// a learned router whose top-1 choice sends each rank a different number of tokens: every rank's
// shards have their own shapes after the dispatch, and autograd runs through them under every
// backend. Each step's loss and the final weights are checked against the same layer trained on
// one device.
//
//   ./moe_local                                    # sim: 8 ranks in this process
//   ./moe_local --spmd-backend=threads             # one thread per rank, the same digest
//   mpirun -n 8 ./moe_local --spmd-backend=mpi     # one process per rank, the same digest
//   ./moe_local --steps 5 --tokens 16 --dim 8
//
// One expert per rank on a 1-D mesh "ep". Per step, on every rank:
//   h      = x W_in                  a learned projection of the rank's own tokens (V)
//   choice = argmax(h W_router)      top-1 expert of each token; gate = its softmax probability
//   sort the tokens by destination rank, exchange the counts (all_to_all), and send the tokens to
//   their experts (all_to_all_single with per-rank splits: uneven)
//   out    = gelu(recv W1) W2        the rank's expert on what it received (uneven rows)
//   send the results home (all_to_all_single), unsort, y = gate * out
//   loss   = sum(y^2) / tokens       each rank's term; the total is their sum over ep
// backward() goes through both all_to_all_singles (their typed backward is the reverse exchange)
// and the experts' uneven shards (Note [Uneven backward] in ops/autograd.h). The router and W_in
// are replicated (R): their gradients are pending sums (P), all-reduced before the SGD step; each
// expert's gradient is its own rank's (V), complete once the backward exchange brought every
// token's contribution home. A dry run (--spmd-tensors=meta) has no values to route by, so this
// example refuses one.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <spmd/spmd.h>

using namespace spmd;

namespace {

struct Config {
  int64_t steps = 3;
  int64_t tokens = 12;  // per rank
  int64_t dim = 6;      // token features
  int64_t hidden = 8;   // expert hidden size
  double lr = 0.005;
};

constexpr const char* kUsage =
    "moe_local [--steps N] [--tokens N] [--dim N] [--hidden N]   (and the --spmd-* flags of "
    "launch())";

Config parse_flags(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw_error<ConfigError>("moe_local: {} needs a value\n{}", flag, kUsage);
    const std::string value = argv[++i];
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v <= 0 || v > 4096) {
      throw_error<ConfigError>("moe_local: {} needs an integer in 1..4096, got '{}'\n{}", flag,
                               value, kUsage);
    }
    if (flag == "--steps") {
      c.steps = v;
    } else if (flag == "--tokens") {
      c.tokens = v;
    } else if (flag == "--dim") {
      c.dim = v;
    } else if (flag == "--hidden") {
      c.hidden = v;
    } else {
      throw_error<ConfigError>("moe_local: unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  return c;
}

// The weights, as one device holds them (the reference) and as the ranks hold them.
struct Weights {
  Tensor w_in;                 // [dim, dim]
  Tensor router;               // [dim, experts]
  std::vector<Tensor> w1, w2;  // per expert: [dim, hidden], [hidden, dim]
};

Weights initial_weights(const Config& c, int64_t experts) {
  Weights w;
  w.w_in = randn({c.dim, c.dim}, 1, DType::F64) * (1.0 / std::sqrt(static_cast<double>(c.dim)));
  w.router = randn({c.dim, experts}, 2, DType::F64);
  for (int64_t e = 0; e < experts; ++e) {
    const auto seed = static_cast<uint64_t>(100 + 2 * e);
    w.w1.push_back(randn({c.dim, c.hidden}, seed, DType::F64) * 0.5);
    w.w2.push_back(randn({c.hidden, c.dim}, seed + 1, DType::F64) * 0.5);
  }
  return w;
}

// Rank r's tokens.
Tensor tokens_of(int rank, const Config& c) {
  return randn({c.tokens, c.dim}, 1000 + static_cast<uint64_t>(rank), DType::F64);
}

// Rows of `t` in the order `order` (an index tensor of one rank).
std::vector<int64_t> argsort_by(const std::vector<int64_t>& key) {
  std::vector<int64_t> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)];
  });
  return order;
}

std::vector<int64_t> inverse_of(const std::vector<int64_t>& order) {
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = i;
  return inverse;
}

Tensor index_tensor(const std::vector<int64_t>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())});
}

// ---- one device ---------------------------------------------------------------------------------

// One SGD step of the whole layer on every rank's tokens; returns the loss (before the step).
double reference_step(Weights& w, const std::vector<Tensor>& tokens, const Config& c) {
  const int64_t experts = static_cast<int64_t>(w.w1.size());
  std::vector<Tensor*> params{&w.w_in, &w.router};
  for (int64_t e = 0; e < experts; ++e) {
    params.push_back(&w.w1[static_cast<size_t>(e)]);
    params.push_back(&w.w2[static_cast<size_t>(e)]);
  }
  for (Tensor* p : params) p->requires_grad_();
  Tensor loss = zeros({}, DType::F64);
  for (const Tensor& x : tokens) {
    const Tensor h = matmul(x, w.w_in);
    const Tensor logits = matmul(h, w.router);
    const Tensor probs = softmax(logits, 1);
    const std::vector<int64_t> choice = argmax(logits, 1).to_vector<int64_t>();
    std::vector<Tensor> rows;
    for (int64_t t = 0; t < c.tokens; ++t) {
      const auto e = static_cast<size_t>(choice[static_cast<size_t>(t)]);
      const Tensor out = matmul(gelu(matmul(h.narrow(0, t, 1), w.w1[e])), w.w2[e]);
      rows.push_back(out * probs.narrow(0, t, 1).narrow(1, static_cast<int64_t>(e), 1));
    }
    const Tensor y = cat(rows, 0);
    loss = loss + sum(y * y) * (1.0 / static_cast<double>(c.tokens));
  }
  backward(loss);
  NoGradGuard no_grad;
  for (Tensor* p : params) {
    // An expert no token chose this step gets no gradient.
    *p = p->grad().defined() ? (*p - p->grad() * c.lr).detach() : p->detach();
  }
  return loss.item<double>();
}

// ---- every rank, local code ---------------------------------------------------------------------

int moe_local(World& world, const Config& c) {
  if (meta_tensors()) {
    throw_error<ConfigError>(
        "moe_local: a dry run (--spmd-tensors=meta) has no values for the router to choose "
        "experts by; run it with real tensors");
  }
  const int64_t n = world.size();
  const DeviceMesh mesh = init_device_mesh(world, {n}, {"ep"});
  const std::vector<int>& held = world.held_ranks();
  Weights ref = initial_weights(c, n);
  std::vector<Tensor> all_tokens;
  for (int r = 0; r < n; ++r) all_tokens.push_back(tokens_of(r, c));

  // The ranks' weights: W_in and the router replicated (R), rank e holding expert e (V).
  LocalTensor w_in = LocalTensor::replicate(world, ref.w_in);
  LocalTensor router = LocalTensor::replicate(world, ref.router);
  LocalTensor w1 = LocalTensor::from_fn(world, [&](int r) { return ref.w1[r].clone(); });
  LocalTensor w2 = LocalTensor::from_fn(world, [&](int r) { return ref.w2[r].clone(); });
  const LocalTensor x = LocalTensor::from_fn(world, [&](int r) { return tokens_of(r, c); });

  double worst = 0.0;
  if (world.is_coordinator()) {
    fmt::print("moe_local: {} ranks, one expert each, {} tokens per rank, backend {}\n\n", n,
               c.tokens, world.backend_name());
    fmt::print("{:>4}  {:>22}  {:>22}  {:>9}  rows rank {}'s expert got from each rank\n", "step",
               "loss (local code)", "loss (one device)", "|diff|", held.front());
  }
  for (int64_t step = 0; step < c.steps; ++step) {
    for (LocalTensor* p : {&w_in, &router, &w1, &w2}) p->requires_grad_();
    const LocalTensor h = matmul(x, w_in);
    const LocalTensor logits = matmul(h, router);
    const LocalTensor probs = softmax(logits, 1);
    const LocalTensor choice = argmax(logits, 1, true);  // [tokens, 1] i64
    const LocalTensor gate = gather(probs, 1, choice);   // [tokens, 1]

    // Routing: values of each held rank's own choices (rank-specific, so per held rank).
    const auto destinations = PerRank<std::vector<int64_t>>::from_fn(
        held, [&](int r) { return choice.shard(r).reshape({c.tokens}).to_vector<int64_t>(); });
    const auto send_counts = PerRank<std::vector<int64_t>>::from_fn(held, [&](int r) {
      std::vector<int64_t> counts(static_cast<size_t>(n), 0);
      for (int64_t e : destinations.at(r)) ++counts[static_cast<size_t>(e)];
      return counts;
    });
    const LocalTensor order = LocalTensor::from_fn(
        world, [&](int r) { return index_tensor(argsort_by(destinations.at(r))); });
    const LocalTensor back_order = LocalTensor::from_fn(
        world, [&](int r) { return index_tensor(inverse_of(argsort_by(destinations.at(r)))); });
    const LocalTensor counts =
        LocalTensor::from_fn(world, [&](int r) { return from_vector(send_counts.at(r), {n}); });
    const LocalTensor recv_counts_t = all_to_all(counts, mesh, "ep");
    const auto recv_counts = PerRank<std::vector<int64_t>>::from_fn(
        held, [&](int r) { return recv_counts_t.shard(r).to_vector<int64_t>(); });

    // Dispatch, the expert on its (uneven) rows, and home again.
    const LocalTensor sorted = index_select(h, 0, order);
    const LocalTensor received = all_to_all_single(sorted, mesh, "ep", recv_counts, send_counts);
    const LocalTensor expert_out = matmul(gelu(matmul(received, w1)), w2);
    const LocalTensor returned =
        all_to_all_single(expert_out, mesh, "ep", send_counts, recv_counts);
    const LocalTensor y = index_select(returned, 0, back_order) * gate;
    const LocalTensor loss = sum(y * y) * (1.0 / static_cast<double>(c.tokens));
    backward(loss);

    // The replicated weights' gradients are pending sums over ep; the experts' are complete.
    const LocalTensor total = all_reduce(loss.detach(), mesh, "ep");
    const double ours = total.shard(held.front()).item<double>();
    const double theirs = reference_step(ref, all_tokens, c);
    {
      NoGradGuard no_grad;
      const LocalTensor g_in = all_reduce(w_in.grad(), mesh, "ep");
      const LocalTensor g_router = all_reduce(router.grad(), mesh, "ep");
      w_in = (w_in - g_in * c.lr).detach();
      router = (router - g_router * c.lr).detach();
      w1 = (w1 - w1.grad() * c.lr).detach();
      w2 = (w2 - w2.grad() * c.lr).detach();
    }
    const double diff = std::abs(ours - theirs);
    worst = std::max(worst, diff);
    if (world.is_coordinator()) {
      fmt::print("{:>4}  {:>22.15f}  {:>22.15f}  {:>9.2e}  {}\n", step + 1, ours, theirs, diff,
                 shape_str(recv_counts.at(held.front())));
    }
  }

  // The trained weights against one device's: W_in and the router on every rank, expert e on
  // rank e.
  LocalTensor error = LocalTensor::from_fn(world, [&](int r) {
    const auto e = static_cast<size_t>(r);
    const double d =
        std::max({max_abs_diff(w_in.shard(r), ref.w_in), max_abs_diff(router.shard(r), ref.router),
                  max_abs_diff(w1.shard(r), ref.w1[e]), max_abs_diff(w2.shard(r), ref.w2[e])});
    return scalar_tensor(d);
  });
  const double weights_error =
      all_reduce(error, mesh, "ep", ReduceOp::Max).shard(held.front()).item<double>();
  worst = std::max(worst, weights_error);
  const double tolerance = 1e-10;
  const bool pass = worst <= tolerance;
  if (world.is_coordinator()) {
    fmt::print("\nweights after {} steps against one device: max |error| {:.2e}\n", c.steps,
               weights_error);
    fmt::print("check: {} (max error {:.2e}, tolerance {:g})\n", pass ? "PASS" : "FAIL", worst,
               tolerance);
  }
  print_digest(world, {w_in, router, w1, w2});
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [&](World& world) { return moe_local(world, parse_flags(argc, argv)); });
}
