// backward on one target: one pass per row in the term order of canon::grad_element, a fast path
// for the vectors where the canon's special cases cannot occur, narrowing by convert-inl.h.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <hwy/cache_control.h>

#include "kernels/cpu/simd/simd_kernels.hpp"

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_BACKWARD_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_BACKWARD_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_BACKWARD_INL_H_
#endif

#include <hwy/highway.h>
#include "kernels/cpu/simd/convert-inl.h"
#include "kernels/cpu/simd/exp-inl.h"
#include "kernels/cpu/simd/lanes-inl.h"
#include "kernels/cpu/simd/softcap-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

struct RowGrad : canon::GradCoefficients {  // has_logp, g_logp, ... of the row
  float lse, entropy, tau;
  bool finite_lse;
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
  static_cast<canon::GradCoefficients&>(rg) = job.coefficients(row);
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

// Backward with a softcap (canon::grad_of_logit): per vector, th = det_tanh(x / cap), z =
// (cap * th) / tau, GradVec of z (the canon's gradient of z, divided by tau), times the slope
// (1 - th) * (1 + th). The product may be NaN (an infinite gradient times a zero slope), so the
// canonical-NaN select always runs. No streaming stores.
template <DType kDT, bool kScaled, bool kEntropy>
void BackwardRowsCapped(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  using T = typename Storage<kDT>::T;
  const DF d;
  const VF vtau = hn::Set(d, job.temperature);
  const VF vcap = hn::Set(d, job.softcap);
  const int64_t real_end =
      std::clamp<int64_t>(job.geometry.real_vocab - job.vocab_start, 0, job.cols);
  const T* base = static_cast<const T*>(job.data);
  T* gbase = static_cast<T*>(job.grad);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* src = base + row * job.row_stride;
    T* dst = gbase + row * job.grad_row_stride;
    const RowGrad rg = MakeRowGrad(job, row);
    // The gradient of N logits x, the target column in lane `lane` (or -1).
    auto grad_in = [&](VF x, int64_t lane) HWY_ATTR {
      const Capped cz = CapLogits<kScaled>(x, vcap, vtau);
      bool may_nan;
      return hn::Mul(GradVec<kScaled, kEntropy>(cz.z, lane, rg, may_nan), SoftcapSlope(cz.th));
    };
    auto grad_of = [&](VF x, int64_t c0) HWY_ATTR {
      return grad_in(
          x, rg.target >= c0 && rg.target < c0 + static_cast<int64_t>(kN) ? rg.target - c0 : -1);
    };
    int64_t c = 0;
    if constexpr (kDT == DType::bf16) {
      // 2N columns per step as N 32-bit lanes, as in BackwardRowsT: the even columns widen from
      // the low halves, the odd ones from the high halves, and the two gradients pack back.
      const DU du;
      const VU hi_mask = hn::Set(du, 0xffff0000u);
      for (; c + static_cast<int64_t>(2 * kN) <= real_end; c += 2 * kN) {
        const VU w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(src + c));
        int64_t lane_e = -1, lane_o = -1;
        if (static_cast<uint64_t>(rg.target - c) < static_cast<uint64_t>(2 * kN)) {
          const int64_t k = rg.target - c;
          (k % 2 == 0 ? lane_e : lane_o) = k / 2;
        }
        const VF ge = grad_in(hn::BitCast(d, hn::ShiftLeft<16>(w)), lane_e);
        const VF go = grad_in(hn::BitCast(d, hn::And(w, hi_mask)), lane_o);
        hn::StoreU(hn::OrAnd(hn::ShiftRight<16>(FloatToBf16High(ge, true)),
                             FloatToBf16High(go, true), hi_mask),
                   du, reinterpret_cast<uint32_t*>(dst + c));
      }
    }
    for (; c + static_cast<int64_t>(kN) <= real_end; c += kN) {
      StoreGrad<kDT>(grad_of(LoadWide<kDT>(src + c), c), dst + c, false, true);
    }
    if (c < real_end) {
      const int64_t n = real_end - c;
      HWY_ALIGN T in[kN];
      HWY_ALIGN T out[kN];
      std::memset(in, 0, sizeof in);
      std::memcpy(in, src + c, static_cast<size_t>(n) * sizeof(T));
      StoreGrad<kDT>(grad_of(LoadWide<kDT>(in), c), out, false, true);
      std::memcpy(dst + c, out, static_cast<size_t>(n) * sizeof(T));
    }
    // Padding columns: exactly +0.
    if (real_end < job.cols) {
      std::memset(dst + real_end, 0, static_cast<size_t>(job.cols - real_end) * sizeof(T));
    }
  }
}

template <DType kDT, bool kScaled, bool kEntropy>
void BackwardRowsT(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  using T = typename Storage<kDT>::T;
  if (job.softcap != 0.0f)
    return BackwardRowsCapped<kDT, kScaled, kEntropy>(job, row_begin, row_end);
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

void BackwardRows(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  WithStaticFlags(job.dtype, job.temperature != 1.0f, job.grad_entropy != nullptr,
                  [&]<DType kDT, bool kScaled, bool kEntropy>() {
                    BackwardRowsT<kDT, kScaled, kEntropy>(job, row_begin, row_end);
                  });
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
