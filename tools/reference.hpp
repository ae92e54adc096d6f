#pragma once
// The float64 reference of `detlogp run`: LSE, logp, entropy and the logits gradient of one row,
// computed in double from the same widened logits the operator reads, and the errors of the
// operator's outputs against it.
//
// Bounds (the operator's only error is fp32 arithmetic, so they are fp32-class whatever the
// logits dtype): |logp - ref|, |lse - ref|, |entropy - ref| <= 1e-5 (the fp32 row of
// accuracy.default.logprob), and for the gradient, which is rounded to the logits dtype at the
// final write, |grad - ref| <= 1e-5 + half an ulp of the logits dtype at |ref|. Inactive tokens
// must have logp exactly 0.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "detlogp/dtype.hpp"

namespace detlogp::cli {

inline constexpr double kValueAtol = 1e-5;
// Relative part of the logp and LSE bounds, scaled by |LSE| (the LSE accuracy goal,
// 4e-6 max(1, |LSE|)): one fp32 rounding of an LSE near 200 is already 1.5e-5, and a small
// temperature makes z = x / T, and so the LSE, large.
inline constexpr double kValueRtol = 4e-6;
inline constexpr double kGradAtol = 1e-5;  // divided by the temperature
inline constexpr double kGradRtol = 1e-5;  // the goal: gradients within 1e-6 + 1e-5 |ref|

struct RowInputs {
  std::span<const float> logits;  // the real columns, widened to fp32
  int64_t target = 0;
  bool active = true;
  float temperature = 1.0f;
  std::optional<float> softcap = std::nullopt;  // z = cap * tanh(x / cap) / temperature
  float grad_logp = 0, grad_lse = 0, grad_entropy = 0;
};

struct RowOutputs {
  float logp = 0, lse = 0, entropy = 0;
  bool has_entropy = false;
  std::span<const float> grad;  // the real columns, widened; empty: no gradient to check
};

struct Accuracy {
  int64_t rows = 0;
  double logp = 0, lse = 0, entropy = 0, grad = 0;  // max absolute errors
  double grad_over_bound = 0;                       // max of |grad - ref| / its bound (<= 1 passes)
  bool inactive_logp_zero = true;
  bool passed = true;
};

// The sample of rows checked: k * tokens / samples for k in [0, samples) (row 0 first).
std::vector<int64_t> sample_rows(int64_t tokens, int64_t samples);

// Compares one row with its float64 reference and folds the errors into `acc`.
void check_row(Accuracy& acc, DType grad_dtype, const RowInputs& in, const RowOutputs& out);

// Element i of a row of `dtype` values, widened to fp32.
float widen(DType dtype, const void* row, int64_t i);
void widen_row(DType dtype, const void* row, int64_t n, std::vector<float>& out);

}  // namespace detlogp::cli
