// The drift statistics (include/detlogp/drift.hpp).

#include "detlogp/drift.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

// Linear interpolation between order statistics (numpy's and torch's default).
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

}  // namespace

DriftThresholds drift_thresholds(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return {.max_abs = 6.0e-2, .approx_kl0 = 5.0e-2, .clipfrac0 = 0.0};
    case DType::fp16:
      return {.max_abs = 5.0e-3, .approx_kl0 = 5.0e-3, .clipfrac0 = 0.0};
    case DType::fp32:
      return {.max_abs = 1.0e-5, .approx_kl0 = 1.0e-5, .clipfrac0 = 0.0};
  }
  return {};
}

DriftReport drift_report(std::span<const float> candidate, std::span<const float> reference,
                         std::span<const uint8_t> active, DType dtype) {
  if (reference.size() != candidate.size() ||
      (!active.empty() && active.size() != candidate.size())) {
    throw ContractError(fmt::format(
        "drift: candidate has {} tokens, reference {} and mask {}; give one entry per token in "
        "each (an empty mask means every token active)",
        candidate.size(), reference.size(), active.size()));
  }
  DriftReport r;
  r.dtype = dtype;
  r.thresholds = drift_thresholds(dtype);
  r.tokens = static_cast<int64_t>(candidate.size());
  std::vector<double> abs_d;
  double sum_abs = 0, sum_kl = 0;
  int64_t clipped = 0;
  for (std::size_t i = 0; i < candidate.size(); ++i) {
    if (!active.empty() && active[i] == 0) continue;
    const double c = candidate[i], ref = reference[i];
    if (!std::isfinite(c) || !std::isfinite(ref)) {
      if (r.non_finite++ == 0) r.first_non_finite = static_cast<int64_t>(i);
      continue;
    }
    const double d = c - ref;
    const double a = std::abs(d);
    if (!r.worst_index || a > r.max_abs) {
      r.max_abs = a;
      r.worst_index = static_cast<int64_t>(i);
      r.worst_candidate = c;
      r.worst_reference = ref;
    }
    r.max_rel = std::max(r.max_rel, a / std::max(std::abs(ref), 1e-12));
    const double ratio = std::exp(d);
    sum_kl += ratio - 1.0 - d;
    if (ratio < r.thresholds.clip_low || ratio > r.thresholds.clip_high) ++clipped;
    sum_abs += a;
    abs_d.push_back(a);
  }
  r.count = static_cast<int64_t>(abs_d.size()) + r.non_finite;
  if (!abs_d.empty()) {
    const auto n = static_cast<double>(abs_d.size());
    r.mean_abs = sum_abs / n;
    r.approx_kl0 = sum_kl / n;
    r.clipfrac0 = static_cast<double>(clipped) / n;
    std::sort(abs_d.begin(), abs_d.end());
    r.p95_abs = quantile(abs_d, 0.95);
    r.p99_abs = quantile(abs_d, 0.99);
  }
  if (r.count == 0) r.failures.push_back("no active tokens");
  if (r.non_finite > 0) {
    r.failures.push_back(fmt::format("{} active token(s) with a non-finite value (first: token {})",
                                     r.non_finite, *r.first_non_finite));
  }
  if (r.max_abs > r.thresholds.max_abs) {
    r.failures.push_back(fmt::format("max_abs {:.6g} > {:g}", r.max_abs, r.thresholds.max_abs));
  }
  if (r.approx_kl0 > r.thresholds.approx_kl0) {
    r.failures.push_back(
        fmt::format("approx_kl0 {:.6g} > {:g}", r.approx_kl0, r.thresholds.approx_kl0));
  }
  if (r.clipfrac0 > r.thresholds.clipfrac0) {
    r.failures.push_back(
        fmt::format("clipfrac0 {:.6g} > {:g}", r.clipfrac0, r.thresholds.clipfrac0));
  }
  return r;
}

}  // namespace detlogp
