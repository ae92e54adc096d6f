#include "reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "numerics/element_io.hpp"

namespace detlogp::cli {
namespace {

// Half an ulp of `dtype` at |v| (at least half the smallest subnormal step).
double half_ulp(DType dtype, double v) {
  const int mantissa = dtype == DType::bf16 ? 7 : dtype == DType::fp16 ? 10 : 23;
  const int min_exp = dtype == DType::fp16 ? -14 : -126;  // exponent of the smallest normal
  int e = 0;
  std::frexp(std::abs(v), &e);  // |v| = f 2^e, f in [0.5, 1)
  const int exponent = std::max(e - 1, min_exp);
  return std::ldexp(0.5, exponent - mantissa);
}

}  // namespace

std::vector<int64_t> sample_rows(int64_t tokens, int64_t samples) {
  std::vector<int64_t> rows;
  const int64_t n = std::min(tokens, samples);
  for (int64_t k = 0; k < n; ++k) rows.push_back(k * tokens / n);
  return rows;
}

float widen(DType dtype, const void* row, int64_t i) {
  return numerics::load_as_float(row, dtype, i);
}

void widen_row(DType dtype, const void* row, int64_t n, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = widen(dtype, row, i);
}

void check_row(Accuracy& acc, DType grad_dtype, const RowInputs& in, const RowOutputs& out) {
  const std::size_t n = in.logits.size();
  const double t = in.temperature;
  std::vector<double> z(n), slope(n, 1.0);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < n; ++j) {
    z[j] = static_cast<double>(in.logits[j]);
    if (in.softcap) {  // the exact cap: cap * tanh(x / cap), slope 1 - tanh^2
      const double cap = *in.softcap;
      const double th = std::tanh(z[j] / cap);
      z[j] = cap * th;
      slope[j] = 1.0 - th * th;
    }
    z[j] /= t;
    m = std::max(m, z[j]);
  }
  // The canon's cap rounds each z within 3 * 2^-23 cap / T (numerics.md "Accuracy of logp"):
  // logp, LSE and entropy get twice that on top of their bounds.
  const double cap_term = in.softcap ? 6.0 * std::ldexp(1.0, -23) * *in.softcap / t : 0.0;
  double s = 0;
  for (std::size_t j = 0; j < n; ++j) s += std::exp(z[j] - m);
  const double lse = m + std::log(s);
  double h = 0;
  for (std::size_t j = 0; j < n; ++j) h -= std::exp(z[j] - lse) * (z[j] - lse);
  const double logp = in.active ? z[static_cast<std::size_t>(in.target)] - lse : 0.0;

  acc.rows += 1;
  const double e_lse = std::abs(static_cast<double>(out.lse) - lse);
  const double e_logp = std::abs(static_cast<double>(out.logp) - logp);
  acc.lse = std::max(acc.lse, e_lse);
  acc.logp = std::max(acc.logp, e_logp);
  const double value_bound = kValueAtol + kValueRtol * std::abs(lse) + cap_term;
  bool ok = e_lse <= value_bound && e_logp <= value_bound;
  if (!in.active && std::bit_cast<uint32_t>(out.logp) != 0) {  // exactly +0
    acc.inactive_logp_zero = false;
    ok = false;
  }
  if (out.has_entropy) {
    const double e_h = std::abs(static_cast<double>(out.entropy) - h);
    acc.entropy = std::max(acc.entropy, e_h);
    ok = ok && e_h <= kValueAtol + cap_term;
  }
  if (!out.grad.empty()) {
    const double gl = in.active ? in.grad_logp : 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double p = std::exp(z[j] - lse);
      double g = gl * ((static_cast<int64_t>(j) == in.target ? 1.0 : 0.0) - p) + in.grad_lse * p -
                 in.grad_entropy * p * (z[j] - lse + h);
      g = g / t * slope[j];
      const double err = std::abs(static_cast<double>(out.grad[j]) - g);
      // The gradient of z is divided by T: its absolute error scales with 1 / T.
      const double bound = kGradAtol / t + kGradRtol * std::abs(g) + half_ulp(grad_dtype, g);
      acc.grad = std::max(acc.grad, err);
      acc.grad_over_bound = std::max(acc.grad_over_bound, err / bound);
      if (!(err <= bound)) ok = false;  // a NaN error fails too
    }
  }
  if (!std::isfinite(e_lse) || !std::isfinite(e_logp)) ok = false;
  acc.passed = acc.passed && ok;
}

}  // namespace detlogp::cli
