// The logit softcap on vectors: canon::det_tanh lane-wise (both of its regions evaluated, the
// canon's choice selected per lane), and the leaf partial of a capped tile: each capped,
// tempered z computed once, in the leaf's first pass (leaf-inl.h's second pass runs on them).
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
#include "kernels/cpu/simd/leaf-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// canon::det_tanh lane-wise: a = |x| (the sign bit cleared), canon::tanh_poly and
// canon::tanh_exp on every lane, the canon's region selected, the sign of x set back; NaN lanes
// return x.
constexpr float kTanhExpArgMin = -20.0f;
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
  // t = det_exp(max(-2a, -20)): the same r as the canon's det_exp(-2a) on every lane. Where
  // -2a < -20 both t lie in [0, 2.1e-9], below 2^-25, so 1 - t and 1 + t both round to 1 and
  // r = 1 exactly either way; the clamped argument is in range, so det_exp needs no flush.
  // (A NaN lane is replaced by x below.)
  const VF t =
      DetExpNonPositive<true>(hn::Max(hn::Mul(hn::Set(d, -2.0f), a), hn::Set(d, kTanhExpArgMin)));
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

// The leaf partial of one tile with a cap: canon::leaf_partial of the tile's z =
// scored_logit(x, cap, tau), in the two passes of LeafTile (leaf-inl.h) with the cap inside the
// first. Pass 1 computes each z once (one det_tanh per element), stores it to `zbuf` (count
// rounded up to a whole lane group, in L1) and takes the max of z in the same loop; pass 2 is
// LeafPass2 on zbuf. Lanes past `count` in the last group are -inf in zbuf, as LeafTile pads
// them: they add det_exp(-inf) = +0. The bits are those of the fp32 leaf on the capped tile.
template <DType kDT, bool kEntropy, bool kScaled>
HWY_INLINE canon::Partial CappedLeafTile(const typename Storage<kDT>::T* p, int64_t count,
                                         float cap, float tau, float* zbuf) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const VF vcap = hn::Set(d, cap);
  const VF vtau = hn::Set(d, tau);
  const VF neg_inf = hn::Set(d, -canon::kInf);
  const int64_t groups = count / canon::kLanes;
  const int64_t rem = count - groups * canon::kLanes;
  // The max is exact in any order: one accumulator. (A NaN z the vector max drops makes pass 2's
  // sum NaN, one it keeps sends the tile to the canon below: poisoned either way.)
  VF mx = neg_inf;
  const int64_t whole = groups * canon::kLanes;
  for (int64_t k = 0; k < whole; k += kN) {
    const VF z = CapLogits<kScaled>(LoadWide<kDT>(p + k), vcap, vtau).z;
    hn::StoreU(z, d, zbuf + k);
    mx = hn::Max(z, mx);
  }
  if (rem != 0) {
    // The last, incomplete lane group: capped from a zero-padded copy, then the lanes past
    // `count` set to -inf (after the cap, which would turn -inf into -cap).
    HWY_ALIGN T tail[canon::kLanes];
    std::memset(tail, 0, sizeof tail);
    std::memcpy(tail, p + whole, static_cast<size_t>(rem) * sizeof(T));
    for (int64_t k = 0; k < canon::kLanes; k += kN) {
      VF z = neg_inf;
      if (k < rem) {
        z = CapLogits<kScaled>(LoadWide<kDT>(tail + k), vcap, vtau).z;
        z = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(rem - k)), z, neg_inf);
      }
      hn::StoreU(z, d, zbuf + whole + k);
      mx = hn::Max(z, mx);
    }
  }
  float m = FoldMax(d, mx);
  if (!(m - m == 0.0f)) {
    // NaN, or -inf when every z is NaN (a capped z is never infinite): the canon itself, on the
    // tile's z.
    return canon::leaf_partial(zbuf, count, kEntropy);
  }
  if (m == 0.0f) m = 0.0f;  // -0 -> +0
  // Every z >= -cap / tau (|det_tanh| <= 1 and rounding is monotonic), so when m - (-cap / tau)
  // <= 80 every z - m is >= -80 and LeafPass2 may skip the flushes (the same bits either way);
  // the -inf lanes of a padded group need them.
  const float lo = kScaled ? -cap / tau : -cap;
  const float* tail = rem != 0 ? zbuf + groups * canon::kLanes : nullptr;
  if (rem == 0 && m - lo <= 80.0f) {
    return LeafPass2<DType::fp32, kEntropy, false, true>(zbuf, groups, tail, m, 1.0f);
  }
  return LeafPass2<DType::fp32, kEntropy, false, false>(zbuf, groups, tail, m, 1.0f);
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
