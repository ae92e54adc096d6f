#pragma once
// Drift statistics of a candidate logprob vector against a reference one: what `detlogp drift`
// prints, what the Python `detlogp.drift()` returns and what the distributed drift report
// records per rank. One implementation for all three.
//
//   d = candidate - reference (in double, from the fp32 values), active tokens only;
//   count, max_abs, mean_abs, p95_abs, p99_abs (linear-interpolated quantiles of |d|),
//   max_rel = max |d| / max(|reference|, 1e-12) (a zero reference stays finite: |d| * 1e12),
//   the worst token (first index of max |d|) with its candidate and reference values;
//   approx_kl0 = mean(exp(d) - 1 - d), clipfrac0 = fraction of exp(d) outside [0.8, 1.2].
// Verdict: pass iff count > 0, every active value finite, max_abs <= atol and
// approx_kl0 <= kl_max of the dtype (bf16 6e-2 / 5e-2, fp16 5e-3 / 5e-3, fp32 1e-5 / 1e-5) and
// clipfrac0 <= 0.
//
//   const detlogp::DriftReport r = detlogp::drift_report(train_logp, rollout_logp, mask,
//                                                        detlogp::DType::bf16);
//   if (!r.passed()) for (const auto& why : r.failures) std::cerr << why << "\n";

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "detlogp/dtype.hpp"

namespace detlogp {

struct DriftThresholds {
  double max_abs = 0;
  double approx_kl0 = 0;
  double clipfrac0 = 0;
  double clip_low = 0.8, clip_high = 1.2;
};

// The tolerances of logits of `dtype` (the logprob rows of the tolerance table).
DriftThresholds drift_thresholds(DType dtype);

struct DriftReport {
  DType dtype = DType::bf16;
  DriftThresholds thresholds;
  int64_t tokens = 0;
  int64_t count = 0;  // active tokens
  double max_abs = 0, mean_abs = 0, p95_abs = 0, p99_abs = 0, max_rel = 0;
  std::optional<int64_t> worst_index;  // none when no active token
  double worst_candidate = 0, worst_reference = 0;
  double approx_kl0 = 0, clipfrac0 = 0;
  int64_t non_finite = 0;  // active tokens whose candidate or reference is NaN or inf
  std::optional<int64_t> first_non_finite;
  std::vector<std::string> failures;  // why the verdict is fail (empty: pass)
  bool passed() const { return failures.empty(); }
};

// `active` empty: every token active; else one entry per token (nonzero = active). Throws
// ContractError when the sizes differ.
DriftReport drift_report(std::span<const float> candidate, std::span<const float> reference,
                         std::span<const uint8_t> active, DType dtype);

}  // namespace detlogp
