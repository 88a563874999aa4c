// Tests for tensor/random.h: the Random123 known-answer vectors of Philox4x32-10, element i as
// a pure function of (seed, i), blocks equal to slices of the full tensor, and coarse
// distribution checks (means and variances within a few standard errors).
#include <spmd/tensor/random.h>

#include <gtest/gtest.h>

#include <cmath>

#include <spmd/ops/ops.h>
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::expect_throws;
using testing::Gen;
using testing::values;

TEST(Philox, KnownAnswerVectors) {
  using W4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (W4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (W4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, ScalarsAreInRangeAndDependOnSeedAndIndex) {
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = philox_uniform(5, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_TRUE(std::isfinite(philox_normal(5, i)));
  }
  EXPECT_EQ(philox_uniform(1, 7), philox_uniform(1, 7));
  EXPECT_NE(philox_uniform(1, 7), philox_uniform(2, 7));
  EXPECT_NE(philox_uniform(1, 7), philox_uniform(1, 8));
  // The index's high word and the seed's high word both matter.
  EXPECT_NE(philox_uniform(1, uint64_t{1} << 32), philox_uniform(1, 0));
  EXPECT_NE(philox_uniform(uint64_t{1} << 32, 0), philox_uniform(0, 0));
}

TEST(Random, ElementsArePhiloxOfTheirFlatIndexInEveryDType) {
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const Tensor u = rand({3, 5, 7}, 42, d);
    const Tensor n = randn({3, 5, 7}, 42, d);
    ASSERT_EQ(u.dtype(), d);
    ASSERT_EQ(u.shape(), (Shape{3, 5, 7}));
    const auto uv = values(u);
    const auto nv = values(n);
    for (std::size_t i = 0; i < uv.size(); ++i) {
      const double want = testing::round_to(d, philox_uniform(42, i));
      // rand stays below 1 after rounding: a value that rounds up to 1 becomes the next lower.
      if (want < 1.0) {
        ASSERT_EQ(uv[i], want) << d << " element " << i;
      } else {
        ASSERT_LT(uv[i], 1.0);
      }
      ASSERT_EQ(nv[i], testing::round_to(d, philox_normal(42, i))) << d << " element " << i;
    }
  }
  EXPECT_TRUE(equal(randn({4, 4}, 3), randn({4, 4}, 3)));
  EXPECT_FALSE(equal(randn({4, 4}, 3), randn({4, 4}, 4)));
  EXPECT_EQ(randn({}, 1).item<float>(), static_cast<float>(philox_normal(1, 0)));
  EXPECT_EQ(rand({0, 3}, 1).numel(), 0);
}

TEST(Random, BlocksEqualSlicesOfTheFullTensor) {
  Gen gen(31);
  for (int trial = 0; trial < 200; ++trial) {
    const Shape global = gen.shape(0, 4);
    Shape start(global.size());
    Shape sizes(global.size());
    for (std::size_t d = 0; d < global.size(); ++d) {
      start[d] = gen.uniform(0, global[d]);
      sizes[d] = gen.uniform(0, global[d] - start[d]);
    }
    const uint64_t seed = static_cast<uint64_t>(gen.uniform(0, 1 << 30));
    const DType dtype = kAllDTypes[gen.uniform(0, 3)];
    Tensor slice_u = rand(global, seed, dtype);
    Tensor slice_n = randn(global, seed, dtype);
    for (std::size_t d = 0; d < global.size(); ++d) {
      slice_u = slice_u.narrow(static_cast<int64_t>(d), start[d], sizes[d]);
      slice_n = slice_n.narrow(static_cast<int64_t>(d), start[d], sizes[d]);
    }
    EXPECT_TRUE(equal(rand_block(global, seed, start, sizes, dtype), slice_u))
        << shape_str(global) << " block " << shape_str(start) << " + " << shape_str(sizes);
    EXPECT_TRUE(equal(randn_block(global, seed, start, sizes, dtype), slice_n))
        << shape_str(global) << " block " << shape_str(start) << " + " << shape_str(sizes);
  }
}

// Note [Philox in lanes]: rows longer than the lanes, and not a multiple of them, at an offset in
// the full tensor, give the scalar stream's values; dropout's mask is 1 / (1 - p) where rand's F64
// value is >= p, else 0.
TEST(Random, LongRowsGiveTheScalarStream) {
  const Shape global = {3, 4, 1000};
  const Shape start = {1, 1, 7};
  const Shape sizes = {2, 3, 981};
  const uint64_t seed = (uint64_t{7} << 32) | 11;
  const auto u = values(rand_block(global, seed, start, sizes, DType::F64));
  const auto n = values(randn_block(global, seed, start, sizes, DType::F64));
  const auto keep = values(dropout_mask_block(global, seed, start, sizes, 0.3, DType::F64));
  std::size_t i = 0;
  int64_t kept = 0;
  for (int64_t a = 0; a < sizes[0]; ++a) {
    for (int64_t b = 0; b < sizes[1]; ++b) {
      for (int64_t c = 0; c < sizes[2]; ++c, ++i) {
        const auto flat = static_cast<uint64_t>(
            ((start[0] + a) * global[1] + start[1] + b) * global[2] + start[2] + c);
        ASSERT_EQ(u[i], philox_uniform(seed, flat)) << "element " << i;
        ASSERT_EQ(n[i], philox_normal(seed, flat)) << "element " << i;
        ASSERT_EQ(keep[i], philox_uniform(seed, flat) >= 0.3 ? 1.0 / 0.7 : 0.0) << "element " << i;
        kept += keep[i] != 0.0;
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, static_cast<int64_t>(i));
  const Tensor f32 = dropout_mask_block(global, seed, start, sizes, 0.3, DType::F32);
  EXPECT_EQ(f32.dtype(), DType::F32);
  EXPECT_TRUE(equal(
      f32, where(ge(rand_block(global, seed, start, sizes, DType::F64), full({}, 0.3, DType::F64)),
                 full({}, 1.0 / 0.7, DType::F32), full({}, 0.0, DType::F32))));
  expect_throws<ShapeError>(
      [&] {
        dropout_mask_block(global, seed, {0, 0, 990}, sizes, 0.5, DType::F32);
      },
      {"dropout", "does not lie inside"});
}

// The keep test at its ends (the vector loop compares the 53 bits with a threshold clamped to
// 2^53): p = 0 keeps everything, p = 1 nothing, p = 2^-53 drops only a value of exactly 0, and p
// just below 1 keeps only values above it; each as rand's F64 value >= p says, in F32 and F64.
TEST(Random, DropoutMaskAtTheEndsOfP) {
  const Shape global = {4, 1000};
  const uint64_t seed = 3;
  const Tensor u = rand_block(global, seed, {0, 0}, global, DType::F64);
  for (double p : {0.0, 1.0, std::ldexp(1.0, -53), 1.0 - std::ldexp(1.0, -20)}) {
    for (DType dtype : {DType::F32, DType::F64}) {
      SCOPED_TRACE(fmt::format("p {} {}", p, dtype));
      const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 1.0;
      const Tensor want =
          where(ge(u, full({}, p, DType::F64)), full({}, scale, dtype), full({}, 0.0, dtype));
      EXPECT_TRUE(equal(dropout_mask_block(global, seed, {0, 0}, global, p, dtype), want));
    }
  }
}

// Note [Philox in lanes]: every vector version this CPU runs gives philox4x32's words bit for bit,
// for every lane count (one chain or all of them) and counters whose low word wraps.
TEST(Philox, EveryLaneVersionGivesTheScalarWords) {
  int versions = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1234}, uint64_t{0xdeadbeefcafebabe}}) {
    for (uint64_t index0 : {uint64_t{0}, uint64_t{5}, uint64_t{0xffffffe9}, ~uint64_t{0} - 40}) {
      for (int n : {1, 7, 8, 9, 16, 17, 31, 32}) {
        const auto by_version = detail::philox_lanes_by_version(seed, index0, n);
        versions = static_cast<int>(by_version.size());
        for (const auto& [name, words] : by_version) {
          ASSERT_EQ(words.size(), static_cast<std::size_t>(n)) << name;
          for (int l = 0; l < n; ++l) {
            const uint64_t i = index0 + static_cast<uint64_t>(l);
            const std::array<uint32_t, 4> want =
                philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0u, 0u},
                           {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
            ASSERT_EQ(words[static_cast<std::size_t>(l)], want)
                << name << ": seed " << seed << ", lane " << l << " of " << n << " at " << index0;
          }
        }
      }
    }
  }
  EXPECT_GE(versions, 1);
}

// dropout's keep test on the bits equals rand's F64 value >= p at the boundary: p equal to an
// element's value keeps it, the next double above drops it; p = 0 keeps all, p = 1 none.
TEST(Random, DropoutKeepsExactlyTheValuesAtLeastP) {
  const Shape shape = {64};
  const uint64_t seed = 99;
  const std::vector<double> u = values(rand(shape, seed, DType::F64));
  for (int64_t i : {int64_t{0}, int64_t{17}, int64_t{63}}) {
    const double p = u[static_cast<std::size_t>(i)];
    for (double q : {p, std::nextafter(p, 1.0), std::nextafter(p, 0.0)}) {
      const std::vector<double> keep =
          values(dropout_mask_block(shape, seed, {0}, shape, q, DType::F64));
      for (std::size_t j = 0; j < u.size(); ++j) {
        ASSERT_EQ(keep[j], u[j] >= q ? 1.0 / (1.0 - q) : 0.0) << "p " << q << ", element " << j;
      }
    }
  }
  EXPECT_EQ(values(dropout_mask_block(shape, seed, {0}, shape, 0.0, DType::F64)),
            std::vector<double>(64, 1.0));
  EXPECT_EQ(values(dropout_mask_block(shape, seed, {0}, shape, 1.0, DType::F64)),
            std::vector<double>(64, 0.0));
}

TEST(Random, DistributionsLookRight) {
  constexpr int64_t kN = 1 << 20;
  const auto u = values(rand({kN}, 9, DType::F64));
  const auto n = values(randn({kN}, 9, DType::F64));
  double su = 0, suu = 0, sn = 0, snn = 0;
  for (int64_t i = 0; i < kN; ++i) {
    su += u[static_cast<std::size_t>(i)];
    suu += u[static_cast<std::size_t>(i)] * u[static_cast<std::size_t>(i)];
    sn += n[static_cast<std::size_t>(i)];
    snn += n[static_cast<std::size_t>(i)] * n[static_cast<std::size_t>(i)];
  }
  const double mu = su / kN;
  const double mn = sn / kN;
  // Standard errors: sqrt(1/12 / N) ~ 2.8e-4 for the uniform mean, 1/sqrt(N) ~ 1e-3 for normal.
  EXPECT_NEAR(mu, 0.5, 2e-3);
  EXPECT_NEAR(suu / kN - mu * mu, 1.0 / 12, 2e-3);
  EXPECT_NEAR(mn, 0.0, 5e-3);
  EXPECT_NEAR(snn / kN - mn * mn, 1.0, 1e-2);
  // Coarse dtypes never round rand up to 1.
  for (DType d : {DType::BF16, DType::F16}) EXPECT_LT(amax(rand({kN}, 2, d)).item<float>(), 1.0f);
}

TEST(Random, Errors) {
  expect_throws<ShapeError>(
      [] {
        rand_block({4, 4}, 0, {2, 2}, {3, 1});
      },
      {"rand", "[2, 2]", "[3, 1]", "[4, 4]"});
  expect_throws<ShapeError>([] { randn_block({4, 4}, 0, {0}, {1}); }, {"randn", "[4, 4]"});
  expect_throws<ShapeError>([] { randn_block({4}, 0, {-1}, {1}); }, {"randn", "[-1]"});
  expect_throws<ShapeError>([] { randn({-2}, 0); }, {"randn", "-2"});
  expect_throws<Unsupported>([] { rand({2}, 0, DType::I32); }, {"rand", "i32"});
  expect_throws<Unsupported>([] { randn({2}, 0, DType::Bool); }, {"randn", "bool"});
}

}  // namespace
}  // namespace spmd
