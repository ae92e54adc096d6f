// Logit dtype conversions of the canon: exact widening of every bf16 and fp16 bit pattern, and
// round-to-nearest-even narrowing checked against an independent nearest-value search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"

namespace detlogp {
namespace {

using testing::bits;
using testing::from_bits;

// A 16-bit IEEE-style binary format: 1 sign bit, `exp_bits` exponent bits (bias
// 2^(exp_bits-1) - 1), `man_bits` mantissa bits. Value of pattern h from its fields, in double.
double half_value(uint16_t h, int exp_bits, int man_bits, bool* is_nan) {
  const int sign = h >> 15;
  const int exp_max = (1 << exp_bits) - 1;
  const int bias = exp_max / 2;
  const int exp = (h >> man_bits) & exp_max;
  const int man = h & ((1 << man_bits) - 1);
  *is_nan = exp == exp_max && man != 0;
  double v;
  if (exp == exp_max) {
    v = man ? std::nan("") : HUGE_VAL;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits), exp - bias);
  }
  return sign ? -v : v;
}

// bf16: 8 exponent bits (bias 127), 7 mantissa bits.
double bf16_value(uint16_t h, bool* is_nan) { return half_value(h, 8, 7, is_nan); }

// fp16: 5 exponent bits (bias 15), 10 mantissa bits.
double fp16_value(uint16_t h, bool* is_nan) { return half_value(h, 5, 10, is_nan); }

// Widening `widen` gives, for every 16-bit pattern, the value of its fields (`value`); -0 stays -0.
void expect_widening_exact(double (*value)(uint16_t, bool*), float (*widen)(uint16_t)) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto h = static_cast<uint16_t>(b);
    bool nan = false;
    const double want = value(h, &nan);
    const float got = widen(h);
    if (nan) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << b;
    EXPECT_EQ(std::signbit(got), (b & 0x8000u) != 0) << b;  // -0 stays -0
  }
}

TEST(DtypeWiden, EveryBf16PatternIsExact) {
  expect_widening_exact(bf16_value, canon::bf16_to_float);
}

TEST(DtypeWiden, EveryFp16PatternIsExact) {
  expect_widening_exact(fp16_value, canon::fp16_to_float);
}

// Independent round-to-nearest-even narrowing: the non-negative finite values of the format,
// sorted, with +inf appended as the value one ulp above the largest (IEEE's overflow rule:
// |x| >= max + ulp/2 rounds to inf, ties included since max has an odd significand).
struct Narrower {
  std::vector<double> values;   // ascending, values[i] has bit pattern i (i < count)
  std::vector<uint16_t> codes;  // bit patterns (no sign)
  uint16_t inf_code;
  uint16_t nan_code;

  uint16_t operator()(float f) const {
    if (std::isnan(f)) return nan_code;
    const double a = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const auto it = std::lower_bound(values.begin(), values.end(), a);
    if (it == values.end()) return sign | inf_code;  // beyond max + ulp: inf
    const size_t hi = static_cast<size_t>(it - values.begin());
    if (*it == a || hi == 0) return sign | codes[hi];
    const size_t lo = hi - 1;
    const double dlo = a - values[lo];
    const double dhi = values[hi] - a;  // exact: both are in a double's range and precision
    if (dlo < dhi) return sign | codes[lo];
    if (dhi < dlo) return sign | codes[hi];
    return sign | ((codes[lo] & 1u) == 0 ? codes[lo] : codes[hi]);  // tie: even significand
  }
};

Narrower make_narrower(bool bf16) {
  Narrower n;
  const uint16_t inf_code = bf16 ? 0x7f80 : 0x7c00;
  for (uint32_t b = 0; b < inf_code; ++b) {
    bool nan = false;
    n.values.push_back(bf16 ? bf16_value(static_cast<uint16_t>(b), &nan)
                            : fp16_value(static_cast<uint16_t>(b), &nan));
    n.codes.push_back(static_cast<uint16_t>(b));
  }
  // inf as "the next value": max + one ulp of max (2^128 for bf16, 2^16 for fp16), even code.
  n.values.push_back(bf16 ? std::ldexp(1.0, 128) : 65536.0);
  n.codes.push_back(inf_code);
  n.inf_code = inf_code;
  n.nan_code = bf16 ? canon::kCanonicalBf16NanBits : canon::kCanonicalFp16NanBits;
  return n;
}

// Inputs that stress rounding: every exact value of the 16-bit format, every midpoint between
// neighbours and the floats just around them, plus a strided sweep of all fp32 patterns.
std::vector<float> narrowing_inputs(const Narrower& n) {
  std::vector<float> xs;
  for (size_t i = 0; i + 1 < n.values.size(); ++i) {
    const auto v = static_cast<float>(n.values[i]);
    const auto mid = static_cast<float>((n.values[i] + n.values[i + 1]) / 2);  // exact in fp32
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, testing::kInf)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (uint64_t b = 0; b <= 0xffffffffu; b += 1021)
    xs.push_back(from_bits(static_cast<uint32_t>(b)));
  for (float x : {0.0f, -0.0f, testing::kInf, -testing::kInf, 3.4028235e38f, -3.4028235e38f,
                  65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e-45f, 5.9604645e-08f, 2.9802322e-08f,
                  2.9802326e-08f, 8.940697e-08f}) {
    xs.push_back(x);
  }
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu}) {
    xs.push_back(from_bits(nan));
  }
  return xs;
}

// `narrow` agrees with the independent search on every rounding-stress input; counts them.
void expect_rounds_to_nearest_even(bool bf16, uint16_t (*narrow)(float), int64_t* checked) {
  const Narrower want = make_narrower(bf16);
  for (float x : narrowing_inputs(want)) {
    const uint16_t got = narrow(x);
    ASSERT_EQ(got, want(x)) << "x = " << x << " bits 0x" << std::hex << bits(x);
    ++*checked;
  }
}

TEST(DtypeNarrow, Bf16RoundsToNearestEven) {
  int64_t checked = 0;
  expect_rounds_to_nearest_even(true, canon::float_to_bf16, &checked);
  EXPECT_GT(checked, 4000000);
}

TEST(DtypeNarrow, Fp16RoundsToNearestEven) {
  int64_t checked = 0;
  expect_rounds_to_nearest_even(false, canon::float_to_fp16, &checked);
}

TEST(DtypeNarrow, NamedCases) {
  // Ties to even, overflow, subnormals, -0, canonical NaN.
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even down
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, even up
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(canon::float_to_bf16(3.4028235e38f), 0x7f80);  // rounds to inf
  EXPECT_EQ(canon::float_to_bf16(-3.4028235e38f), 0xff80);
  EXPECT_EQ(canon::float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie, even
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(canon::float_to_bf16(from_bits(0xffc00001u)), canon::kCanonicalBf16NanBits);
  EXPECT_EQ(canon::float_to_bf16(from_bits(0x7f800001u)), canon::kCanonicalBf16NanBits);
  EXPECT_EQ(canon::float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(canon::float_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(canon::float_to_fp16(65520.0f), 0x7c00);  // tie between max and 2^16: inf
  EXPECT_EQ(canon::float_to_fp16(-1e6f), 0xfc00);
  EXPECT_EQ(canon::float_to_fp16(5.9604645e-08f), 0x0001);   // 2^-24, smallest subnormal
  EXPECT_EQ(canon::float_to_fp16(2.9802322e-08f), 0x0000);   // 2^-25: tie, rounds to even 0
  EXPECT_EQ(canon::float_to_fp16(8.940697e-08f), 0x0002);    // 1.5 * 2^-24: tie, to even 2
  EXPECT_EQ(canon::float_to_fp16(-2.9802326e-08f), 0x8001);  // just above the tie
  EXPECT_EQ(canon::float_to_fp16(6.097555e-05f), 0x03ff);    // largest subnormal
  EXPECT_EQ(canon::float_to_fp16(6.1035156e-05f), 0x0400);   // 2^-14
  EXPECT_EQ(canon::float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(canon::float_to_fp16(from_bits(0x7fc12345u)), canon::kCanonicalFp16NanBits);
}

TEST(DtypeNarrow, RoundTripOfEveryPatternIsIdentity) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = canon::bf16_to_float(h);
    const float g = canon::fp16_to_float(h);
    if (!std::isnan(f)) {
      EXPECT_EQ(canon::float_to_bf16(f), h) << b;
    }
    if (!std::isnan(g)) {
      EXPECT_EQ(canon::float_to_fp16(g), h) << b;
    }
  }
}

TEST(Canonicalize, NanPayloads) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t payload = static_cast<uint32_t>(rng()) & 0x7fffffu;
    const uint32_t sign = static_cast<uint32_t>(rng()) & 0x80000000u;
    const float nan = from_bits(sign | 0x7f800000u | (payload ? payload : 1u));
    EXPECT_EQ(bits(canon::canonicalize(nan)), testing::kCanonicalNan);
  }
  EXPECT_EQ(bits(canon::canonicalize(-0.0f)), 0x80000000u);
  EXPECT_EQ(bits(canon::canonicalize(testing::kInf)), 0x7f800000u);
}

}  // namespace
}  // namespace detlogp
