// The logit softcap on vectors: canon::det_tanh lane-wise (both of its regions evaluated, the
// canon's choice selected per lane), and the capped, tempered z of a tile written to an fp32
// buffer, so that the leaf (leaf-inl.h) runs on it unchanged.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <cstdint>
#include <cstring>

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_SOFTCAP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_SOFTCAP_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_SOFTCAP_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_SOFTCAP_INL_H_
#endif

#include <hwy/highway.h>
#include "kernels/cpu/simd/convert-inl.h"
#include "kernels/cpu/simd/exp-inl.h"
#include "kernels/cpu/simd/lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// canon::det_tanh lane-wise: a = |x| (the sign bit cleared), canon::tanh_poly and
// canon::tanh_exp on every lane, the canon's region selected, the sign of x set back; NaN lanes
// return x. -2a <= 0 (or NaN), the domain of DetExpNonPositive.
HWY_INLINE VF DetTanh(VF x) {
  using K = canon::TanhConstants;
  const DF d;
  const DU du;
  const VU sign = hn::And(hn::BitCast(du, x), hn::Set(du, 0x80000000u));
  const VF a = hn::BitCast(d, hn::Xor(hn::BitCast(du, x), sign));
  const VF y = hn::Mul(a, a);
  VF q = hn::Set(d, K::kT5);
  q = Fma(q, y, hn::Set(d, K::kT4));
  q = Fma(q, y, hn::Set(d, K::kT3));
  q = Fma(q, y, hn::Set(d, K::kT2));
  q = Fma(q, y, hn::Set(d, K::kT1));
  const VF poly = Fma(hn::Mul(a, y), q, a);
  const VF one = hn::Set(d, 1.0f);
  const VF t = DetExpNonPositive(hn::Mul(hn::Set(d, -2.0f), a));
  const VF expo = hn::Div(hn::Sub(one, t), hn::Add(one, t));
  const VF r = hn::IfThenElse(hn::Lt(a, hn::Set(d, K::kPolyBelow)), poly, expo);
  return hn::IfThenElse(hn::IsNaN(x), x, hn::BitCast(d, hn::Or(hn::BitCast(du, r), sign)));
}

// The capped logit and the det_tanh value it came from (for the slope of the backward).
struct Capped {
  VF z;   // (cap * th) / tau, or cap * th when not kScaled
  VF th;  // det_tanh(x / cap)
};

// canon::scored_logit with a cap, lane-wise: th = det_tanh(x / cap), z = (cap * th) / tau.
template <bool kScaled>
HWY_INLINE Capped CapLogits(VF x, VF cap, VF tau) {
  const VF th = DetTanh(hn::Div(x, cap));
  VF z = hn::Mul(cap, th);
  if constexpr (kScaled) {
    z = hn::Div(z, tau);
  } else {
    (void)tau;
  }
  return Capped{z, th};
}

// canon::softcap_slope lane-wise: (1 - th) * (1 + th).
HWY_INLINE VF SoftcapSlope(VF th) {
  const VF one = hn::Set(DF(), 1.0f);
  return hn::Mul(hn::Sub(one, th), hn::Add(one, th));
}

// z of `count` columns at p, capped and tempered, into out[0, count) (out holds count rounded up
// to a whole vector).
template <DType kDT, bool kScaled>
HWY_INLINE void CapTile(const typename Storage<kDT>::T* p, int64_t count, float cap, float tau,
                        float* out) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const VF vcap = hn::Set(d, cap);
  const VF vtau = hn::Set(d, tau);
  int64_t k = 0;
  for (; k + static_cast<int64_t>(kN) <= count; k += kN) {
    hn::StoreU(CapLogits<kScaled>(LoadWide<kDT>(p + k), vcap, vtau).z, d, out + k);
  }
  if (k < count) {
    HWY_ALIGN T in[kN];
    std::memset(in, 0, sizeof in);
    std::memcpy(in, p + k, static_cast<size_t>(count - k) * sizeof(T));
    hn::StoreU(CapLogits<kScaled>(LoadWide<kDT>(in), vcap, vtau).z, d, out + k);
  }
}

void DetTanhArray(const float* x, float* y, int64_t n) {
  MapFloats([](VF v) { return DetTanh(v); }, x, y, n);
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
