// The leaf partial of one tile in the canon's 32-lane order: pass 1 takes the max (exact in any
// order), pass 2 sums det_exp(z - m) with element k in canon lane k mod 32 (2 vectors of 16
// lanes with AVX-512, 4 of 8 with AVX2, 8 of 4 with SSE4/EMU128), then folds h = 16, 8, 4, 2, 1.
// A tile whose max is not finite (NaN, +inf, all -inf) goes to the scalar canon itself; a NaN
// dropped by the vector max turns s into NaN in pass 2, which poisons the leaf as the canon does.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_LEAF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_LEAF_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_LEAF_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_LEAF_INL_H_
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

// ---------------------------------------------------------------------------------------------
// Leaf partial of one tile: `count` real columns at p (count >= 1).

struct LeafScratch {
  std::vector<float> z;  // only for tiles taking the scalar path
};

// Pass 2 of a leaf: s and u over `groups` full lane groups at p and the padded tail (if any).
template <DType kDT, bool kEntropy, bool kScaled, bool kInRange>
HWY_INLINE canon::Partial LeafPass2(const typename Storage<kDT>::T* p, int64_t groups,
                                    const typename Storage<kDT>::T* tail, float m, float tau) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const VF vtau = hn::Set(d, tau);
  const VF vm = hn::Set(d, m);
  VF sacc[kVecsPerGroup];
  VF uacc[kVecsPerGroup];
  for (int v = 0; v < kVecsPerGroup; ++v) sacc[v] = uacc[v] = hn::Zero(d);
  auto group = [&](const T* q) HWY_ATTR {
    for (int v = 0; v < kVecsPerGroup; ++v) {
      const VF x = hn::Sub(LoadZ<kDT, kScaled>(q + v * kN, vtau), vm);
      const VF e = DetExpNonPositive<kInRange>(x);
      sacc[v] = hn::Add(sacc[v], e);
      if constexpr (kEntropy) {
        // canon::entropy_term is +0 where e == 0. Here e * max(x, lowest): where e == 0 that is
        // -0 or +0 (x = -inf made finite), and adding either to a lane sum gives the same bits
        // (a lane sum is +0 or negative, never -0); where e > 0, x >= -88 is unchanged. In range,
        // e > 0 everywhere and x needs no guard.
        const VF xs = kInRange ? x : hn::Max(x, hn::Set(d, std::numeric_limits<float>::lowest()));
        uacc[v] = hn::Add(uacc[v], hn::Mul(e, xs));
      }
    }
  };
  for (int64_t g = 0; g < groups; ++g) group(p + g * canon::kLanes);
  if (tail != nullptr) group(tail);
  canon::Partial out;
  out.m = m;
  out.s = FoldGroup(sacc);
  out.u = kEntropy ? FoldGroup(uacc) : 0.0f;
  // A NaN logit that the max skipped made s NaN: the canon poisons the tile.
  if (canon::is_nan(out.s) || canon::is_nan(out.u)) return canon::poisoned_partial();
  return out;
}

template <DType kDT, bool kEntropy, bool kScaled>
HWY_INLINE canon::Partial LeafTile(const typename Storage<kDT>::T* p, int64_t count, float tau,
                                   LeafScratch& scratch) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const int64_t groups = count / canon::kLanes;
  const int64_t rem = count - groups * canon::kLanes;
  // The last, incomplete lane group goes through a small buffer padded with -inf: its max is
  // unchanged and each padding element adds det_exp(-inf) = +0, which is exact.
  HWY_ALIGN T tail[canon::kLanes];
  if (rem != 0) {
    for (int k = 0; k < canon::kLanes; ++k) tail[k] = Storage<kDT>::kNegInf;
    std::memcpy(tail, p + groups * canon::kLanes, static_cast<size_t>(rem) * sizeof(T));
  }

  // Pass 1: the max of x (division by tau > 0 is monotonic, so max z = max x / tau exactly).
  // The min (any NaN handling) only chooses between two evaluations with the same bits.
  VF mx[kVecsPerGroup];
  VF mn[kVecsPerGroup];
  for (int v = 0; v < kVecsPerGroup; ++v) {
    mx[v] = hn::Set(d, -canon::kInf);
    mn[v] = hn::Set(d, canon::kInf);
  }
  auto scan = [&](const T* q) HWY_ATTR {
    for (int v = 0; v < kVecsPerGroup; ++v) {
      const VF x = LoadWide<kDT>(q + v * kN);
      mx[v] = hn::Max(x, mx[v]);
      mn[v] = hn::Min(x, mn[v]);
    }
  };
  for (int64_t g = 0; g < groups; ++g) scan(p + g * canon::kLanes);
  if (rem != 0) scan(tail);
  for (int v = 1; v < kVecsPerGroup; ++v) {
    mx[0] = hn::Max(mx[v], mx[0]);
    mn[0] = hn::Min(mn[v], mn[0]);
  }
  float m = FoldMax(d, mx[0]);
  float lo = -FoldMax(d, hn::Neg(mn[0]));
  if constexpr (kScaled) {
    m = m / tau;
    lo = lo / tau;
  }

  if (!(m - m == 0.0f)) {
    // NaN, +inf or -inf: poisoned or identity (or a NaN hidden by -inf). Rare: the canon itself.
    scratch.z.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      scratch.z[static_cast<size_t>(k)] = canon::scale_logit(LoadOneAsFloat<kDT>(p + k), tau);
    }
    return canon::leaf_partial(scratch.z.data(), count, kEntropy);
  }
  if (m == 0.0f) m = 0.0f;  // -0 -> +0

  // Pass 2: e = det_exp(z - m) into the canon's 32 lanes (the tile is in L1 by now). When every
  // z - m >= -80 (and no -inf), det_exp needs no flush and the entropy term no -inf guard.
  if (m - lo <= 80.0f) {
    return LeafPass2<kDT, kEntropy, kScaled, true>(p, groups, rem != 0 ? tail : nullptr, m, tau);
  }
  return LeafPass2<kDT, kEntropy, kScaled, false>(p, groups, rem != 0 ? tail : nullptr, m, tau);
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
