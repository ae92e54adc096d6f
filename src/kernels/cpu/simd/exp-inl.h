// canon::det_exp on vectors. rint is done with the 1.5 * 2^23 trick (exact ties-to-even for
// |t| < 2^22, the only range that survives the range checks; AVX-512: vrndscaleps itself), the
// integer q read from the same sum's bits; the reduction and the polynomial are ExpReduced,
// canon::exp_reduced lane-wise. fma is the hardware instruction where Highway's MulAdd is fused
// (HWY_NATIVE_FMA), std::fma per lane otherwise.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <cstdint>
#include <cstring>

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_EXP_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_EXP_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_EXP_INL_H_
#endif

#include <hwy/highway.h>
#include "kernels/cpu/simd/lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// canon::exp_reduced lane-wise: r = x - q ln2 by two fmas against the split ln2, then the
// degree-6 polynomial in Horner form, in the canon's order. -(q c) + x is one fused operation
// where the target has fma (the negation of q is exact, so it is the canon's fma(-q, c, x)).
HWY_INLINE VF ExpReduced(VF x, VF q) {
  using K = canon::ExpConstants;
  const DF d;
#if HWY_NATIVE_FMA
  VF r = hn::NegMulAdd(q, hn::Set(d, K::kLn2Hi), x);
  r = hn::NegMulAdd(q, hn::Set(d, K::kLn2Lo), r);
#else
  VF r = Fma(hn::Neg(q), hn::Set(d, K::kLn2Hi), x);
  r = Fma(hn::Neg(q), hn::Set(d, K::kLn2Lo), r);
#endif
  VF p = hn::Set(d, K::kC6);
  p = Fma(p, r, hn::Set(d, K::kC5));
  p = Fma(p, r, hn::Set(d, K::kC4));
  p = Fma(p, r, hn::Set(d, K::kC3));
  p = Fma(p, r, hn::Set(d, K::kC2));
  p = Fma(p, r, hn::Set(d, 1.0f));
  return Fma(p, r, hn::Set(d, 1.0f));
}

// canon::det_exp lane-wise, for every input (NaN -> NaN, x > 88.8 -> +inf), in the canon's exact
// form: the scaling by 2^q in two multiplies.
HWY_INLINE VF DetExpFull(VF x) {
  using K = canon::ExpConstants;
  const DF d;
  const DI di;
  const VF magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const VF t = hn::Mul(x, hn::Set(d, K::kLog2e));
  const VF tq = hn::Add(t, magic);  // rounds t to an integer, ties to even
  const VF q = hn::Sub(tq, magic);  // == rint(t) (up to the sign of a zero, which never matters)
  const VF p = ExpReduced(x, q);
  // q as an integer: the low mantissa bits of tq (exact while |q| < 2^22; other lanes are
  // replaced below).
  const VI qi = hn::Sub(hn::BitCast(di, tq), hn::BitCast(di, magic));
  const VI q1 = hn::ShiftRight<1>(qi);  // floor(q / 2)
  const VI q2 = hn::Sub(qi, q1);
  const VF y = hn::Mul(hn::Mul(p, Pow2i(q1)), Pow2i(q2));
  VF res = hn::IfThenZeroElse(hn::Lt(y, hn::Set(d, canon::kMinNormal)), y);
  res = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, K::kUnderflowBelow)), res);
  res = hn::IfThenElse(hn::Gt(x, hn::Set(d, K::kOverflowAbove)), hn::Set(d, canon::kInf), res);
  return hn::IfThenElse(hn::IsNaN(x), x, res);
}

// canon::det_exp for x <= 0 (including -inf) or NaN (NaN in, NaN out, any payload): the leaf's
// and the merge's domain. Same bits as DetExpFull there, with fewer operations: on
// x in [-88, 0], q is in [-127, 0], p * 2^q1 is exact (a normal number), so the canon's
// (p * 2^q1) * 2^q2 equals p * 2^q rounded once, which is one multiply by 2^q for q >= -126;
// for q = -127 both give a value below the normal range, flushed to +0 (here 2^q is built as
// +0). Lanes with x < -88 (garbage q) are replaced by +0 as in the canon.
// kInRange: the caller guarantees x >= -86 or NaN for every lane; then q >= -125, p * 2^q is a
// normal number and neither flush applies, so both selects are skipped (same bits).
template <bool kInRange = false>
HWY_INLINE VF DetExpNonPositive(VF x) {
  using K = canon::ExpConstants;
  const DF d;
  const DI di;
#if HWY_TARGET == HWY_AVX3
  // q = rint(x log2e) by vrndscaleps (round to nearest even: canon::round_even itself), and
  // p * 2^q by vscalefps, one rounding of the exact product: the same value as the canon's
  // (p * 2^q1) * 2^q2 for every q >= -127 (the first product is exact), and for q = -127 both
  // lie below the normal range (flushed below). Lanes with x < -88 are replaced as above.
  static_assert(kN == 16, "AVX3: one 512-bit vector of floats");
  (void)di;
  const VF q = hn::Round(hn::Mul(x, hn::Set(d, K::kLog2e)));
  const VF p = ExpReduced(x, q);
  const VF y{_mm512_scalef_ps(p.raw, q.raw)};
#else
  const VF magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const VF tq = hn::Add(hn::Mul(x, hn::Set(d, K::kLog2e)), magic);
  const VF q = hn::Sub(tq, magic);
  const VF p = ExpReduced(x, q);
  // 2^q from bits: bits(tq) = bits(magic) + q, and bits(magic) << 23 == 0 (mod 2^32), so
  // ((bits(tq) + 127) << 23) == (q + 127) << 23.
  const VF scale =
      hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, tq), hn::Set(di, 127))));
  const VF y = hn::Mul(p, scale);
#endif
  if constexpr (kInRange) return y;
  const VF res = hn::IfThenZeroElse(hn::Lt(y, hn::Set(d, canon::kMinNormal)), y);
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, K::kUnderflowBelow)), res);
}

// canon::det_exp for any input: the short form when every lane is <= 0.
HWY_INLINE VF DetExpAny(VF x) {
  const DF d;
  if (hn::AllTrue(d, hn::Ge(hn::Zero(d), x))) return DetExpNonPositive(x);
  return DetExpFull(x);
}

void DetExpArray(const float* x, float* y, int64_t n) {
  MapFloats([](VF v) { return DetExpAny(v); }, x, y, n);
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
