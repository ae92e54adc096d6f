// The vector types of the SIMD kernels and their canon building blocks: one canon lane group
// (32 lanes) in kVecsPerGroup vectors, fma with one rounding (also the fused dense kernels'),
// 2^n from bits, the canon's lane folds, and the run-time to compile-time dtype and flags of
// the row kernels.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "detlogp/dtype.hpp"
#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_LANES_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_LANES_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_LANES_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// At most 32 float lanes: one canon lane group never spans less than one vector.
using DF = hn::CappedTag<float, canon::kLanes>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using D16 = hn::Rebind<uint16_t, DF>;  // half-width vector of 16-bit elements
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

constexpr size_t kN = hn::MaxLanes(DF());
constexpr int kVecsPerGroup = static_cast<int>(canon::kLanes / kN);  // vectors per 32 lanes
static_assert(kN * kVecsPerGroup == canon::kLanes, "lane count must divide 32");

// ---------------------------------------------------------------------------------------------
// Arithmetic building blocks.

// a * b + c with one rounding, on float vectors of any width: the hardware instruction where
// Highway's MulAdd is fused (HWY_NATIVE_FMA), std::fma per lane otherwise.
template <class D>
HWY_INLINE hn::Vec<D> FusedMulAdd(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c) {
#if HWY_NATIVE_FMA
  (void)d;
  return hn::MulAdd(a, b, c);
#else
  constexpr size_t n = hn::MaxLanes(D());
  HWY_ALIGN float A[n];
  HWY_ALIGN float B[n];
  HWY_ALIGN float C[n];
  hn::Store(a, d, A);
  hn::Store(b, d, B);
  hn::Store(c, d, C);
  for (size_t i = 0; i < n; ++i) A[i] = std::fma(A[i], B[i], C[i]);
  return hn::Load(d, A);
#endif
}

HWY_INLINE VF Fma(VF a, VF b, VF c) { return FusedMulAdd(DF(), a, b, c); }

// 2^n for n in [-126, 127], from bits (canon::pow2i).
HWY_INLINE VF Pow2i(VI n) {
  const DF d;
  const DI di;
  return hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n, hn::Set(di, 127))));
}

// Canon lane fold of one vector: lane[j] += lane[j + h] for h = N/2, ..., 1; returns lane 0.
template <class D>
HWY_INLINE float FoldAdd(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    (void)d;
    return FoldAdd(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// Max of the lanes (exact in any order; NaN handling does not matter, see LeafTile).
template <class D>
HWY_INLINE float FoldMax(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    (void)d;
    return FoldMax(dh, hn::Max(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// The canon's 32-lane fold of a lane group held in kVecsPerGroup vectors.
HWY_INLINE float FoldGroup(VF* acc) {
  for (int h = kVecsPerGroup / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) acc[j] = hn::Add(acc[j], acc[j + h]);
  }
  return FoldAdd(DF(), acc[0]);
}

// Calls fn.template operator()<kDT, kA, kB>() with a run-time dtype and two run-time flags as
// compile-time values: the row kernels are instantiated once per combination.
template <class Fn>
HWY_INLINE void WithStaticFlags(DType dtype, bool a, bool b, const Fn& fn) {
  auto flags = [&]<DType kDT>() {
    if (a) {
      b ? fn.template operator()<kDT, true, true>() : fn.template operator()<kDT, true, false>();
    } else {
      b ? fn.template operator()<kDT, false, true>() : fn.template operator()<kDT, false, false>();
    }
  };
  switch (dtype) {
    case DType::fp32:
      return flags.template operator()<DType::fp32>();
    case DType::bf16:
      return flags.template operator()<DType::bf16>();
    case DType::fp16:
      return flags.template operator()<DType::fp16>();
  }
}

// y[i] = fn(x[i]) lane by lane over n floats; the tail is padded with zeros in a full vector
// (the element-wise test entry points of the canon functions: det_exp, det_tanh).
template <class Fn>
HWY_INLINE void MapFloats(const Fn& fn, const float* x, float* y, int64_t n) {
  const DF d;
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kN) <= n; i += kN) hn::StoreU(fn(hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float in[kN] = {};
    HWY_ALIGN float out[kN];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(float));
    hn::Store(fn(hn::Load(d, in)), d, out);
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
