// The losses (cross_entropy with torch's options, nll_loss, mse_loss) against brute-force
// references written here from torch's formulas, loop by loop in double, and their gradients
// against central differences of those references; then their sharded forms (rows sharded
// unevenly with ignored targets, classes sharded, element dims beyond the batch) against the
// Tensor ops. The conformance table (conformance_test.cpp) runs their rows on every kind.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <spmd/dtensor/ops.h>
#include <spmd/ops/autograd.h>
#include <spmd/world/local_ops.h>
#include "tests/dtensor/dtensor_test_support.h"
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::expect_throws;

// ---- brute force --------------------------------------------------------------------------------

// torch's cross_entropy (nll: nll_loss) on logits of `shape` ([N, C, d...] or [C]) given as a
// row-major vector, for targets in the target's row-major order: the per-element losses.
std::vector<double> brute_losses(const std::vector<double>& x, const Shape& shape,
                                 const std::vector<int64_t>& target, int64_t ignore_index,
                                 double eps, bool nll) {
  const bool unbatched = shape.size() == 1;
  const int64_t classes = unbatched ? shape[0] : shape[1];
  int64_t inner = 1;
  for (size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
  std::vector<double> out;
  for (size_t e = 0; e < target.size(); ++e) {
    const int64_t n = static_cast<int64_t>(e) / inner;
    const int64_t r = static_cast<int64_t>(e) % inner;
    auto at = [&](int64_t c) {
      return x[static_cast<size_t>(unbatched ? c : (n * classes + c) * inner + r)];
    };
    if (target[e] == ignore_index) {
      out.push_back(0.0);
      continue;
    }
    if (nll) {
      out.push_back(-at(target[e]));
      continue;
    }
    double total = 0.0;
    for (int64_t c = 0; c < classes; ++c) total += std::exp(at(c));
    const double lse = std::log(total);
    double smooth = 0.0;
    for (int64_t c = 0; c < classes; ++c) smooth += lse - at(c);
    out.push_back((1 - eps) * (lse - at(target[e])) + eps / static_cast<double>(classes) * smooth);
  }
  return out;
}

// The losses reduced: Mean over the elements not ignored (0 / 0 = NaN when none is), Sum, None.
std::vector<double> brute_reduce(const std::vector<double>& losses,
                                 const std::vector<int64_t>& target, int64_t ignore_index,
                                 LossReduction reduction) {
  if (reduction == LossReduction::None) return losses;
  double total = 0.0;
  double count = 0.0;
  for (size_t e = 0; e < losses.size(); ++e) {
    total += losses[e];
    if (target[e] != ignore_index) count += 1.0;
  }
  return {reduction == LossReduction::Sum ? total : total / count};
}

// sum(out * w) of a reference, and its gradient by central differences.
template <class F>
std::vector<double> numeric_gradient(const std::vector<double>& x, const std::vector<double>& w,
                                     F f) {
  auto weighted = [&](const std::vector<double>& v) {
    const std::vector<double> out = f(v);
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
    return s;
  };
  std::vector<double> grad;
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = x;
    std::vector<double> down = x;
    up[i] += h;
    down[i] -= h;
    grad.push_back((weighted(up) - weighted(down)) / (2 * h));
  }
  return grad;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i << ": " << got[i];
    } else {
      EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
    }
  }
}

Shape target_shape(const Shape& logits) {
  Shape t = logits;
  t.erase(t.begin() + (logits.size() == 1 ? 0 : 1));
  return t;
}

// Class indices in [0, classes) with every third one (from `start`) set to `ignored`.
std::vector<int64_t> make_targets(int64_t n, int64_t classes, int64_t ignored, uint64_t seed,
                                  int64_t start = 1) {
  std::vector<int64_t> t;
  const std::vector<double> u = rand({n}, seed, DType::F64).to_vector<double>();
  for (int64_t i = 0; i < n; ++i) {
    t.push_back(i % 3 == start % 3 ? ignored
                                   : static_cast<int64_t>(u[static_cast<size_t>(i)] *
                                                          static_cast<double>(classes)));
  }
  return t;
}

struct Case {
  Shape logits;
  CrossEntropyOptions o;
  bool nll = false;
};

std::string describe(const Case& c) {
  return fmt::format("{} {} reduction {} ignore {} eps {}", c.nll ? "nll_loss" : "cross_entropy",
                     shape_str(c.logits), loss_reduction_code(c.o.reduction), c.o.ignore_index,
                     c.o.label_smoothing);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Shape& shape : std::vector<Shape>{{6, 5}, {3, 4, 2, 3}, {5}}) {
    for (LossReduction r : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
      // The default ignore_index (-100 in the targets), a class as ignore_index, smoothing.
      out.push_back({shape, {.reduction = r}});
      out.push_back({shape, {.reduction = r, .ignore_index = 2, .label_smoothing = 0.1}});
      out.push_back({shape, {.reduction = r, .label_smoothing = 1.0}});
      out.push_back({shape, {.reduction = r, .ignore_index = 1}, true});
      out.push_back({shape, {.reduction = r}, true});
    }
  }
  return out;
}

Tensor run_loss(const Case& c, const Tensor& logits, const Tensor& target) {
  if (c.nll) {
    return nll_loss(logits, target,
                    NllLossOptions{.reduction = c.o.reduction, .ignore_index = c.o.ignore_index});
  }
  return cross_entropy(logits, target, c.o);
}

TEST(Losses, CrossEntropyAndNllLossMatchABruteForceReference) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    const Shape ts = target_shape(c.logits);
    const int64_t classes = c.logits[c.logits.size() == 1 ? 0 : 1];
    const std::vector<int64_t> t = make_targets(shape_numel(ts), classes, c.o.ignore_index, ++seed,
                                                c.logits.size() == 1 ? 1 : 0);
    const Tensor target = from_vector(t, {static_cast<int64_t>(t.size())}).reshape(ts);
    const Tensor x0 = randn(c.logits, ++seed, DType::F64) * 2.0;
    const std::vector<double> xs = x0.to_vector<double>();
    auto reference = [&](const std::vector<double>& v) {
      return brute_reduce(
          brute_losses(v, c.logits, t, c.o.ignore_index, c.o.label_smoothing, c.nll), t,
          c.o.ignore_index, c.o.reduction);
    };
    Tensor x = x0.clone().requires_grad_();
    const Tensor out = run_loss(c, x, target);
    EXPECT_EQ(out.shape(), c.o.reduction == LossReduction::None ? ts : Shape{});
    EXPECT_EQ(out.dtype(), DType::F64);
    const std::vector<double> want = reference(xs);
    expect_near_all(out.to_vector<double>(), want, 1e-12, "values");
    const Tensor w = randn(out.shape(), ++seed, DType::F64);
    backward(out, w);
    expect_near_all(x.grad().to_vector<double>(),
                    numeric_gradient(xs, w.to_vector<double>(), reference), 1e-6, "gradient");
    // I32 targets and F32 logits give the same losses (in F32).
    const Tensor f32 = run_loss(c, x0.to(DType::F32), target.to(DType::I32));
    EXPECT_EQ(f32.dtype(), DType::F32);
    expect_near_all(f32.to(DType::F64).to_vector<double>(), want, 1e-5, "f32");
  }
}

// A Mean over no element not ignored is 0 / 0 = NaN (torch's), a Sum 0, None zeros; the gradient
// is 0 everywhere (torch's nll_loss_backward writes only the rows not ignored).
TEST(Losses, EveryTargetIgnored) {
  const Tensor target = from_vector<int64_t>({-100, -100, -100}, {3});
  for (bool nll : {false, true}) {
    for (double eps : {0.0, 0.2}) {
      if (nll && eps != 0.0) continue;
      SCOPED_TRACE(fmt::format("nll {} eps {}", nll, eps));
      for (LossReduction r : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
        Tensor x = randn({3, 4}, 5, DType::F64).requires_grad_();
        const Case c{{3, 4}, {.reduction = r, .label_smoothing = eps}, nll};
        const Tensor out = run_loss(c, x, target);
        for (double v : testing::values(out)) {
          if (r == LossReduction::Mean) {
            EXPECT_TRUE(std::isnan(v));
          } else {
            EXPECT_EQ(v, 0.0);
          }
        }
        backward(sum(out));
        EXPECT_TRUE(equal(x.grad(), zeros({3, 4}, DType::F64))) << x.grad();
      }
    }
  }
}

TEST(Losses, Errors) {
  const Tensor logits = randn({4, 5}, 1, DType::F64);
  const Tensor target = from_vector<int64_t>({0, 1, 4, 2}, {4});
  for (double eps : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    expect_throws<ConfigError>([&] { cross_entropy(logits, target, {.label_smoothing = eps}); },
                               {"cross_entropy", "label_smoothing must lie in [0, 1]", "[4, 5]"});
  }
  // -100 is ignored by default, not when ignore_index is another value; 5 is never a class here.
  expect_throws<ShapeError>(
      [&] {
        cross_entropy(logits, from_vector<int64_t>({0, -100, 1, 2}, {4}), {.ignore_index = 3});
      },
      {"cross_entropy", "target -100", "index 1", "[0, 5)", "ignore_index 3"});
  expect_throws<ShapeError>(
      [&] {
        nll_loss(logits, from_vector<int64_t>({0, 1, 5, 2}, {4}));
      },
      {"nll_loss", "target 5", "index 2", "[0, 5)"});
  // Beyond 2-D the position is the target's multi-index.
  expect_throws<ShapeError>(
      [&] {
        cross_entropy(randn({2, 3, 2}, 1, DType::F64), from_vector<int64_t>({0, 1, 2, 3}, {2, 2}));
      },
      {"cross_entropy", "target 3", "index [1, 1]", "3 classes"});
  expect_throws<ShapeError>(
      [&] {
        cross_entropy(randn({4, 5, 3}, 1), from_vector<int64_t>({0, 1, 2, 3}, {4}));
      },
      {"cross_entropy", "[4, 5, 3]", "target [4]"});
  expect_throws<ShapeError>(
      [&] {
        nll_loss(logits, target.reshape({2, 2}));
      },
      {"nll_loss", "[4, 5]", "target [2, 2]"});
  expect_throws<Unsupported>([&] { cross_entropy(logits, target.to(DType::F32)); },
                             {"cross_entropy", "I64 or I32", "f32"});
  expect_throws<Unsupported>([&] { mse_loss(ones({3}, DType::I64), ones({3}, DType::I64)); },
                             {"mse_loss", "floating", "[3]"});
  expect_throws<ShapeError>([&] { mse_loss(ones({3}), ones({4})); }, {"mse_loss", "[3]", "[4]"});
}

// ---- mse_loss -----------------------------------------------------------------------------------

TEST(Losses, MseLossMatchesABruteForceReference) {
  struct MseCase {
    Shape a, b;
  };
  uint64_t seed = 20;
  for (const MseCase& m :
       std::vector<MseCase>{{{5, 4}, {5, 4}}, {{5, 4}, {4}}, {{3, 1}, {2, 1, 4}}}) {
    for (LossReduction r : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
      SCOPED_TRACE(fmt::format("{} {} reduction {}", shape_str(m.a), shape_str(m.b),
                               loss_reduction_code(r)));
      const Shape out_shape = testing::broadcast(m.a, m.b);
      const Tensor a0 = randn(m.a, ++seed, DType::F64);
      const Tensor b0 = randn(m.b, ++seed, DType::F64);
      const std::vector<double> av = a0.to_vector<double>();
      const std::vector<double> bv = b0.to_vector<double>();
      auto reference = [&](const std::vector<double>& a, const std::vector<double>& b) {
        std::vector<double> out;
        double total = 0.0;
        for (int64_t i = 0; i < shape_numel(out_shape); ++i) {
          const auto index = testing::unravel(i, out_shape);
          auto flat = [&](const Shape& s) {
            const auto bi = testing::broadcast_index(index, s);
            int64_t f = 0;
            for (size_t d = 0; d < s.size(); ++d) f = f * s[d] + bi[d];
            return static_cast<size_t>(f);
          };
          const double d = a[flat(m.a)] - b[flat(m.b)];
          out.push_back(d * d);
          total += d * d;
        }
        if (r == LossReduction::None) return out;
        return std::vector<double>{
            r == LossReduction::Sum ? total : total / static_cast<double>(shape_numel(out_shape))};
      };
      Tensor a = a0.clone().requires_grad_();
      Tensor b = b0.clone().requires_grad_();
      const Tensor out = mse_loss(a, b, r);
      EXPECT_EQ(out.shape(), r == LossReduction::None ? out_shape : Shape{});
      expect_near_all(out.to_vector<double>(), reference(av, bv), 1e-12, "values");
      const Tensor w = randn(out.shape(), ++seed, DType::F64);
      backward(out, w);
      const std::vector<double> wv = w.to_vector<double>();
      expect_near_all(a.grad().to_vector<double>(),
                      numeric_gradient(av, wv, [&](const auto& v) { return reference(v, bv); }),
                      1e-6, "gradient of a");
      expect_near_all(b.grad().to_vector<double>(),
                      numeric_gradient(bv, wv, [&](const auto& v) { return reference(av, v); }),
                      1e-6, "gradient of b");
    }
  }
}

// ---- sharded ------------------------------------------------------------------------------------

// The DTensor loss and its gradient against the Tensor op's on the full tensors.
void expect_sharded_matches(const Case& c, const Tensor& logits, const Tensor& target,
                            const DeviceMesh& mesh, const Placements& lp, const Placements& tp,
                            const std::optional<Placements>& want_placements = std::nullopt) {
  SCOPED_TRACE(fmt::format("{} with {} and {}", describe(c), to_string(lp), to_string(tp)));
  Tensor leaf = logits.clone().requires_grad_();
  const Tensor want = run_loss(c, leaf, target);
  const Tensor w = randn(want.shape(), 3, DType::F64);
  backward(want, w);
  DTensor x = distribute_tensor(logits, mesh, lp);
  x.requires_grad_();
  const DTensor t = distribute_tensor(target, mesh, tp);
  const DTensor out =
      c.nll ? nll_loss(x, t,
                       NllLossOptions{.reduction = c.o.reduction, .ignore_index = c.o.ignore_index})
            : cross_entropy(x, t, c.o);
  if (want_placements) EXPECT_EQ(out.placements(), *want_placements);
  const Tensor got = out.full_tensor();
  expect_near_all(got.to_vector<double>(), want.to_vector<double>(), 1e-12, "values");
  backward(out, distribute_tensor(w, mesh, Placements(mesh.ndim(), Replicate{})));
  EXPECT_EQ(x.grad().placements(), x.placements());
  EXPECT_TRUE(allclose(x.grad().full_tensor(), leaf.grad(), 1e-12, 1e-12))
      << x.grad().full_tensor() << " vs " << leaf.grad();
}

// Six rows over four ranks (2, 2, 1, 1): rank 2's one row is ignored, so the pieces' own counts
// (2, 1, 0, 1) are not the global one (4). Mean is the P(sum) of the global mean regardless; None
// keeps the rows' shards; Sum gives P(sum).
TEST(Losses, RowsShardedMeanDividesByTheGlobalCountOfTargetsNotIgnored) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const Tensor logits = randn({6, 5}, 11, DType::F64);
  const Tensor target = from_vector<int64_t>({0, 4, -100, 3, -100, 2}, {6});
  const Placements rows{Shard{0}};
  for (bool nll : {false, true}) {
    for (double eps : {0.0, 0.25}) {
      if (nll && eps != 0.0) continue;
      expect_sharded_matches({{6, 5}, {.label_smoothing = eps}, nll}, logits, target, mesh, rows,
                             rows, Placements{Partial{}});
      expect_sharded_matches(
          {{6, 5}, {.reduction = LossReduction::Sum, .label_smoothing = eps}, nll}, logits, target,
          mesh, rows, rows, Placements{Partial{}});
      expect_sharded_matches(
          {{6, 5}, {.reduction = LossReduction::None, .label_smoothing = eps}, nll}, logits, target,
          mesh, rows, rows, rows);
      // A class as ignore_index; the target whole.
      expect_sharded_matches({{6, 5}, {.ignore_index = 3, .label_smoothing = eps}, nll}, logits,
                             from_vector<int64_t>({0, 4, 3, 3, -0, 2}, {6}), mesh, rows,
                             Placements{Replicate{}});
    }
  }
  // Every target ignored: NaN on every rank, as on one device.
  const DTensor nan = cross_entropy(distribute_tensor(logits, mesh, rows),
                                    distribute_tensor(full({6}, -100.0, DType::I64), mesh, rows));
  EXPECT_TRUE(std::isnan(nan.full_tensor().item<double>()));
}

// Classes sharded (vocabulary-parallel) with the options; beyond 2-D the element dims shard.
TEST(Losses, ClassesShardedAndElementDimsSharded) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {2, 2});
  const Tensor logits = randn({6, 8}, 12, DType::F64);
  const Tensor target = from_vector<int64_t>({7, -100, 2, 5, 1, -100}, {6});
  for (LossReduction r : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
    for (bool nll : {false, true}) {
      const Case c{{6, 8}, {.reduction = r, .label_smoothing = nll ? 0.0 : 0.1}, nll};
      expect_sharded_matches(c, logits, target, mesh, {Shard{0}, Shard{1}},
                             {Shard{0}, Replicate{}});
      expect_sharded_matches(c, logits, target, mesh, {Replicate{}, Shard{1}},
                             {Replicate{}, Replicate{}});
      // A class as ignore_index, with the classes sharded.
      const Case k{{6, 8}, {.reduction = r, .ignore_index = 5, .label_smoothing = 0.0}, nll};
      expect_sharded_matches(k, logits, from_vector<int64_t>({7, 5, 2, 5, 1, 0}, {6}), mesh,
                             {Shard{1}, Shard{0}}, {Replicate{}, Shard{0}});
    }
  }
  // [N, C, d]: d sharded with the target's dim 1 (uneven: 5 over 2).
  const Tensor x3 = randn({2, 4, 5}, 13, DType::F64);
  const Tensor t3 = from_vector<int64_t>({0, 3, -100, 1, 2, 3, -100, -100, 0, 1}, {2, 5});
  const Case none{{2, 4, 5}, {.reduction = LossReduction::None, .label_smoothing = 0.2}};
  expect_sharded_matches(none, x3, t3, mesh, {Shard{2}, Shard{0}}, {Shard{1}, Shard{0}},
                         Placements{Shard{1}, Shard{0}});
  const Case mean{{2, 4, 5}, {.label_smoothing = 0.2}};
  expect_sharded_matches(mean, x3, t3, mesh, {Shard{2}, Replicate{}}, {Shard{1}, Replicate{}},
                         Placements{Partial{}, Replicate{}});
  expect_sharded_matches(mean, x3, t3, mesh, {Shard{2}, Shard{1}}, {Shard{1}, Replicate{}});
}

// mse_loss: shards pass; a Mean over uneven shards divides by the global count (P(sum)).
TEST(Losses, MseLossSharded) {
  World world = World::sim(4);
  const DeviceMesh mesh = *testing::try_mesh(world, {4});
  const Tensor a = randn({6, 3}, 14, DType::F64);
  const Tensor b = randn({6, 3}, 15, DType::F64);
  for (LossReduction r : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
    SCOPED_TRACE(loss_reduction_code(r));
    Tensor la = a.clone().requires_grad_();
    const Tensor want = mse_loss(la, b, r);
    backward(sum(want));
    DTensor da = distribute_tensor(a, mesh, {Shard{0}});
    da.requires_grad_();
    const DTensor out = mse_loss(da, distribute_tensor(b, mesh, {Shard{0}}), r);
    EXPECT_EQ(out.placements(),
              r == LossReduction::None ? Placements{Shard{0}} : Placements{Partial{}});
    EXPECT_TRUE(allclose(out.full_tensor(), want, 1e-12, 1e-12));
    backward(sum(out));
    EXPECT_EQ(da.grad().placements(), da.placements());
    EXPECT_TRUE(allclose(da.grad().full_tensor(), la.grad(), 1e-12, 1e-12));
  }
}

// LocalTensor: each rank's own loss.
TEST(Losses, LocalTensorLossIsEachRanksOwn) {
  World world = World::sim(2);
  const LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return randn({3, 4}, 30 + static_cast<uint64_t>(r), DType::F64);
  });
  const LocalTensor t = LocalTensor::from_fn(world, [](int r) {
    return from_vector<int64_t>({r == 0 ? -100 : 1, 2, 3}, {3});
  });
  const CrossEntropyOptions o{.label_smoothing = 0.1};
  const LocalTensor out = cross_entropy(x, t, o);
  for (int r : world.held_ranks()) {
    EXPECT_TRUE(equal(out.shard(r), cross_entropy(x.shard(r), t.shard(r), o)));
  }
}

}  // namespace
}  // namespace spmd
