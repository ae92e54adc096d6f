#pragma once
// The canon of the fused lm_head (docs/numerics.md, "Fused lm_head"): the fp32 dot product that
// turns a hidden state and a weight row into a logit, and the fp32 sums of the two gradients.
// Scalar definitions; the SIMD dot kernels (kernels/cpu/fused) repeat these exact operation
// sequences and are tested bitwise against them on every target.
//
// Only IEEE-754 binary32 fma (one rounding, canon::fma_rn) and add, in a fixed order that
// depends on the element index alone, never on a vector width, a thread or a shard. Never
// compile with fast-math or FP contraction (-ffp-contract=off).

#include <cstdint>

#include "numerics/canon.hpp"

namespace detlogp::canon {

// The dot product has 16 accumulator lanes: element k goes to lane k mod 16; each lane starts
// at +0 and accumulates its elements in increasing k with one fma each; the lanes then fold
// pairwise by halving (h = 8, 4, 2, 1: lane[j] = lane[j] + lane[j + h] for j < h). n is padded
// up to a multiple of 16 with elements +0 * +0 (an fma with a zero product leaves a nonzero lane
// unchanged but turns a -0 lane, reachable by underflow, into +0: the padding is part of the
// order, so that a vector kernel may run whole 16-element chunks). 16 lanes are one AVX-512
// vector, two AVX2 vectors or four SSE4/NEON vectors: every width runs the same chains.
inline constexpr int kDotLanes = 16;

inline float fold_dot_lanes(float* lane) {
  for (int h = kDotLanes / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) lane[j] = lane[j] + lane[j + h];
  }
  return lane[0];
}

// dot(a, b) over n elements in the canonical order. A NaN result is the canonical NaN.
inline float canonical_dot(const float* a, const float* b, int64_t n) {
  float lane[kDotLanes];
  for (int j = 0; j < kDotLanes; ++j) lane[j] = 0.0f;
  const int64_t padded = (n + kDotLanes - 1) / kDotLanes * kDotLanes;
  for (int64_t k = 0; k < padded; ++k) {
    const float x = k < n ? a[k] : 0.0f;
    const float y = k < n ? b[k] : 0.0f;
    lane[k % kDotLanes] = fma_rn(x, y, lane[k % kDotLanes]);
  }
  return canonicalize(fold_dot_lanes(lane));
}

// One step of a gradient chain: acc = fma(coefficient, value, acc). Gradient sums run these
// chains element by element in a fixed index order from +0 (the grad_weight chain over tokens
// in increasing token index, the grad_hidden chain over a tile's real columns in increasing
// column). Nothing is padded in these chains: each output element is its own scalar chain.
inline float chain_step(float coefficient, float value, float acc) {
  return fma_rn(coefficient, value, acc);
}

}  // namespace detlogp::canon
