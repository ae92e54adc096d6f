#pragma once
// Warp-level pieces of the canon for the CUDA kernels: the canon's 32 lanes are a warp's 32
// lanes. The leaf partial of one tile by one warp (lane j holds the tile's elements
// k = j, j+32, j+64, ... in increasing k, sums det_exp(z_k - m) from +0 in that order, then the
// lanes fold with __shfl_down_sync for h = 16, 8, 4, 2, 1: canon::leaf_partial's lane order), and
// the pairwise tree over the partials held by a warp's lanes. The per-element exp is
// det_exp_shift (exp_shift.hpp): canon::det_exp's bits without its two float->int conversions.

#include <cstdint>

#include "detlogp/dtype.hpp"
#include "kernels/cuda/exp_shift.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::cuda_impl {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
static_assert(canon::kLanes == kWarp, "the canon's lane order is a 32-lane warp");

__device__ __forceinline__ canon::Partial shfl_partial(const canon::Partial& p, int src) {
  return canon::Partial{__shfl_sync(kFullMask, p.m, src), __shfl_sync(kFullMask, p.s, src),
                        __shfl_sync(kFullMask, p.u, src)};
}

// The lane fold of numerics.md "Leaf partial" step 3: lane[j] = lane[j] + lane[j + h] for
// h = 16..1; lane 0 holds the sum (other lanes hold values the canon never reads).
__device__ __forceinline__ float fold_lanes(float v) {
#pragma unroll
  for (int h = kWarp / 2; h >= 1; h /= 2) v = v + __shfl_down_sync(kFullMask, v, h);
  return v;
}

// Maximum over the warp; exact in any order (the sign of a zero result is normalised later).
__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
  for (int h = kWarp / 2; h >= 1; h /= 2) {
    const float o = __shfl_xor_sync(kFullMask, m, h);
    m = o > m ? o : m;
  }
  return m;
}

// canon::leaf_partial for one tile by one warp, from z values this lane holds: z[i] is element
// k = lane + 32 i of the tile (valid when k < count). Returns the partial in every lane.
template <bool kEntropy, int kPerLane>
__device__ __forceinline__ canon::Partial leaf_from_registers(const float (&z)[kPerLane], int count,
                                                              int lane) {
  float m = -canon::kInf;
  bool saw_nan = false;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + kWarp * i < count) {
      saw_nan = saw_nan || canon::is_nan(z[i]);
      m = z[i] > m ? z[i] : m;
    }
  }
  saw_nan = __any_sync(kFullMask, saw_nan);
  m = warp_max(m);
  if (saw_nan || m == canon::kInf) return canon::poisoned_partial();
  if (m == -canon::kInf) return canon::identity_partial();
  if (m == 0.0f) m = 0.0f;  // normalise -0 to +0
  float s = 0.0f;
  float u = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + kWarp * i < count) {
      const float e = det_exp_shift(z[i] - m);  // == canon::det_exp, bit for bit
      s = s + e;
      if (kEntropy) u = u + canon::entropy_term(e, z[i], m);
    }
  }
  s = fold_lanes(s);
  if (kEntropy) u = fold_lanes(u);
  return canon::Partial{m, __shfl_sync(kFullMask, s, 0),
                        kEntropy ? __shfl_sync(kFullMask, u, 0) : 0.0f};
}

// The same for a tile of any width, reading z twice (max, then sums) from memory.
template <DType kDT, bool kEntropy>
__device__ canon::Partial leaf_any_width(const void* __restrict__ row, int64_t local_begin,
                                         int64_t count, float tau, int lane) {
  float m = -canon::kInf;
  bool saw_nan = false;
  for (int64_t k = lane; k < count; k += kWarp) {
    const float z = canon::scale_logit(numerics::load_as_float<kDT>(row, local_begin + k), tau);
    saw_nan = saw_nan || canon::is_nan(z);
    m = z > m ? z : m;
  }
  saw_nan = __any_sync(kFullMask, saw_nan);
  m = warp_max(m);
  if (saw_nan || m == canon::kInf) return canon::poisoned_partial();
  if (m == -canon::kInf) return canon::identity_partial();
  if (m == 0.0f) m = 0.0f;
  float s = 0.0f;
  float u = 0.0f;
  for (int64_t k = lane; k < count; k += kWarp) {
    const float z = canon::scale_logit(numerics::load_as_float<kDT>(row, local_begin + k), tau);
    const float e = det_exp_shift(z - m);  // == canon::det_exp, bit for bit
    s = s + e;
    if (kEntropy) u = u + canon::entropy_term(e, z, m);
  }
  s = fold_lanes(s);
  if (kEntropy) u = fold_lanes(u);
  return canon::Partial{m, __shfl_sync(kFullMask, s, 0),
                        kEntropy ? __shfl_sync(kFullMask, u, 0) : 0.0f};
}

// Pairwise tree over the partials held by lanes 0..n-1 (n a power of two <= 32): level by level,
// lane i <- merge(lane 2i, lane 2i+1). Lane 0 ends with the root of the n partials.
template <bool kEntropy>
__device__ __forceinline__ canon::Partial warp_tree(canon::Partial mine, int n, int lane) {
  for (int h = n / 2; h >= 1; h /= 2) {
    const canon::Partial left = shfl_partial(mine, (2 * lane) & (kWarp - 1));
    const canon::Partial right = shfl_partial(mine, (2 * lane + 1) & (kWarp - 1));
    if (lane < h) mine = canon::merge<kEntropy>(left, right);
  }
  return mine;
}

}  // namespace detlogp::cuda_impl
