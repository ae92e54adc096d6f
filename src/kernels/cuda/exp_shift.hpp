#pragma once
// det_exp_shift: canon::det_exp with its two float->integer conversions (rintf and the cast of
// q to int) replaced by the add-a-shift trick, for the CUDA leaf kernel, where conversions run
// at 1/8 of the fma rate and would dominate. It returns the bits of canon::det_exp for EVERY
// fp32 input; tests/unit/cuda checks that exhaustively on the CPU (CudaBackendHost tests).
//
// Why the bits are the same: on the reduced range |x log2e| < 130, y = fl(x * log2e) is
// rounded to an integer, ties to even, by fl(y + 1.5 * 2^23) (the sum lies in [2^23, 2^24),
// whose ulp is 1, and 1.5 * 2^23 is even), and subtracting 1.5 * 2^23 back is exact: q equals
// rint(y), except that rint gives -0 where this gives +0 (y in (-0.5, -0]). That sign never
// matters: -q * ln2 + x with q = +-0 is x exactly for x != 0 and +-0 for x = +-0, which the
// polynomial maps to 1 either way. The integer q is the difference of the two sums' bit
// patterns (same exponent). Every other operation is canon::det_exp's, in its order.

#include <cstdint>

#include "numerics/canon.hpp"

namespace detlogp::cuda_impl {

DETLOGP_HD float det_exp_shift(float x) {
  using K = canon::ExpConstants;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  if (canon::is_nan(x)) return x;
  if (x > K::kOverflowAbove) return canon::kInf;
  if (x < K::kUnderflowBelow) return 0.0f;
  const float y = x * K::kLog2e;
  const float shifted = y + kShift;  // rounds y to an integer, ties to even
  const float q = shifted - kShift;  // exact
  const auto qi =
      static_cast<int32_t>(canon::bits_of(shifted)) - static_cast<int32_t>(canon::bits_of(kShift));
  return canon::scale_pow2(canon::exp_reduced(x, q), qi);
}

}  // namespace detlogp::cuda_impl
