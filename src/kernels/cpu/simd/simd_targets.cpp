// The numerics canon (shared/design/numerics.md, src/numerics/canon.hpp) on SIMD vectors, compiled
// once per Highway target. Every lane performs exactly the IEEE-754 operations of the scalar canon
// in the same order, so each target returns the canon's bits:
//
// - det_exp: the canon's Cody-Waite reduction and Horner polynomial lane-wise. rint is done with
//   the 1.5 * 2^23 trick (exact ties-to-even for |t| < 2^22, the only range that survives the
//   range checks), the integer q read from the same sum's bits. fma is the hardware instruction
//   where Highway's MulAdd is fused (HWY_NATIVE_FMA), std::fma per lane otherwise.
// - Leaf of a tile (32 canon lanes): pass 1 takes the max (exact in any order), pass 2 sums
//   det_exp(z - m) with element k in canon lane k mod 32 (2 vectors of 16 lanes with AVX-512, 4 of
//   8 with AVX2, 8 of 4 with SSE4/EMU128), then folds h = 16, 8, 4, 2, 1. A tile whose max is not
//   finite (NaN, +inf, all -inf) goes to the scalar canon itself; a NaN dropped by the vector max
//   turns s into NaN in pass 2, which poisons the leaf exactly as the canon does.
// - The tree inside a node: the merges of a level are done N at a time on SoA arrays (even/odd
//   children deinterleaved), the canon's special cases (poison, identities) selected by masks.
// - Backward: one pass per row, term order of canon::grad_element, narrowing with the canon's
//   integer rounding (bf16, fp16) and canonical NaNs.
//
// Never compiled with fast-math or FP contraction (-ffp-contract=off).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/simd/simd_kernels.hpp"
#include "numerics/canon.hpp"

// Targets: AVX-512 (AVX3), AVX2, SSE4 (no FMA: emulated per lane) and Highway's portable
// fallback (EMU128, or SCALAR where Highway marks EMU128 broken for the compiler, as with
// Debian 12's GCC 12). SSSE3-only CPUs use the fallback. Must be set before the first Highway
// header.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/simd_targets.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway headers after foreach_target.h.
#include <hwy/cache_control.h>
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

// a * b + c with one rounding.
HWY_INLINE VF Fma(VF a, VF b, VF c) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(a, b, c);
#else
  const DF d;
  HWY_ALIGN float A[kN];
  HWY_ALIGN float B[kN];
  HWY_ALIGN float C[kN];
  hn::Store(a, d, A);
  hn::Store(b, d, B);
  hn::Store(c, d, C);
  for (size_t i = 0; i < kN; ++i) A[i] = std::fma(A[i], B[i], C[i]);
  return hn::Load(d, A);
#endif
}

// 2^n for n in [-126, 127], from bits (canon::pow2i).
HWY_INLINE VF Pow2i(VI n) {
  const DF d;
  const DI di;
  return hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n, hn::Set(di, 127))));
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
  const VF neg_q = hn::Neg(q);
  VF r = Fma(neg_q, hn::Set(d, K::kLn2Hi), x);
  r = Fma(neg_q, hn::Set(d, K::kLn2Lo), r);
  VF p = hn::Set(d, K::kC6);
  p = Fma(p, r, hn::Set(d, K::kC5));
  p = Fma(p, r, hn::Set(d, K::kC4));
  p = Fma(p, r, hn::Set(d, K::kC3));
  p = Fma(p, r, hn::Set(d, K::kC2));
  p = Fma(p, r, hn::Set(d, 1.0f));
  p = Fma(p, r, hn::Set(d, 1.0f));
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
  VF r = hn::NegMulAdd(q, hn::Set(d, K::kLn2Hi), x);
  r = hn::NegMulAdd(q, hn::Set(d, K::kLn2Lo), r);
  VF p = hn::Set(d, K::kC6);
  p = Fma(p, r, hn::Set(d, K::kC5));
  p = Fma(p, r, hn::Set(d, K::kC4));
  p = Fma(p, r, hn::Set(d, K::kC3));
  p = Fma(p, r, hn::Set(d, K::kC2));
  p = Fma(p, r, hn::Set(d, 1.0f));
  p = Fma(p, r, hn::Set(d, 1.0f));
  const VF y{_mm512_scalef_ps(p.raw, q.raw)};
#else
  const VF magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const VF tq = hn::Add(hn::Mul(x, hn::Set(d, K::kLog2e)), magic);
  const VF q = hn::Sub(tq, magic);
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
  p = Fma(p, r, hn::Set(d, 1.0f));
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

template <DType kDT>
HWY_INLINE float LoadOneAsFloat(const typename Storage<kDT>::T* p) {
  if constexpr (kDT == DType::fp32) {
    return *p;
  } else if constexpr (kDT == DType::bf16) {
    return canon::bf16_to_float(*p);
  } else {
    return canon::fp16_to_float(*p);
  }
}

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

// ---------------------------------------------------------------------------------------------
// canon::merge on N pairs at once.

template <bool kEntropy>
HWY_INLINE void MergeVec(VF lm, VF ls, VF lu, VF rm, VF rs, VF ru, VF& om, VF& os, VF& ou) {
  const DF d;
  const VF zero = hn::Zero(d);
  const VF M = hn::IfThenElse(hn::Gt(lm, rm), lm, rm);
  const VF dl = hn::Sub(lm, M);
  const VF dr = hn::Sub(rm, M);
  // dl, dr <= 0 on every lane that keeps the general result.
  const VF el = DetExpNonPositive(dl);
  const VF er = DetExpNonPositive(dr);
  VF m = M;
  VF s = hn::Add(hn::Mul(ls, el), hn::Mul(rs, er));
  VF u = zero;
  if constexpr (kEntropy) {
    u = hn::Add(hn::Mul(el, hn::Add(lu, hn::Mul(dl, ls))),
                hn::Mul(er, hn::Add(ru, hn::Mul(dr, rs))));
  }
  // Special cases, lowest priority first: left identity, right identity, poison.
  const auto left_id = hn::Eq(ls, zero);
  m = hn::IfThenElse(left_id, rm, m);
  s = hn::IfThenElse(left_id, rs, s);
  u = hn::IfThenElse(left_id, ru, u);
  const auto right_id = hn::Eq(rs, zero);
  m = hn::IfThenElse(right_id, lm, m);
  s = hn::IfThenElse(right_id, ls, s);
  u = hn::IfThenElse(right_id, lu, u);
  const auto poison =
      hn::Or(hn::Or(hn::IsNaN(ls), hn::IsNaN(lu)), hn::Or(hn::IsNaN(rs), hn::IsNaN(ru)));
  const VF nan = hn::BitCast(d, hn::Set(DU(), canon::kCanonicalNanBits));
  om = hn::IfThenElse(poison, nan, m);
  os = hn::IfThenElse(poison, nan, s);
  ou = hn::IfThenElse(poison, nan, u);
}

// Partials of consecutive leaves in SoA form; reduced in place level by level.
struct LevelScratch {
  std::vector<float> m, s, u;
  void reserve(size_t n) {
    m.resize(n);
    s.resize(n);
    u.resize(n);
  }
};

// Reduces n >= 1 partials (the leaves of one node, in order) by `levels` tree levels in place;
// the result is at index 0. Partials beyond n are identities.
template <bool kEntropy>
HWY_INLINE canon::Partial ReduceLevels(LevelScratch& sc, int64_t n, int levels) {
  const DF d;
  float* M = sc.m.data();
  float* S = sc.s.data();
  float* U = sc.u.data();
  int done = 0;
  while (n > 1) {
    const int64_t n_out = (n + 1) / 2;
    const int64_t n_out_padded = (n_out + static_cast<int64_t>(kN) - 1) / kN * kN;
    for (int64_t i = n; i < 2 * n_out_padded; ++i) {
      M[i] = -canon::kInf;
      S[i] = 0.0f;
      U[i] = 0.0f;
    }
    for (int64_t i = 0; i < n_out_padded; i += kN) {
      const int64_t a = 2 * i;
      const VF m0 = hn::LoadU(d, M + a), m1 = hn::LoadU(d, M + a + kN);
      const VF s0 = hn::LoadU(d, S + a), s1 = hn::LoadU(d, S + a + kN);
      const VF u0 = hn::LoadU(d, U + a), u1 = hn::LoadU(d, U + a + kN);
      VF om, os, ou;
      MergeVec<kEntropy>(hn::ConcatEven(d, m1, m0), hn::ConcatEven(d, s1, s0),
                         hn::ConcatEven(d, u1, u0), hn::ConcatOdd(d, m1, m0),
                         hn::ConcatOdd(d, s1, s0), hn::ConcatOdd(d, u1, u0), om, os, ou);
      hn::StoreU(om, d, M + i);
      hn::StoreU(os, d, S + i);
      hn::StoreU(ou, d, U + i);
    }
    n = n_out;
    ++done;
  }
  canon::Partial p{M[0], S[0], U[0]};
  // The remaining levels merge with identity subtrees: the canon's merge(p, identity).
  if (done < levels) p = canon::merge<kEntropy>(p, canon::identity_partial());
  return p;
}

// ---------------------------------------------------------------------------------------------
// node_partials for rows [row_begin, row_end).

template <DType kDT, bool kEntropy, bool kScaled>
void NodePartialsRowsT(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  using T = typename Storage<kDT>::T;
  const int64_t W = job.geometry.tile_width;
  const int64_t R = job.geometry.real_vocab;
  const int64_t real_tiles = job.geometry.num_real_tiles();
  int64_t max_leaves = 0;
  for (int64_t j = 0; j < job.num_nodes; ++j) {
    const TreeNode& node = job.nodes[j];
    const int64_t n = std::min(node.end_tile(), real_tiles) - node.first_tile();
    max_leaves = std::max(max_leaves, n);
  }
  LevelScratch level;
  level.reserve(static_cast<size_t>(max_leaves + 2 * static_cast<int64_t>(kN)));
  LeafScratch leaf;
  const T* base = static_cast<const T*>(job.data);
  for (int64_t row = row_begin; row < row_end; ++row) {
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const TreeNode& node = job.nodes[j];
      const int64_t first = node.first_tile();
      const int64_t n = std::min(node.end_tile(), real_tiles) - first;
      canon::Partial p = canon::identity_partial();
      if (n > 0) {  // (a node of padding tiles only may come with an empty shard: no data)
        const T* row_ptr = base + row * job.row_stride;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t col = (first + i) * W;
          const int64_t count = std::min(W, R - col);
          const canon::Partial leaf_p = LeafTile<kDT, kEntropy, kScaled>(
              row_ptr + (col - job.vocab_start), count, job.temperature, leaf);
          level.m[static_cast<size_t>(i)] = leaf_p.m;
          level.s[static_cast<size_t>(i)] = leaf_p.s;
          level.u[static_cast<size_t>(i)] = leaf_p.u;
        }
        p = ReduceLevels<kEntropy>(level, n, node.level);
      }
      job.out[row * job.num_nodes + j] = p;
    }
  }
}

template <DType kDT>
void NodePartialsRowsDT(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  const bool scaled = job.temperature != 1.0f;
  if (job.with_entropy) {
    scaled ? NodePartialsRowsT<kDT, true, true>(job, row_begin, row_end)
           : NodePartialsRowsT<kDT, true, false>(job, row_begin, row_end);
  } else {
    scaled ? NodePartialsRowsT<kDT, false, true>(job, row_begin, row_end)
           : NodePartialsRowsT<kDT, false, false>(job, row_begin, row_end);
  }
}

void NodePartialsRows(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  switch (job.dtype) {
    case DType::fp32:
      return NodePartialsRowsDT<DType::fp32>(job, row_begin, row_end);
    case DType::bf16:
      return NodePartialsRowsDT<DType::bf16>(job, row_begin, row_end);
    case DType::fp16:
      return NodePartialsRowsDT<DType::fp16>(job, row_begin, row_end);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.

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

struct RowGrad {
  float lse, entropy, tau;
  bool finite_lse;
  bool has_logp, has_lse, has_entropy;
  float g_logp, g_lse, g_entropy;
  int64_t target;  // local column, or -1
  // The fast path of GradVec (see there).
  bool fast;          // lse finite and at least one gradient supplied
  bool nan_free;      // no fast-path lane can be NaN
  float neg_g_logp;   // -g_logp; -0 when not supplied
  float fast_g_lse;   // g_lse; -0 when not supplied
  float neg_entropy;  // -entropy
};

RowGrad MakeRowGrad(const BackwardJob& job, int64_t row) {
  RowGrad rg;
  rg.lse = job.lse[row];
  rg.entropy = job.entropy != nullptr ? job.entropy[row] : 0.0f;
  rg.tau = job.temperature;
  rg.finite_lse = rg.lse - rg.lse == 0.0f;
  rg.has_logp = job.grad_logp != nullptr;
  rg.has_lse = job.grad_lse != nullptr;
  rg.has_entropy = job.grad_entropy != nullptr;
  rg.g_logp = rg.has_logp ? job.grad_logp[row] : 0.0f;
  rg.g_lse = rg.has_lse ? job.grad_lse[row] : 0.0f;
  rg.g_entropy = rg.has_entropy ? job.grad_entropy[row] : 0.0f;
  rg.target = job.target_local[row];
  rg.fast = rg.finite_lse && (rg.has_logp || rg.has_lse || rg.has_entropy);
  rg.neg_g_logp = rg.has_logp ? -rg.g_logp : -0.0f;
  rg.fast_g_lse = rg.has_lse ? rg.g_lse : -0.0f;
  rg.neg_entropy = -rg.entropy;
  // See GradVec: t1 + t2 is finite when |g_logp| + |g_lse| <= FLT_MAX (exact in double), the
  // entropy bracket when |H| <= 1e38; then at most t3 is infinite and no lane is NaN.
  const auto finite = [](float v) { return v - v == 0.0f; };
  rg.nan_free =
      rg.finite_lse && finite(rg.g_logp) && finite(rg.g_lse) &&
      std::fabs(static_cast<double>(rg.g_logp)) + std::fabs(static_cast<double>(rg.g_lse)) <=
          static_cast<double>(std::numeric_limits<float>::max()) &&
      (!rg.has_entropy || (finite(rg.g_entropy) && std::fabs(rg.entropy) <= 1e38f));
  return rg;
}

// canon::grad_element for N columns, in general (any z, lse, coefficients); `target_lane` is the
// lane holding the target column, or -1. Not inlined: the fast path below takes nearly every
// vector, and this keeps the hot loop small.
template <bool kScaled>
HWY_NOINLINE VF GradVecGeneral(VF z, int64_t target_lane, const RowGrad& rg) {
  const DF d;
  const VF zero = hn::Zero(d);
  const VF vlse = hn::Set(d, rg.lse);
  const VF p = rg.finite_lse ? DetExpAny(hn::Sub(z, vlse)) : zero;
  VF grad = zero;
  bool any = false;
  if (rg.has_logp) {
    VF onehot = zero;
    if (target_lane >= 0) {
      const DI di;
      const auto at = hn::Eq(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(target_lane)));
      onehot = hn::IfThenElseZero(hn::RebindMask(d, at), hn::Set(d, 1.0f));
    }
    grad = hn::Mul(hn::Set(d, rg.g_logp), hn::Sub(onehot, p));
    any = true;
  }
  if (rg.has_lse) {
    const VF t2 = hn::Mul(hn::Set(d, rg.g_lse), p);
    grad = any ? hn::Add(grad, t2) : t2;
    any = true;
  }
  if (rg.has_entropy) {
    const VF bracket = hn::Sub(hn::Sub(vlse, z), hn::Set(d, rg.entropy));
    const VF t3 =
        hn::IfThenZeroElse(hn::Eq(p, zero), hn::Mul(hn::Set(d, rg.g_entropy), hn::Mul(p, bracket)));
    grad = any ? hn::Add(grad, t3) : t3;
  }
  if constexpr (kScaled) grad = hn::Div(grad, hn::Set(d, rg.tau));
  return grad;
}

// Bits of -86.0f as a signed integer: x <= -0 and x >= -86 exactly when bits(x), read as int32,
// is <= this (negative floats are the negative integers, ordered by magnitude; +0, positive
// numbers, -inf and NaNs all compare greater).
constexpr int32_t kFastLimitBits = static_cast<int32_t>(0xc2ac0000u);
static_assert(std::bit_cast<uint32_t>(-86.0f) == 0xc2ac0000u);

// canon::grad_element for N columns; `may_nan` tells whether a lane can be NaN.
//
// Fast path: a row with finite LSE and at least one gradient, a vector without the target column,
// and x = z - LSE in [-86, -0] on every lane (one integer compare). There, with the canon's bits:
// - p = det_exp(x) is a normal number in (0, 1]: no flush (DetExpNonPositive<true>), and the
//   entropy term's p == 0 select cannot fire;
// - onehot - p = 0 - p = -p exactly, so g_logp (0 - p) = (-g_logp) p (same exact product);
// - LSE - z = -x exactly (x != +0), so (LSE - z) - H = (-x) + (-H) = (-H) - x;
// - a gradient that is not supplied adds -0 (t1 = -0 p, t2 = -0 p), which leaves every sum
//   unchanged (y + -0 == y for every y, and a first term -0 + -0 + t3 == t3); with no gradient
//   at all the canon's +0 differs, so such rows take the general path;
// - no lane is NaN when the row's coefficients are tame (RowGrad::nan_free): then the
//   canonical-NaN select is skipped.
// Whether every lane of x lies in [-86, -0].
HWY_INLINE bool InFastRange(VF x) {
  const DI di;
  return hn::AllTrue(di, hn::Lt(hn::BitCast(di, x), hn::Set(di, kFastLimitBits + 1)));
}
// The same for every lane of a and b (the larger integer of the two, lane-wise).
HWY_INLINE bool InFastRange(VF a, VF b) {
  const DI di;
  return hn::AllTrue(
      di, hn::Lt(hn::Max(hn::BitCast(di, a), hn::BitCast(di, b)), hn::Set(di, kFastLimitBits + 1)));
}

// The fast path's gradient of x = z - LSE (all lanes in [-86, -0], no target column).
template <bool kScaled, bool kEntropy>
HWY_INLINE VF FastGrad(VF x, const RowGrad& rg) {
  const DF d;
  const VF p = DetExpNonPositive<true>(x);
  VF grad = hn::Add(hn::Mul(hn::Set(d, rg.neg_g_logp), p), hn::Mul(hn::Set(d, rg.fast_g_lse), p));
  if constexpr (kEntropy) {
    const VF bracket = hn::Sub(hn::Set(d, rg.neg_entropy), x);
    grad = hn::Add(grad, hn::Mul(hn::Set(d, rg.g_entropy), hn::Mul(p, bracket)));
  }
  if constexpr (kScaled) grad = hn::Div(grad, hn::Set(d, rg.tau));
  return grad;
}

template <bool kScaled, bool kEntropy>
HWY_INLINE VF GradVec(VF z, int64_t target_lane, const RowGrad& rg, bool& may_nan) {
  const DF d;
  const VF x = hn::Sub(z, hn::Set(d, rg.lse));
  if (rg.fast && target_lane < 0 && InFastRange(x)) {
    may_nan = !rg.nan_free;
    return FastGrad<kScaled, kEntropy>(x, rg);
  }
  may_nan = true;
  return GradVecGeneral<kScaled>(z, target_lane, rg);
}

// One step of the bf16 loop (2N columns) outside the fast path: not inlined, so that the hot
// loop holds no call.
template <bool kScaled, bool kEntropy>
HWY_NOINLINE void Bf16StepGeneral(VF ze, VF zo, int64_t c, const RowGrad& rg, uint32_t* out,
                                  bool stream) {
  const DU du;
  int64_t lane_e = -1, lane_o = -1;
  if (rg.target >= c && rg.target < c + static_cast<int64_t>(2 * kN)) {
    const int64_t k = rg.target - c;
    (k % 2 == 0 ? lane_e : lane_o) = k / 2;
  }
  bool nan_e, nan_o;
  const VF ge = GradVec<kScaled, kEntropy>(ze, lane_e, rg, nan_e);
  const VF go = GradVec<kScaled, kEntropy>(zo, lane_o, rg, nan_o);
  const VU packed = hn::OrAnd(hn::ShiftRight<16>(FloatToBf16High(ge, nan_e)),
                              FloatToBf16High(go, nan_o), hn::Set(du, 0xffff0000u));
  if (stream) {
    hn::Stream(packed, du, out);
  } else {
    hn::StoreU(packed, du, out);
  }
}

template <DType kDT, bool kScaled, bool kEntropy>
void BackwardRowsT(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const VF vtau = hn::Set(d, job.temperature);
  const int64_t real_end =
      std::clamp<int64_t>(job.geometry.real_vocab - job.vocab_start, 0, job.cols);
  const T* base = static_cast<const T*>(job.data);
  T* gbase = static_cast<T*>(job.grad);
  // Bytes written per step of the main loop (the streaming alignment).
  constexpr size_t kStep = (kDT == DType::bf16 ? 2 * kN : kN) * sizeof(T);
  // Only whole native vectors (16 bytes or more) are streamed: Highway's Stream of a partial
  // vector (fp16 output on 4-lane targets) would write a full register.
  constexpr bool kCanStream = kStep >= 16;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* src = base + row * job.row_stride;
    T* dst = gbase + row * job.grad_row_stride;
    const RowGrad rg = MakeRowGrad(job, row);

    auto lane_of = [&](int64_t c0) -> int64_t {
      return rg.target >= c0 && rg.target < c0 + static_cast<int64_t>(kN) ? rg.target - c0 : -1;
    };
    // Columns [c, c + n), n <= N, through small buffers (row heads and tails).
    auto partial = [&](int64_t c, int64_t n) HWY_ATTR {
      HWY_ALIGN T in[kN];
      HWY_ALIGN T out[kN];
      std::memset(in, 0, sizeof in);
      std::memcpy(in, src + c, static_cast<size_t>(n) * sizeof(T));
      bool may_nan;
      const VF g =
          GradVec<kScaled, kEntropy>(LoadZ<kDT, kScaled>(in, vtau), lane_of(c), rg, may_nan);
      StoreGrad<kDT>(g, out, false, may_nan);
      std::memcpy(dst + c, out, static_cast<size_t>(n) * sizeof(T));
    };
    auto partial_range = [&](int64_t c0, int64_t c1) HWY_ATTR {
      for (int64_t c = c0; c < c1; c += kN) partial(c, std::min<int64_t>(kN, c1 - c));
    };
    int64_t c = 0;
    bool stream = false;
    if (kCanStream && job.stream_stores && reinterpret_cast<uintptr_t>(dst) % sizeof(T) == 0) {
      const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) % kStep;
      const int64_t head = mis == 0 ? 0 : static_cast<int64_t>((kStep - mis) / sizeof(T));
      if (head < real_end) {
        partial_range(0, head);
        c = head;
        stream = true;
      }
    }
    if constexpr (kDT == DType::bf16) {
      // 2N columns per step as N 32-bit lanes: the even columns are the low halves, the odd
      // ones the high halves; both widen with one operation and the two results recombine
      // into the same layout (element-wise math does not care about the lane order).
      const DU du;
      const VU hi_mask = hn::Set(du, 0xffff0000u);
      const VF vlse = hn::Set(d, rg.lse);
      const bool fast_row = rg.fast;
      const bool may_nan = !rg.nan_free;
      for (; c + static_cast<int64_t>(2 * kN) <= real_end; c += 2 * kN) {
        const VU w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(src + c));
        VF ze = hn::BitCast(d, hn::ShiftLeft<16>(w));
        VF zo = hn::BitCast(d, hn::And(w, hi_mask));
        if constexpr (kScaled) {
          ze = hn::Div(ze, vtau);
          zo = hn::Div(zo, vtau);
        }
        uint32_t* out = reinterpret_cast<uint32_t*>(dst + c);
        const VF xe = hn::Sub(ze, vlse);
        const VF xo = hn::Sub(zo, vlse);
        // The target column lies in [c, c + 2N) when (target - c) < 2N as an unsigned number.
        if (HWY_UNLIKELY(!fast_row ||
                         static_cast<uint64_t>(rg.target - c) < static_cast<uint64_t>(2 * kN) ||
                         !InFastRange(xe, xo))) {
          Bf16StepGeneral<kScaled, kEntropy>(ze, zo, c, rg, out, stream);
          continue;
        }
        const VF ge = FastGrad<kScaled, kEntropy>(xe, rg);
        const VF go = FastGrad<kScaled, kEntropy>(xo, rg);
        const VU packed = hn::OrAnd(hn::ShiftRight<16>(FloatToBf16High(ge, may_nan)),
                                    FloatToBf16High(go, may_nan), hi_mask);
        if (stream) {
          hn::Stream(packed, du, out);
        } else {
          hn::StoreU(packed, du, out);
        }
      }
    } else {
      for (; c + static_cast<int64_t>(kN) <= real_end; c += kN) {
        bool may_nan;
        const VF g =
            GradVec<kScaled, kEntropy>(LoadZ<kDT, kScaled>(src + c, vtau), lane_of(c), rg, may_nan);
        StoreGrad<kDT>(g, dst + c, stream, may_nan);
      }
    }
    partial_range(c, real_end);
    // Padding columns: exactly +0.
    if (real_end < job.cols) {
      std::memset(dst + real_end, 0, static_cast<size_t>(job.cols - real_end) * sizeof(T));
    }
  }
  if (job.stream_stores) hwy::FlushStream();
}

template <DType kDT>
void BackwardRowsDT(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  const bool scaled = job.temperature != 1.0f;
  if (job.grad_entropy != nullptr) {
    scaled ? BackwardRowsT<kDT, true, true>(job, row_begin, row_end)
           : BackwardRowsT<kDT, false, true>(job, row_begin, row_end);
  } else {
    scaled ? BackwardRowsT<kDT, true, false>(job, row_begin, row_end)
           : BackwardRowsT<kDT, false, false>(job, row_begin, row_end);
  }
}

void BackwardRows(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  switch (job.dtype) {
    case DType::fp32:
      return BackwardRowsDT<DType::fp32>(job, row_begin, row_end);
    case DType::bf16:
      return BackwardRowsDT<DType::bf16>(job, row_begin, row_end);
    case DType::fp16:
      return BackwardRowsDT<DType::fp16>(job, row_begin, row_end);
  }
}

void DetExpArray(const float* x, float* y, int64_t n) {
  const DF d;
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kN) <= n; i += kN) {
    hn::StoreU(DetExpAny(hn::LoadU(d, x + i)), d, y + i);
  }
  if (i < n) {
    HWY_ALIGN float in[kN] = {};
    HWY_ALIGN float out[kN];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(float));
    hn::Store(DetExpAny(hn::Load(d, in)), d, out);
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
}

#else  // HWY_TARGET == HWY_SCALAR

void DetExpArray(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = canon::det_exp(x[i]);
}

// The single-lane fallback: the scalar canon itself, element by element (a CPU without SSE4).

template <class Load>
void NodePartialsRowsScalar(const NodePartialsJob& job, int64_t row_begin, int64_t row_end,
                            Load load) {
  const int64_t W = job.geometry.tile_width;
  const int64_t R = job.geometry.real_vocab;
  const int64_t real_tiles = job.geometry.num_real_tiles();
  std::vector<float> z;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t row_base = row * job.row_stride - job.vocab_start;
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const TreeNode& node = job.nodes[j];
      const int64_t first = node.first_tile();
      const int64_t n = std::min(node.end_tile(), real_tiles) - first;
      std::vector<canon::Partial> level;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t col = (first + i) * W;
        const int64_t count = std::min(W, R - col);
        z.resize(static_cast<size_t>(count));
        for (int64_t k = 0; k < count; ++k) {
          z[static_cast<size_t>(k)] = canon::scale_logit(load(row_base + col + k), job.temperature);
        }
        level.push_back(canon::leaf_partial(z.data(), count, job.with_entropy));
      }
      canon::Partial p = canon::identity_partial();
      if (n > 0) {
        int done = 0;
        while (level.size() > 1) {
          std::vector<canon::Partial> next;
          for (size_t i = 0; i < level.size(); i += 2) {
            next.push_back(canon::merge(
                level[i], i + 1 < level.size() ? level[i + 1] : canon::identity_partial(),
                job.with_entropy));
          }
          level.swap(next);
          ++done;
        }
        p = level[0];
        if (done < node.level) p = canon::merge(p, canon::identity_partial(), job.with_entropy);
      }
      job.out[row * job.num_nodes + j] = p;
    }
  }
}

void NodePartialsRows(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  const auto* bytes = static_cast<const unsigned char*>(job.data);
  NodePartialsRowsScalar(job, row_begin, row_end, [&](int64_t i) {
    if (job.dtype == DType::fp32) {
      float f;
      std::memcpy(&f, bytes + i * 4, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes + i * 2, 2);
    return job.dtype == DType::bf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
  });
}

void BackwardRows(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  const auto* src = static_cast<const unsigned char*>(job.data);
  auto* dst = static_cast<unsigned char*>(job.grad);
  const size_t es = dtype_size(job.dtype);
  const int64_t real_end =
      std::clamp<int64_t>(job.geometry.real_vocab - job.vocab_start, 0, job.cols);
  for (int64_t row = row_begin; row < row_end; ++row) {
    canon::GradCoefficients g;
    g.has_logp = job.grad_logp != nullptr;
    g.has_lse = job.grad_lse != nullptr;
    g.has_entropy = job.grad_entropy != nullptr;
    g.g_logp = g.has_logp ? job.grad_logp[row] : 0.0f;
    g.g_lse = g.has_lse ? job.grad_lse[row] : 0.0f;
    g.g_entropy = g.has_entropy ? job.grad_entropy[row] : 0.0f;
    const float lse = job.lse[row];
    const float entropy = job.entropy != nullptr ? job.entropy[row] : 0.0f;
    for (int64_t c = 0; c < job.cols; ++c) {
      const size_t in_at = static_cast<size_t>(row * job.row_stride + c) * es;
      const size_t out_at = static_cast<size_t>(row * job.grad_row_stride + c) * es;
      float grad = 0.0f;
      if (c < real_end) {
        float x;
        if (job.dtype == DType::fp32) {
          std::memcpy(&x, src + in_at, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, src + in_at, 2);
          x = job.dtype == DType::bf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
        }
        const float z = canon::scale_logit(x, job.temperature);
        grad = canon::grad_element(z, c == job.target_local[row], lse, entropy, g, job.temperature);
      }
      if (job.dtype == DType::fp32) {
        const float f = canon::canonicalize(grad);
        std::memcpy(dst + out_at, &f, 4);
      } else {
        const uint16_t h =
            job.dtype == DType::bf16 ? canon::float_to_bf16(grad) : canon::float_to_fp16(grad);
        std::memcpy(dst + out_at, &h, 2);
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// This target's entry points (exported below; one table entry per target).
const TargetOps* GetTargetOps() {
  static const TargetOps ops{HWY_TARGET,          hwy::TargetName(HWY_TARGET),
                             HWY_NATIVE_FMA != 0, &NodePartialsRows,
                             &BackwardRows,       &DetExpArray};
  return &ops;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace detlogp::simd {

HWY_EXPORT(GetTargetOps);

std::vector<TargetOps> supported_target_ops() {
  // Index HWY_EXPORT's table directly, one entry per target, instead of HWY_DYNAMIC_DISPATCH:
  // this selects a given target without changing Highway's global choice (no mutable state).
  std::vector<TargetOps> result;
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t rest = targets; rest != 0; rest &= rest - 1) {
    const int64_t target = rest & -rest;  // lowest bit = best remaining target
    size_t index = 0;
#if (HWY_TARGETS & (HWY_TARGETS - 1)) != 0
    if (target == HWY_EMU128 || target == HWY_SCALAR) {
      index = HWY_MAX_DYNAMIC_TARGETS + 1;  // the fallback entry
    } else {
      index = hwy::Num0BitsBelowLS1Bit_Nonzero64(
          static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(target)));
    }
#endif
    const auto fn = HWY_DISPATCH_TABLE(GetTargetOps)[index];
    if (fn == nullptr) continue;
    const TargetOps* ops = fn();
    if (ops->target != target) continue;  // not this target's code: never hand it out
    result.push_back(*ops);
  }
  return result;
}

}  // namespace detlogp::simd
#endif  // HWY_ONCE
