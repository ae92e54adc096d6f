// Logits in and gradients out: exact widening of bf16 / fp16 / fp32 storage to fp32 vectors
// (and z = x / tau), and the canon's narrowing back (round to nearest even with the canon's
// integer arithmetic, canonical NaNs), lane-wise.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <cstdint>

#include "detlogp/dtype.hpp"
#include "numerics/element_io.hpp"

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_CONVERT_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_CONVERT_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_CONVERT_INL_H_
#endif

#include <hwy/highway.h>
#include "kernels/cpu/simd/lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// ---------------------------------------------------------------------------------------------
// Loading logits as fp32 (exact widening).

template <DType kDT>
struct Storage {
  using T = uint16_t;
  static constexpr uint16_t kNegInf = kDT == DType::bf16 ? 0xff80u : 0xfc00u;
};
template <>
struct Storage<DType::fp32> {
  using T = float;
  static constexpr float kNegInf = -canon::kInf;
};

// canon::fp16_to_float lane-wise from the 16-bit patterns (widened to 32 bits).
HWY_INLINE VF Fp16BitsToFloat(VU h) {
  const DF d;
  const DU du;
  const DI di;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const VU exp = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1fu));
  const VU man = hn::And(h, hn::Set(du, 0x3ffu));
  const VU man_bits = hn::ShiftLeft<13>(man);
  const VU normal =
      hn::Or(sign, hn::Or(hn::ShiftLeft<23>(hn::Add(exp, hn::Set(du, 112u))), man_bits));
  const VU special = hn::Or(sign, hn::Or(hn::Set(du, 0x7f800000u), man_bits));
  const VF mag =
      hn::Mul(hn::ConvertTo(d, hn::BitCast(di, man)), hn::Set(d, 5.9604644775390625e-08f));
  const VU sub = hn::Or(sign, hn::BitCast(du, mag));
  const VU bits = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 0x1fu)), special,
                                 hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), sub, normal));
  return hn::BitCast(d, bits);
}

template <DType kDT>
HWY_INLINE VF LoadWide(const typename Storage<kDT>::T* p) {
  const DF d;
  if constexpr (kDT == DType::fp32) {
    return hn::LoadU(d, p);
  } else {
    const DU du;
    const D16 d16;
    const VU h = hn::PromoteTo(du, hn::LoadU(d16, p));
    if constexpr (kDT == DType::bf16) {
      return hn::BitCast(d, hn::ShiftLeft<16>(h));
    } else {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      // F16C: exact widening (NaN payloads may differ from the canon's; a NaN logit never
      // reaches an output bit: it poisons the leaf or is written as the canonical NaN).
      (void)h;
      const hn::Rebind<hwy::float16_t, DF> dh;
      return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
      return Fp16BitsToFloat(h);
#endif
    }
  }
}

// z = fp32(x) / tau (one division) when kScaled.
template <DType kDT, bool kScaled>
HWY_INLINE VF LoadZ(const typename Storage<kDT>::T* p, VF tau) {
  const VF x = LoadWide<kDT>(p);
  if constexpr (kScaled) {
    return hn::Div(x, tau);
  } else {
    (void)tau;
    return x;
  }
}

// One element, widened by the canon's scalar widening.
template <DType kDT>
HWY_INLINE float LoadOneAsFloat(const typename Storage<kDT>::T* p) {
  return numerics::load_as_float<kDT>(p, 0);
}

// ---------------------------------------------------------------------------------------------
// Narrowing.

// canon::float_to_bf16 lane-wise, the result in the high 16 bits of each lane (low bits: junk).
// `may_nan` false: the caller has proved that no lane is NaN, so the canonical-NaN select could
// not fire and is skipped.
HWY_INLINE VU FloatToBf16High(VF g, bool may_nan) {
  const DU du;
  const VU u = hn::BitCast(du, g);
  const VU rounded =
      hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
  if (!may_nan) return rounded;
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(g)),
                        hn::Set(du, uint32_t{canon::kCanonicalBf16NanBits} << 16), rounded);
}

// canon::float_to_bf16 lane-wise (32-bit lanes holding the 16-bit result).
HWY_INLINE VU FloatToBf16Bits(VF g, bool may_nan) {
  return hn::ShiftRight<16>(FloatToBf16High(g, may_nan));
}

// canon::float_to_fp16 lane-wise.
HWY_INLINE VU FloatToFp16Bits(VF g, bool may_nan) {
  const DF d;
  const DU du;
  const VU u = hn::BitCast(du, g);
  const VU sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const VU abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const VU rounded =
      hn::Add(hn::Add(abs, hn::Set(du, 0xfffu)), hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 1u)));
  const VU normal = hn::ShiftRight<13>(hn::Sub(rounded, hn::Set(du, 112u << 23)));
  // Subnormal fp16: abs * 2^24 (exact) rounded to an integer, ties to even.
  const VF magic = hn::Set(d, 12582912.0f);
  const VF scaled = hn::Mul(hn::BitCast(d, abs), hn::Set(d, 16777216.0f));
  const VU sub = hn::Sub(hn::BitCast(du, hn::Add(scaled, magic)), hn::BitCast(du, magic));
  // Unsigned compares via signed ones: abs < 2^31 in every lane.
  const DI di;
  const VI abs_i = hn::BitCast(di, abs);
  const auto is_inf = hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x477ff000 - 1)));
  const auto is_normal = hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x38800000 - 1)));
  VU bits = hn::IfThenElse(is_normal, normal, sub);
  bits = hn::IfThenElse(is_inf, hn::Set(du, 0x7c00u), bits);
  bits = hn::Or(sign, bits);
  if (!may_nan) return bits;
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(g)), hn::Set(du, canon::kCanonicalFp16NanBits),
                        bits);
}

// Writes N gradient values (fp32) as the storage dtype: canonical NaN, round to nearest even.
template <DType kDT>
HWY_INLINE void StoreGrad(VF g, typename Storage<kDT>::T* out, bool stream, bool may_nan) {
  const DF d;
  if constexpr (kDT == DType::fp32) {
    const VF nan = hn::BitCast(d, hn::Set(DU(), canon::kCanonicalNanBits));
    const VF v = may_nan ? hn::IfThenElse(hn::IsNaN(g), nan, g) : g;
    if (stream) {
      hn::Stream(v, d, out);
    } else {
      hn::StoreU(v, d, out);
    }
  } else {
    const D16 d16;
    const VU bits = kDT == DType::bf16 ? FloatToBf16Bits(g, may_nan) : FloatToFp16Bits(g, may_nan);
    const auto narrow = hn::DemoteTo(d16, hn::BitCast(DI(), bits));  // values fit in 16 bits
    if (stream) {
      hn::Stream(narrow, d16, out);
    } else {
      hn::StoreU(narrow, d16, out);
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
