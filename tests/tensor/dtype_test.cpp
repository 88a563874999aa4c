// Tests for tensor/dtype.h, tensor/half.h and tensor/float8.h: names, the promotion table, element
// conversions, and BFloat16/Half/Float8 rounding (ties to even, subnormals, overflow, inf/NaN)
// against an independent reference computed in double.
#include <spmd/tensor/dtype.h>

#include <spmd/core/error.h>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace spmd {
namespace {

TEST(DType, NamesSizesAndParsing) {
  const std::size_t sizes[] = {4, 8, 2, 2, 4, 8, 1, 1, 1};
  const char* names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "bool", "f8e4m3fn", "f8e5m2"};
  for (std::size_t i = 0; i < std::size(kAllDTypes); ++i) {
    EXPECT_EQ(itemsize(kAllDTypes[i]), sizes[i]);
    EXPECT_EQ(dtype_name(kAllDTypes[i]), names[i]);
    EXPECT_EQ(parse_dtype(names[i]), kAllDTypes[i]);
    EXPECT_EQ(fmt::format("{}", kAllDTypes[i]), names[i]);
  }
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_dtype("Double"), DType::F64);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("half"), DType::F16);
  EXPECT_EQ(parse_dtype("int"), DType::I32);
  EXPECT_EQ(parse_dtype("long"), DType::I64);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::F8E4M3FN);
  EXPECT_EQ(parse_dtype("float8_e5m2"), DType::F8E5M2);
  EXPECT_EQ(parse_dtype("f8"), std::nullopt);
  EXPECT_EQ(parse_dtype(""), std::nullopt);
}

// Note [Type promotion], row by row in kAllDTypes order: F32 F64 BF16 F16 I32 I64 Bool.
TEST(DType, PromotionTable) {
  using D = DType;
  const D table[7][7] = {
      {D::F32, D::F64, D::F32, D::F32, D::F32, D::F32, D::F32},
      {D::F64, D::F64, D::F64, D::F64, D::F64, D::F64, D::F64},
      {D::F32, D::F64, D::BF16, D::F32, D::BF16, D::BF16, D::BF16},
      {D::F32, D::F64, D::F32, D::F16, D::F16, D::F16, D::F16},
      {D::F32, D::F64, D::BF16, D::F16, D::I32, D::I64, D::I32},
      {D::F32, D::F64, D::BF16, D::F16, D::I64, D::I64, D::I64},
      {D::F32, D::F64, D::BF16, D::F16, D::I32, D::I64, D::Bool},
  };
  for (int i = 0; i < 7; ++i) {
    for (int j = 0; j < 7; ++j) {
      EXPECT_EQ(promote_types(kAllDTypes[i], kAllDTypes[j]), table[i][j])
          << kAllDTypes[i] << " with " << kAllDTypes[j];
    }
  }
  // Float8 promotes with itself alone (PyTorch: "Promotion for Float8 Types is not supported").
  for (DType f8 : kFloat8DTypes) {
    for (DType other : kAllDTypes) {
      if (other == f8) {
        EXPECT_EQ(promote_types(f8, other), f8);
        continue;
      }
      for (auto [a, b] : {std::pair{f8, other}, std::pair{other, f8}}) {
        try {
          promote_types(a, b, "cat");
          ADD_FAILURE() << a << " with " << b << " promoted";
        } catch (const Unsupported& e) {
          EXPECT_NE(std::string(e.what()).find("cat: float8 dtypes promote with no other"),
                    std::string::npos)
              << e.what();
        }
      }
    }
  }
}

TEST(DType, ConvertElementTruncatesAndSaturates) {
  EXPECT_EQ(convert_element<int32_t>(3.7), 3);
  EXPECT_EQ(convert_element<int32_t>(-3.7f), -3);
  EXPECT_EQ(convert_element<int32_t>(1e10), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(convert_element<int32_t>(-1e10f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(convert_element<int64_t>(-1e30), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(convert_element<int64_t>(INFINITY), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(convert_element<int64_t>(NAN), 0);
  EXPECT_EQ(convert_element<int32_t>(BFloat16(NAN)), 0);
  EXPECT_EQ(convert_element<int32_t>(Half(-2.5f)), -2);
  EXPECT_EQ(convert_element<int64_t>(9007199254740992.0), int64_t{9007199254740992});
  EXPECT_TRUE(convert_element<bool>(Half(0.5f)));
  EXPECT_FALSE(convert_element<bool>(BFloat16(-0.0f)));
  EXPECT_EQ(convert_element<double>(true), 1.0);
  EXPECT_EQ(static_cast<float>(convert_element<Half>(int64_t{2049})), 2048.0f);  // ties to even
}

// The nearest value with `mantissa_bits` explicit bits and minimum normal exponent `min_exp`,
// ties to even, computed in double; `max_finite` and above (after rounding) is infinity.
double reference_round(float f, int mantissa_bits, int min_exp, double max_finite) {
  const double x = f;
  if (x == 0 || std::isinf(x)) return x;
  const int e = std::max(std::ilogb(x), min_exp);
  const double quantum = std::ldexp(1.0, e - mantissa_bits);
  const double r = std::nearbyint(x / quantum) * quantum;  // the default mode ties to even
  if (std::abs(r) > max_finite) return std::copysign(INFINITY, x);
  return r;
}

constexpr double kHalfMax = 65504.0;
const double kBFloat16Max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127

template <class H>
void check_rounding(float f, int mantissa_bits, int min_exp, double max_finite) {
  const H h(f);
  const float got = static_cast<float>(h);
  if (std::isnan(f)) {
    EXPECT_TRUE(std::isnan(got)) << "bits of input " << std::bit_cast<uint32_t>(f);
    return;
  }
  const double want = reference_round(f, mantissa_bits, min_exp, max_finite);
  ASSERT_EQ(static_cast<double>(got), want)
      << "input " << fmt::format("{:a}", f) << " got " << fmt::format("{:a}", got) << " want "
      << fmt::format("{:a}", want);
  EXPECT_EQ(std::signbit(got), std::signbit(f));
}

// Floats near the representable range of a 16-bit type, including exact ties.
std::vector<float> sample_floats(int lo_exp, int hi_exp, int mantissa_bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  for (int i = 0; i < 200000; ++i) {
    const int e = std::uniform_int_distribution<int>(lo_exp, hi_exp)(rng);
    const double m = 1.0 + std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    float f = static_cast<float>(std::ldexp(m, e));
    if (i % 4 == 0) {
      // An exact tie between two neighbours at this exponent.
      const double q = std::ldexp(1.0, e - mantissa_bits);
      f = static_cast<float>((std::floor(std::ldexp(m, e) / q) + 0.5) * q);
    }
    out.push_back(i % 2 ? -f : f);
  }
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) out.push_back(std::bit_cast<float>(bits(rng)));
  return out;
}

TEST(Half, RoundsToNearestEvenAgainstReference) {
  for (float f : sample_floats(-27, 16, 10, 1)) {
    check_rounding<Half>(f, 10, -14, kHalfMax);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(BFloat16, RoundsToNearestEvenAgainstReference) {
  for (float f : sample_floats(-135, 127, 7, 2)) {
    check_rounding<BFloat16>(f, 7, -126, kBFloat16Max);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Half, EveryBitPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = Half::to_float(bits);
    const int exponent = (bits >> 10) & 0x1f;
    const int mantissa = bits & 0x3ff;
    double want;
    if (exponent == 0) {
      want = std::ldexp(mantissa, -24);
    } else if (exponent == 31) {
      want = mantissa ? NAN : INFINITY;
    } else {
      want = std::ldexp(1024 + mantissa, exponent - 25);
    }
    if (bits & 0x8000) want = -want;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << bits;
      ASSERT_TRUE(std::isnan(static_cast<float>(Half(f))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << "bits " << bits;
    ASSERT_EQ(Half(f).bits, bits) << "round trip of bits " << bits;
  }
}

TEST(BFloat16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(BFloat16::from_bits(bits));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(static_cast<float>(BFloat16(f))));
      continue;
    }
    ASSERT_EQ(BFloat16(f).bits, bits);
  }
}

TEST(Half, EdgeCases) {
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half(65519.0f).bits, 0x7bff);
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);  // the tie above the largest finite goes to inf
  EXPECT_EQ(Half(-INFINITY).bits, 0xfc00);
  EXPECT_EQ(Half(std::ldexp(1.0f, -24)).bits, 0x0001);     // smallest subnormal
  EXPECT_EQ(Half(std::ldexp(1.0f, -25)).bits, 0x0000);     // tie with zero: even
  EXPECT_EQ(Half(std::ldexp(1.5f, -25)).bits, 0x0001);     // above the tie
  EXPECT_EQ(Half(std::ldexp(3.0f, -25)).bits, 0x0002);     // tie between 1 and 2: even
  EXPECT_EQ(Half(std::ldexp(1023.5f, -24)).bits, 0x0400);  // largest subnormal rounds up
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
  EXPECT_EQ(Half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie: even (down)
  EXPECT_EQ(Half(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie: even (up)
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
}

TEST(BFloat16, EdgeCases) {
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);        // tie: even (down)
  EXPECT_EQ(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);    // tie: even (up)
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // overflow to inf
  EXPECT_EQ(BFloat16(std::ldexp(1.0f, -133)).bits, 0x0001);             // subnormal
  EXPECT_EQ(BFloat16(-INFINITY).bits, 0xff80);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(-NAN))));
}

// ---- float8 (Note [Float8]) against a brute-force reference ----------------------------------

// An FP8 format as the OCP spec defines it, written out independently of tensor/float8.h.
struct Float8Spec {
  int exponent_bits, mantissa_bits, bias;
  bool has_infinity;  // e5m2: IEEE-like; e4m3fn: no infinity, one NaN mantissa pattern
  double max_finite;
};
constexpr Float8Spec kE4M3FNSpec{4, 3, 7, false, 448.0};
constexpr Float8Spec kE5M2Spec{5, 2, 15, true, 57344.0};

// The value of code c (sign clear), or NaN / infinity.
double spec_value(const Float8Spec& f, int c) {
  const int e = c >> f.mantissa_bits;
  const int m = c & ((1 << f.mantissa_bits) - 1);
  const int top = (1 << f.exponent_bits) - 1;
  if (f.has_infinity && e == top) return m == 0 ? INFINITY : NAN;
  if (!f.has_infinity && e == top && m == (1 << f.mantissa_bits) - 1) return NAN;
  if (e == 0) return std::ldexp(m, 1 - f.bias - f.mantissa_bits);
  return std::ldexp((1 << f.mantissa_bits) + m, e - f.bias - f.mantissa_bits);
}

// The value float x rounds to: the nearest of the finite codes and one code past the largest
// (its value the largest plus one unit), ties to the even code; past the largest is the
// overflow value (an infinity for e5m2, NaN for e4m3fn).
double spec_round(const Float8Spec& f, float x) {
  if (std::isnan(x)) return NAN;
  const double a = std::fabs(static_cast<double>(x));
  int max_code = 0;
  while (spec_value(f, max_code + 1) == spec_value(f, max_code + 1) &&
         !std::isinf(spec_value(f, max_code + 1)))
    ++max_code;
  const double unit = spec_value(f, max_code) - spec_value(f, max_code - 1);
  int best = 0;
  double best_distance = INFINITY;
  for (int c = 0; c <= max_code + 1; ++c) {
    const double v = c <= max_code ? spec_value(f, c) : spec_value(f, max_code) + unit;
    const double d = std::fabs(v - a);
    if (d < best_distance || (d == best_distance && c % 2 == 0)) {
      best_distance = d;
      best = c;
    }
  }
  const double magnitude =
      best > max_code ? (f.has_infinity ? INFINITY : NAN) : spec_value(f, best);
  return std::signbit(x) ? -magnitude : magnitude;
}

template <class T>
void expect_float8_matches_spec(const Float8Spec& f) {
  // Every code decodes to the spec's value, and every non-NaN value encodes back to its code.
  for (int b = 0; b < 256; ++b) {
    const double want = (b & 0x80 ? -1.0 : 1.0) * spec_value(f, b & 0x7f);
    const float got = T::to_float(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << b;
    EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << "code " << b;
    EXPECT_EQ(T::from_float(got), b) << "code " << b;
  }
  auto check = [&](float x) {
    const double want = spec_round(f, x);
    const float got = T::to_float(T::from_float(x));
    if (std::isnan(want)) return std::isnan(got);
    return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
  };
  // Every midpoint between neighbours and the floats either side of it (ties, and rounding
  // just above and below them), both signs.
  int failures = 0;
  for (int c = 0; c < 127 && failures < 5; ++c) {
    const double lo = spec_value(f, c);
    const double hi = c + 1 < 127 ? spec_value(f, c + 1) : f.max_finite * 2;
    if (std::isnan(hi) || std::isinf(hi)) break;
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), -mid}) {
      if (!check(x)) {
        ADD_FAILURE() << "x = " << x << " rounds to " << T::to_float(T::from_float(x))
                      << ", spec: " << spec_round(f, x);
        ++failures;
      }
    }
  }
  // A sweep over float bit patterns (every magnitude class, subnormals and infinities included).
  for (uint64_t u = 0; u < (1ull << 32) && failures < 5; u += 65537) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (!std::isinf(x) && std::fabs(x) > 1e6f) continue;  // far past the range: the overflow
    if (!check(x)) {
      ADD_FAILURE() << "x = " << x << " rounds to " << T::to_float(T::from_float(x))
                    << ", spec: " << spec_round(f, x);
      ++failures;
    }
  }
}

TEST(Float8, E4M3FNMatchesTheSpecOnEveryCodeMidpointAndASweep) {
  expect_float8_matches_spec<Float8E4M3FN>(kE4M3FNSpec);
  // PyTorch's cast: 464 (the tie between 448 and 480) stays 448, above it is NaN, inf is NaN.
  EXPECT_EQ(Float8E4M3FN::to_float(Float8E4M3FN::from_float(464.0f)), 448.0f);
  EXPECT_TRUE(std::isnan(Float8E4M3FN::to_float(Float8E4M3FN::from_float(464.5f))));
  EXPECT_TRUE(std::isnan(Float8E4M3FN::to_float(Float8E4M3FN::from_float(INFINITY))));
  EXPECT_EQ(Float8E4M3FN::to_float(1), 0x1p-9f);  // the smallest subnormal
}

TEST(Float8, E5M2MatchesTheSpecOnEveryCodeMidpointAndASweep) {
  expect_float8_matches_spec<Float8E5M2>(kE5M2Spec);
  EXPECT_EQ(Float8E5M2::to_float(Float8E5M2::from_float(61439.0f)), 57344.0f);
  EXPECT_EQ(Float8E5M2::to_float(Float8E5M2::from_float(61440.0f)), INFINITY);
  EXPECT_EQ(Float8E5M2::to_float(Float8E5M2::from_float(-INFINITY)), -INFINITY);
  EXPECT_EQ(Float8E5M2::to_float(1), 0x1p-16f);
}

TEST(Float8, ConvertElementGoesThroughFloat) {
  EXPECT_EQ(convert_element<double>(Float8E4M3FN(3.0f)), 3.0);
  EXPECT_EQ(convert_element<int32_t>(Float8E4M3FN(-2.75f)), -2);
  EXPECT_EQ(convert_element<bool>(Float8E5M2(0.0f)), false);
  EXPECT_EQ(float(convert_element<Float8E5M2>(Float8E4M3FN(448.0f))), 448.0f);
  EXPECT_TRUE(std::isnan(float(convert_element<Float8E4M3FN>(int64_t{1000}))));  // past 464
}

}  // namespace
}  // namespace spmd
