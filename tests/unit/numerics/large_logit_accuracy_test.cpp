// The accuracy of logp for logits far from zero, against the bound docs/numerics.md states
// ("Accuracy of logp"): logp = z[t] - LSE is exact up to the rounding of LSE, so its error grows
// with |LSE| as half an ulp of it, whatever the row's shape; and the 1e38 row behaves as stated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "testing/shard_pipeline.hpp"

namespace detlogp {
namespace {

using testing::ForwardResult;
using testing::Logits;

long double half_ulp(float x) {
  const float a = std::fabs(x);
  return 0.5L * (std::nextafter(a, std::numeric_limits<float>::infinity()) - a);
}

// The documented bound: half an ulp of LSE, half an ulp of logp, and the error of log S (which
// does not depend on the offset).
constexpr long double kLogSumError = 1e-5L;

long double exact_logp(const Logits& z, int64_t r, int64_t real, int64_t t) {
  long double m = -INFINITY;
  for (int64_t c = 0; c < real; ++c) m = std::max<long double>(m, z.get(r, c));
  long double s = 0;
  for (int64_t c = 0; c < real; ++c) s += std::exp(static_cast<long double>(z.get(r, c)) - m);
  // The max first: z[t] - m is exact, where m + log(s) would round even in long double at 1e38.
  return (static_cast<long double>(z.get(r, t)) - m) - std::log(s);
}

TEST(LargeLogitAccuracy, LogpErrorStaysWithinHalfAnUlpOfLseAcrossOffsets) {
  constexpr int64_t kReal = 1000, kPadded = 1024, kWidth = 128, kRows = 64;
  const TileGeometry g{kReal, kWidth};
  std::mt19937_64 rng(12);
  for (const float offset : {0.0f, 1.0f, 10.0f, 100.0f, 1e3f, 1e4f, -1e4f}) {
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    Logits x(DType::fp32, kRows, kPadded);
    std::normal_distribution<float> n3(0.0f, 3.0f);
    std::uniform_int_distribution<int64_t> col(0, kReal - 1);
    std::vector<int64_t> targets;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kReal; ++c) x.set(r, c, offset + n3(rng));
      targets.push_back(col(rng));
    }
    testing::fill_padding_garbage(x, kReal);
    const std::vector<int64_t> cuts = testing::make_cuts(kPadded, kWidth, 2, true, rng);
    const ForwardResult f =
        testing::forward_sharded(reference_kernels(), x, g, cuts, 1.0f, false, targets);
    long double worst = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const auto ri = static_cast<size_t>(r);
      const long double want = exact_logp(x, r, kReal, targets[ri]);
      const long double err = std::fabs(f.logp[ri] - want);
      const long double bound = half_ulp(f.lse[ri]) + half_ulp(f.logp[ri]) + kLogSumError;
      EXPECT_LE(err, bound) << "row " << r << " logp " << f.logp[ri] << " lse " << f.lse[ri];
      worst = std::max(worst, err);
    }
    std::printf("offset %g: worst |logp - exact| = %.3g nats (half an ulp of the offset: %.3g)\n",
                static_cast<double>(offset), static_cast<double>(worst),
                static_cast<double>(half_ulp(offset)));
  }
}

// Uniform logits of 1e38 over 256 columns: exactly, logp = -log(256) = -5.545. LSE = 1e38 +
// 5.545 rounds to 1e38 (an ulp there is about 1e31), so logp = z[t] - LSE = 0 exactly: the
// documented behaviour, within the bound, and no overflow or NaN.
TEST(LargeLogitAccuracy, UniformLogitsOf1e38GiveZeroWithinTheBound) {
  constexpr int64_t kReal = 256, kWidth = 128, kRows = 2;
  const TileGeometry g{kReal, kWidth};
  Logits x(DType::fp32, kRows, kReal);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kReal; ++c) x.set(r, c, 1e38f);
  }
  std::mt19937_64 rng(1);
  const std::vector<int64_t> cuts = testing::make_cuts(kReal, kWidth, 2, true, rng);
  const std::vector<int64_t> targets = {0, 255};
  const ForwardResult f =
      testing::forward_sharded(reference_kernels(), x, g, cuts, 1.0f, false, targets);
  for (std::size_t r = 0; r < targets.size(); ++r) {
    EXPECT_EQ(f.lse[r], 1e38f);
    EXPECT_EQ(testing::bits(f.logp[r]), 0u);  // +0.0
    const long double err =
        std::fabs(f.logp[r] - exact_logp(x, static_cast<int64_t>(r), kReal, targets[r]));
    EXPECT_NEAR(static_cast<double>(err), std::log(256.0), 1e-6);
    EXPECT_LE(err, half_ulp(f.lse[r]) + half_ulp(f.logp[r]) + kLogSumError);
  }
}

}  // namespace
}  // namespace detlogp
