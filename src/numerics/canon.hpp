#pragma once
// The numerics canon: every floating-point operation that decides a bit of detlogp's outputs.
// The definition is docs/numerics.md; this header is its one implementation for
// scalars. The scalar reference kernel calls it directly, the SIMD kernels repeat these exact
// operation sequences lane-wise (and are tested bitwise against it), and the CUDA kernels
// compile this same header for the device. It includes only the plain numerics types
// (detlogp/numerics.hpp) and the dtype conversions (detlogp/dtype.hpp), and uses only IEEE-754
// binary32 add, sub, mul, div, fma (one rounding) and exact bit manipulation.
//
// Never compile this with fast-math or with FP contraction (-ffp-contract=off): an implicit
// fma would round differently from the canon.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "detlogp/dtype.hpp"
#include "detlogp/numerics.hpp"

#if defined(__CUDACC__)
#define DETLOGP_HD __host__ __device__ __forceinline__
#else
#define DETLOGP_HD inline
#endif

namespace detlogp::canon {

// ---------------------------------------------------------------------------------------------
// Bits and constants.

DETLOGP_HD uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
DETLOGP_HD float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline constexpr uint32_t kCanonicalNanBits = 0x7fc00000u;  // the one fp32 NaN we write
using detlogp::kCanonicalBf16NanBits;                       // (detlogp/dtype.hpp)
using detlogp::kCanonicalFp16NanBits;
inline constexpr float kMinNormal = 1.17549435e-38f;  // 2^-126
inline constexpr float kInf = __builtin_huge_valf();

DETLOGP_HD bool is_nan(float x) { return x != x; }
DETLOGP_HD float canonical_nan() { return float_of(kCanonicalNanBits); }
// NaN payloads differ between CPUs and GPUs; every NaN output is written as the canonical one.
DETLOGP_HD float canonicalize(float x) { return is_nan(x) ? canonical_nan() : x; }

// Correctly rounded fused multiply-add: the hardware instruction where there is one, glibc's
// correctly rounded software fma otherwise (never a multiply followed by an add).
DETLOGP_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Round to nearest integer, ties to even, for |x| < 2^23 (the default rounding mode).
DETLOGP_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// ---------------------------------------------------------------------------------------------
// det_exp: e^x for every fp32 x. <= 1 ulp on [-87, 0] (0.90 ulp measured exhaustively),
// det_exp(0) == 1, det_exp(-inf) == +0, det_exp(+inf) == +inf, NaN -> NaN. Results below the
// normal range are flushed to +0 by the explicit threshold below, never by a hardware mode.
//
// Cody-Waite reduction x = q ln2 + r with q = rint(x log2e), r applied with two fmas against a
// split ln2; exp(r) by a degree-6 polynomial in Horner form with fmas (coefficients fitted to
// the relative error on [-ln2/2, ln2/2]); scaling by 2^q in two exact power-of-two multiplies
// so that no intermediate overflows or underflows early.

struct ExpConstants {
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693145751953125f;         // 0x3f317200
  static constexpr float kLn2Lo = 1.428606765330187045e-06f;  // 0x35bfbe8e
  static constexpr float kC6 = 0.0013751407386735082f;
  static constexpr float kC5 = 0.008368915878236294f;
  static constexpr float kC4 = 0.04166953265666962f;
  static constexpr float kC3 = 0.166665181517601f;
  static constexpr float kC2 = 0.49999988079071045f;
  static constexpr float kOverflowAbove = 88.8f;    // x > this: +inf
  static constexpr float kUnderflowBelow = -88.0f;  // x < this: +0 (the result is subnormal)
};

// 2^n as a float for n in [-126, 127], built from bits.
DETLOGP_HD float pow2i(int32_t n) { return float_of(static_cast<uint32_t>(n + 127) << 23); }

// exp(x - q ln2) for q = rint(x log2e): the Cody-Waite reduction and the polynomial, the part
// of det_exp between choosing q and scaling by 2^q. Every det_exp of every backend (this file,
// the CUDA leaf's det_exp_shift, the SIMD targets' vector form) runs these operations in this
// order.
DETLOGP_HD float exp_reduced(float x, float q) {
  using K = ExpConstants;
  float r = fma_rn(-q, K::kLn2Hi, x);
  r = fma_rn(-q, K::kLn2Lo, r);
  float p = K::kC6;
  p = fma_rn(p, r, K::kC5);
  p = fma_rn(p, r, K::kC4);
  p = fma_rn(p, r, K::kC3);
  p = fma_rn(p, r, K::kC2);
  p = fma_rn(p, r, 1.0f);
  return fma_rn(p, r, 1.0f);
}

// p * 2^q for an integer q in [-127, 129], in two exact power-of-two multiplies so that no
// intermediate overflows or underflows early; results below the normal range flush to +0.
DETLOGP_HD float scale_pow2(float p, int32_t q) {
  const int32_t q1 = q >> 1;  // floor(q / 2)
  const int32_t q2 = q - q1;
  const float y = (p * pow2i(q1)) * pow2i(q2);
  return y < kMinNormal ? 0.0f : y;
}

DETLOGP_HD float det_exp(float x) {
  using K = ExpConstants;
  if (is_nan(x)) return x;
  if (x > K::kOverflowAbove) return kInf;
  if (x < K::kUnderflowBelow) return 0.0f;
  const float q = round_even(x * K::kLog2e);
  return scale_pow2(exp_reduced(x, q), static_cast<int32_t>(q));  // q in [-127, 129]
}

// ---------------------------------------------------------------------------------------------
// det_log: natural log, <= 1 ulp on [1, 2^24] (0.83 ulp measured exhaustively); log(0) = -inf,
// log(x < 0) = NaN, log(+inf) = +inf, NaN -> NaN, subnormals handled exactly.
// fdlibm's logf: x = 2^k m with m in [sqrt(2)/2, sqrt(2)), f = m - 1, s = f / (2 + f),
// a short polynomial in s^2, and ln2 split in two. Plain mul/add/div in a fixed order.

struct LogConstants {
  static constexpr float kLn2Hi = 6.9313812256e-01f;  // 0x3f317180
  static constexpr float kLn2Lo = 9.0580006145e-06f;  // 0x3717f7d1
  static constexpr float kLg1 = 0.66666662693f;
  static constexpr float kLg2 = 0.40000972152f;
  static constexpr float kLg3 = 0.28498786688f;
  static constexpr float kLg4 = 0.24279078841f;
  static constexpr float kTwo25 = 33554432.0f;
};

DETLOGP_HD float det_log(float x) {
  using K = LogConstants;
  if (is_nan(x)) return x;
  if (x == 0.0f) return -kInf;
  if (x < 0.0f) return canonical_nan();
  if (x == kInf) return x;
  int32_t k = 0;
  if (x < kMinNormal) {  // subnormal: scale into the normal range exactly
    x = x * K::kTwo25;
    k = -25;
  }
  uint32_t ix = bits_of(x);
  k += static_cast<int32_t>(ix >> 23) - 127;
  ix &= 0x007fffffu;
  const uint32_t i = (ix + (0x95f64u << 3)) & 0x800000u;  // 1 when the mantissa >= sqrt(2)
  const float m = float_of(ix | (i ^ 0x3f800000u));       // in [sqrt(2)/2, sqrt(2))
  k += static_cast<int32_t>(i >> 23);
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float w = z * z;
  const float t1 = w * (K::kLg2 + w * K::kLg4);
  const float t2 = z * (K::kLg1 + w * K::kLg3);
  const float r = t2 + t1;
  const float hfsq = 0.5f * f * f;
  const float dk = static_cast<float>(k);
  return dk * K::kLn2Hi - ((hfsq - (s * (hfsq + r) + dk * K::kLn2Lo)) - f);
}

// ---------------------------------------------------------------------------------------------
// det_tanh: tanh(x) for every fp32 x, odd by construction (computed on |x|, the sign of x copied
// onto the result), so det_tanh(-x) == -det_tanh(x) bit for bit and det_tanh(-0) == -0.
// NaN -> NaN, +-inf -> +-1. Two regions of a = |x|:
//   a < 0.5625: an odd polynomial, a + a^3 Q(a^2), Q of degree 4 in a^2 in Horner form with fmas
//               (coefficients fitted to the relative error of tanh on [0, 0.5625]); exact for
//               tiny a (a^3 underflows to 0 and the fma returns a), no cancellation near 0;
//   otherwise:  t = det_exp(-2a) in [0, 0.325], tanh(a) = (1 - t) / (1 + t): no cancellation
//               (1 - t >= 0.675), and t == 0 (a > 44) gives exactly 1.

struct TanhConstants {
  static constexpr float kPolyBelow = 0.5625f;          // a < this: the polynomial
  static constexpr float kT1 = -0.3333331346511841f;    // 0xbeaaaaa4
  static constexpr float kT2 = 0.133324533700943f;      // 0x3e08863a
  static constexpr float kT3 = -0.05383748561143875f;   // 0xbd5c84b2
  static constexpr float kT4 = 0.021007690578699112f;   // 0x3cac1852
  static constexpr float kT5 = -0.006180137861520052f;  // 0xbbca82c1
};

// tanh(a) on a = |x| by the polynomial (a < kPolyBelow).
DETLOGP_HD float tanh_poly(float a) {
  using K = TanhConstants;
  const float y = a * a;
  float q = K::kT5;
  q = fma_rn(q, y, K::kT4);
  q = fma_rn(q, y, K::kT3);
  q = fma_rn(q, y, K::kT2);
  q = fma_rn(q, y, K::kT1);
  return fma_rn(a * y, q, a);
}

// tanh(a) on a = |x| by det_exp (a >= kPolyBelow, or NaN).
DETLOGP_HD float tanh_exp(float a) {
  const float t = det_exp(-2.0f * a);
  return (1.0f - t) / (1.0f + t);
}

DETLOGP_HD float det_tanh(float x) {
  if (is_nan(x)) return x;
  const uint32_t sign = bits_of(x) & 0x80000000u;
  const float a = float_of(bits_of(x) ^ sign);
  const float r = a < TanhConstants::kPolyBelow ? tanh_poly(a) : tanh_exp(a);
  return float_of(bits_of(r) | sign);
}

// ---------------------------------------------------------------------------------------------
// Logit dtypes: exact widening to fp32 and round-to-nearest-even narrowing from fp32.

// (One implementation, public in detlogp/dtype.hpp: the tools and the Python package convert
// with the same code.)
using detlogp::bf16_to_float;
using detlogp::float_to_bf16;
using detlogp::float_to_fp16;
using detlogp::fp16_to_float;

// ---------------------------------------------------------------------------------------------
// Partials and the tree merge.
//
// A partial summarises a set of columns of one row: m = max z, s = sum exp(z - m),
// u = sum exp(z - m) (z - m) (entropy term; left 0 when entropy is not requested).
// Identity (no columns, or all -inf): (-inf, 0, 0); s == 0 marks it. Poisoned (a NaN or +inf
// logit among the columns): all three canonical NaN; s is NaN marks it.

using Partial = NodePartial;  // one type: the kernels' outputs are the canon's partials

DETLOGP_HD Partial identity_partial() { return Partial{-kInf, 0.0f, 0.0f}; }
DETLOGP_HD Partial poisoned_partial() {
  return Partial{canonical_nan(), canonical_nan(), canonical_nan()};
}
DETLOGP_HD bool is_identity(const Partial& p) { return p.s == 0.0f; }
DETLOGP_HD bool is_poisoned(const Partial& p) { return is_nan(p.s) || is_nan(p.u); }

// The per-element entropy term e (z - m), defined as +0 where e == 0 so that z = -inf (whose
// difference is -inf) contributes nothing instead of 0 * inf.
DETLOGP_HD float entropy_term(float e, float z, float m) { return e == 0.0f ? 0.0f : e * (z - m); }

// merge(left, right) of numerics.md "Tree over tiles". The operation order is part of the canon.
template <bool kWithEntropy>
DETLOGP_HD Partial merge(const Partial& left, const Partial& right) {
  if (is_poisoned(left) || is_poisoned(right)) return poisoned_partial();
  if (is_identity(right)) return left;
  if (is_identity(left)) return right;
  const float M = left.m > right.m ? left.m : right.m;
  const float dl = left.m - M;
  const float dr = right.m - M;
  const float el = det_exp(dl);
  const float er = det_exp(dr);
  Partial out;
  out.m = M;
  out.s = left.s * el + right.s * er;
  if (kWithEntropy) {
    // A side whose factor e is 0 contributes +0, like entropy_term in the leaf: its bracket
    // d * s overflows to -inf when the two maxima are more than FLT_MAX apart (finite logits
    // of +-2e38), and 0 * -inf would poison u, then s, LSE and entropy of a finite row. Where
    // the bracket is finite the product is -0 and the sum is the same bits either way.
    const float tl = el == 0.0f ? 0.0f : el * (left.u + dl * left.s);
    const float tr = er == 0.0f ? 0.0f : er * (right.u + dr * right.s);
    out.u = tl + tr;
  } else {
    out.u = 0.0f;
  }
  return out;
}

DETLOGP_HD Partial merge(const Partial& left, const Partial& right, bool with_entropy) {
  return with_entropy ? merge<true>(left, right) : merge<false>(left, right);
}

// ---------------------------------------------------------------------------------------------
// Leaf partial of one tile, in the canon's lane order: element k goes to lane k mod 32, each lane
// sums in increasing k from +0, then lanes fold by halving (h = 16, 8, 4, 2, 1).
// `z` holds the tile's real columns (already widened and divided by the temperature); padding
// columns are simply not passed (count < W), which the canon makes equivalent to skipping them.

inline constexpr int kLanes = 32;

DETLOGP_HD float fold_lanes(float* lane) {
  for (int h = kLanes / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) lane[j] = lane[j] + lane[j + h];
  }
  return lane[0];
}

DETLOGP_HD Partial leaf_partial(const float* z, int64_t count, bool with_entropy) {
  float m = -kInf;
  bool saw_nan = false;
  for (int64_t k = 0; k < count; ++k) {
    saw_nan = saw_nan || is_nan(z[k]);
    m = z[k] > m ? z[k] : m;
  }
  if (saw_nan || m == kInf) return poisoned_partial();
  if (m == -kInf) return identity_partial();
  if (m == 0.0f) m = 0.0f;  // normalise -0 to +0
  float s_lane[kLanes];
  float u_lane[kLanes];
  for (int j = 0; j < kLanes; ++j) s_lane[j] = u_lane[j] = 0.0f;
  for (int64_t k = 0; k < count; ++k) {
    const float e = det_exp(z[k] - m);
    s_lane[k % kLanes] = s_lane[k % kLanes] + e;
    if (with_entropy) u_lane[k % kLanes] = u_lane[k % kLanes] + entropy_term(e, z[k], m);
  }
  Partial p;
  p.m = m;
  p.s = fold_lanes(s_lane);
  p.u = with_entropy ? fold_lanes(u_lane) : 0.0f;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Root: LSE = M + log S; entropy H = log S - U / S. An identity root (every real logit -inf)
// gives LSE = -inf and H = 0; a poisoned root gives NaN for both.

struct RootValues {
  float lse;
  float entropy;
};

DETLOGP_HD RootValues finish_root(const Partial& root) {
  if (is_poisoned(root)) return RootValues{canonical_nan(), canonical_nan()};
  if (is_identity(root)) return RootValues{-kInf, 0.0f};
  const float log_s = det_log(root.s);
  return RootValues{root.m + log_s, log_s - root.u / root.s};
}

// logp of an active row; inactive rows get exactly 0.0 (the caller decides).
DETLOGP_HD float selected_logp(float target_z, float lse) { return canonicalize(target_z - lse); }

// z = fp32(x) / tau, one correctly rounded division; skipped when tau == 1 (x / 1 == x anyway).
DETLOGP_HD float scale_logit(float x, float tau) { return tau == 1.0f ? x : x / tau; }

// Logit softcap (numerics.md "Softcap"): y = cap * det_tanh(x / cap) (a div, det_tanh, a mul),
// applied to the widened logit before the temperature. cap == 0 stands for "no softcap" (the
// contract's cap is absent); then y = x, no operation at all.
DETLOGP_HD float softcap_logit(float x, float cap) {
  return cap == 0.0f ? x : cap * det_tanh(x / cap);
}

// The scored value z of a widened logit x: softcap, then temperature.
DETLOGP_HD float scored_logit(float x, float cap, float tau) {
  return scale_logit(softcap_logit(x, cap), tau);
}

// d/dx [cap tanh(x / cap)] = 1 - th^2 from the forward's own th = det_tanh(x / cap), as
// (1 - th) * (1 + th): a sub, an add, a mul (1 - th is exact for th >= 1/2, so the slope keeps
// its relative accuracy where tanh saturates).
DETLOGP_HD float softcap_slope(float th) { return (1.0f - th) * (1.0f + th); }

// ---------------------------------------------------------------------------------------------
// Backward, one real column. p = exp(z - LSE) (0 on rows with non-finite LSE);
//   grad_z = (g_logp (onehot - p) + g_lse p) + g_H (p ((LSE - z) - H))
// term by term in this order; a gradient the caller did not supply is skipped (not added), a
// supplied zero is added. The entropy term is +0 wherever p == 0. grad_x = grad_z / tau unless
// tau == 1. Padding columns are not passed here: the caller writes exactly +0 there.

struct GradCoefficients {
  bool has_logp;
  bool has_lse;
  bool has_entropy;
  float g_logp;  // already zeroed on inactive rows
  float g_lse;
  float g_entropy;
};

DETLOGP_HD float grad_element(float z, bool is_target, float lse, float entropy,
                              const GradCoefficients& g, float tau) {
  const float p = (lse - lse == 0.0f) ? det_exp(z - lse) : 0.0f;  // lse - lse is NaN for inf/NaN
  float grad = 0.0f;
  bool any = false;
  if (g.has_logp) {
    grad = g.g_logp * ((is_target ? 1.0f : 0.0f) - p);
    any = true;
  }
  if (g.has_lse) {
    const float t2 = g.g_lse * p;
    grad = any ? grad + t2 : t2;
    any = true;
  }
  if (g.has_entropy) {
    const float t3 = p == 0.0f ? 0.0f : g.g_entropy * (p * ((lse - z) - entropy));
    grad = any ? grad + t3 : t3;
  }
  return tau == 1.0f ? grad : grad / tau;
}

// The gradient of a widened logit x (numerics.md "Backward", "Softcap"): without a cap,
// grad_element of z = x / tau; with one, th = det_tanh(x / cap), z = (cap * th) / tau, and the
// gradient grad_element(z, ...) * softcap_slope(th) (after the division by tau).
DETLOGP_HD float grad_of_logit(float x, bool is_target, float lse, float entropy,
                               const GradCoefficients& g, float tau, float cap) {
  if (cap == 0.0f) return grad_element(scale_logit(x, tau), is_target, lse, entropy, g, tau);
  const float th = det_tanh(x / cap);
  const float z = scale_logit(cap * th, tau);
  return grad_element(z, is_target, lse, entropy, g, tau) * softcap_slope(th);
}

}  // namespace detlogp::canon
