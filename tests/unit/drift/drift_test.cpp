// The drift statistics of include/detlogp/drift.hpp (shared by the CLI and Python).
#include "detlogp/drift.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

using ::testing::HasSubstr;

TEST(Drift, StatisticsOverTheMaskOnly) {
  const std::vector<float> cand = {100.0f, 1.0f, 3.0f};
  const std::vector<float> ref = {0.0f, 2.0f, 1.0f};
  const std::vector<uint8_t> mask = {0, 1, 1};
  const DriftReport r = drift_report(cand, ref, mask, DType::bf16);
  EXPECT_EQ(r.tokens, 3);
  EXPECT_EQ(r.count, 2);
  EXPECT_DOUBLE_EQ(r.max_abs, 2.0);
  EXPECT_DOUBLE_EQ(r.mean_abs, 1.5);
  EXPECT_EQ(r.worst_index, 2);
  EXPECT_DOUBLE_EQ(r.p95_abs, 1.0 + 0.95);  // linear between the order statistics 1 and 2
  EXPECT_FALSE(r.passed());
  EXPECT_THAT(r.failures[0], HasSubstr("max_abs"));
}

TEST(Drift, ZeroReferenceKeepsMaxRelFinite) {
  const std::vector<float> cand = {1.0f}, ref = {0.0f};
  const DriftReport r = drift_report(cand, ref, {}, DType::fp32);
  EXPECT_TRUE(std::isfinite(r.max_rel));
  EXPECT_DOUBLE_EQ(r.max_rel, 1e12);
}

TEST(Drift, EqualInputsPassAndEmptyOrNonFiniteFail) {
  const std::vector<float> v = {-1.5f, -0.25f};
  EXPECT_TRUE(drift_report(v, v, {}, DType::fp32).passed());
  const std::vector<uint8_t> none = {0, 0};
  EXPECT_THAT(drift_report(v, v, none, DType::fp32).failures[0], HasSubstr("no active tokens"));
  const std::vector<float> bad = {-1.5f, NAN};
  const DriftReport r = drift_report(bad, v, {}, DType::fp32);
  EXPECT_EQ(r.non_finite, 1);
  EXPECT_EQ(r.first_non_finite, 1);
  EXPECT_FALSE(r.passed());
}

TEST(Drift, ThresholdsPerDtypeAndSizeChecks) {
  EXPECT_DOUBLE_EQ(drift_thresholds(DType::bf16).max_abs, 6.0e-2);
  EXPECT_DOUBLE_EQ(drift_thresholds(DType::fp16).approx_kl0, 5.0e-3);
  EXPECT_DOUBLE_EQ(drift_thresholds(DType::fp32).max_abs, 1.0e-5);
  const std::vector<float> a = {0.0f, 1.0f}, b = {0.0f};
  EXPECT_THROW(drift_report(a, b, {}, DType::fp32), ContractError);
  const std::vector<uint8_t> short_mask = {1};
  EXPECT_THROW(drift_report(a, a, short_mask, DType::fp32), ContractError);
}

}  // namespace
}  // namespace detlogp
