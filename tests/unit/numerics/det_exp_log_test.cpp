// det_exp and det_log (numerics.md "Arithmetic"): special values and dense samples against
// double-precision libm. The exhaustive sweeps are in exhaustive_exp_log.cpp (label exhaustive).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "ulp.hpp"

namespace detlogp {
namespace {

using canon::det_exp;
using canon::det_log;
using testing::bits;
using testing::from_bits;
using testing::kInf;

TEST(DetExp, SpecialValues) {
  EXPECT_EQ(bits(det_exp(0.0f)), bits(1.0f));
  EXPECT_EQ(bits(det_exp(-0.0f)), bits(1.0f));
  EXPECT_EQ(bits(det_exp(-kInf)), bits(0.0f));  // +0, not -0
  EXPECT_EQ(bits(det_exp(kInf)), bits(kInf));
  EXPECT_EQ(bits(det_exp(100.0f)), bits(kInf));
  EXPECT_EQ(bits(det_exp(-100.0f)), bits(0.0f));
  EXPECT_EQ(bits(det_exp(-1e30f)), bits(0.0f));
  EXPECT_EQ(bits(det_exp(-3.4e38f)), bits(0.0f));
  EXPECT_TRUE(std::isnan(det_exp(from_bits(0x7fc00000u))));
  EXPECT_TRUE(std::isnan(det_exp(from_bits(0xffc00001u))));
  EXPECT_TRUE(std::isnan(det_exp(from_bits(0x7f800001u))));
  // Tiny arguments: exp(x) rounds to 1 or its neighbours, never anything else.
  for (float x : {1e-30f, -1e-30f, 1e-45f, -1e-45f, 1e-40f, -1e-40f, 1e-8f, -1e-8f}) {
    const float y = det_exp(x);
    EXPECT_LE(testing::ulp_error(y, std::exp(static_cast<double>(x))), 1.0) << x;
  }
  // ln 2 multiples land on powers of two within an ulp.
  for (int k = -125; k <= 127; ++k) {
    const float x = static_cast<float>(k) * 0.693147180559945309f;
    EXPECT_LE(testing::ulp_error(det_exp(x), std::exp(static_cast<double>(x))), 1.0) << k;
  }
}

TEST(DetExp, FlushBelowNormalRangeToPlusZero) {
  // Every result is either 0 (+0) or >= 2^-126, whatever the argument, with no hardware mode.
  const double threshold = std::log(0x1p-126);  // about -87.3365
  for (uint32_t b = canon::bits_of(-86.0f); b <= canon::bits_of(-104.0f); b += 7) {
    const float x = from_bits(b);
    const float y = det_exp(x);
    if (y != 0.0f) {
      EXPECT_GE(y, canon::kMinNormal) << x;
      EXPECT_LE(testing::ulp_error(y, std::exp(static_cast<double>(x))), 1.0) << x;
    } else {
      EXPECT_EQ(bits(y), 0u) << x;  // +0
      // Flushed only where the true value is below (or within an ulp of) 2^-126.
      EXPECT_LT(static_cast<double>(x), threshold + 1e-6) << x;
    }
    if (static_cast<double>(x) < threshold - 1e-5) {
      EXPECT_EQ(bits(y), 0u) << x;
    }
  }
  // Overflow: exp(x) > FLT_MAX from x > ln(FLT_MAX) ~ 88.7228.
  EXPECT_EQ(bits(det_exp(88.8f)), bits(kInf));
  EXPECT_EQ(bits(det_exp(88.75f)), bits(kInf));
  EXPECT_LE(testing::ulp_error(det_exp(88.72f), std::exp(static_cast<double>(88.72f))), 1.0);
}

TEST(DetExp, DenseSampleWithinOneUlp) {
  // Every 97th float in [-87, 0] (about 11.5 million).
  double worst = 0.0;
  float worst_x = 0.0f;
  for (uint32_t b = 0x80000000u; b <= canon::bits_of(-87.0f); b += 97) {
    const float x = from_bits(b);
    const double e = testing::ulp_error(det_exp(x), std::exp(static_cast<double>(x)));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_x;
  // A sample of positive arguments too (not in the canon's bound but should stay close).
  for (uint32_t b = 0; b <= canon::bits_of(88.0f); b += 9973) {
    const float x = from_bits(b);
    EXPECT_LE(testing::ulp_error(det_exp(x), std::exp(static_cast<double>(x))), 1.0) << x;
  }
}

TEST(DetLog, SpecialValues) {
  EXPECT_EQ(bits(det_log(1.0f)), bits(0.0f));
  EXPECT_EQ(bits(det_log(0.0f)), bits(-kInf));
  EXPECT_EQ(bits(det_log(-0.0f)), bits(-kInf));
  EXPECT_EQ(bits(det_log(kInf)), bits(kInf));
  EXPECT_EQ(bits(det_log(-1.0f)), testing::kCanonicalNan);
  EXPECT_EQ(bits(det_log(-kInf)), testing::kCanonicalNan);
  EXPECT_TRUE(std::isnan(det_log(from_bits(0x7fc00000u))));
  EXPECT_TRUE(std::isnan(det_log(from_bits(0xffc00001u))));
  // Powers of two, subnormals and the largest float.
  for (int k = -149; k <= 127; ++k) {
    const float x = std::ldexp(1.0f, k);
    EXPECT_LE(testing::ulp_error(det_log(x), std::log(static_cast<double>(x))), 1.0) << k;
  }
  for (uint32_t b = 1; b < 0x00800000u; b += 4099) {
    const float x = from_bits(b);
    EXPECT_LE(testing::ulp_error(det_log(x), std::log(static_cast<double>(x))), 1.0) << b;
  }
  EXPECT_LE(testing::ulp_error(det_log(3.4028235e38f), std::log(3.4028235e38)), 1.0);
}

TEST(DetLog, DenseSampleWithinOneUlp) {
  // Every 97th float in [1, 2^24] (about 2 million), and the integers 1..4096 (values of S).
  double worst = 0.0;
  float worst_x = 0.0f;
  for (uint32_t b = canon::bits_of(1.0f); b <= canon::bits_of(16777216.0f); b += 97) {
    const float x = from_bits(b);
    const double e = testing::ulp_error(det_log(x), std::log(static_cast<double>(x)));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  for (int i = 1; i <= 4096; ++i) {
    const float x = static_cast<float>(i);
    EXPECT_LE(testing::ulp_error(det_log(x), std::log(static_cast<double>(x))), 1.0) << i;
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_x;
}

}  // namespace
}  // namespace detlogp
