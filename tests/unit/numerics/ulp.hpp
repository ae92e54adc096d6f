#pragma once
// Error of an fp32 result in units in the last place of the fp32 grid at the exact value.
#include <cmath>
#include <cstdint>

namespace detlogp::testing {

// The spacing of fp32 numbers at |ref| (for |ref| in [2^e, 2^(e+1)): 2^(e-23); subnormals 2^-149).
inline double fp32_ulp(double ref) {
  const double a = std::fabs(ref);
  if (a < 0x1p-126) return 0x1p-149;
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

inline double ulp_error(float got, double ref) {
  return std::fabs(static_cast<double>(got) - ref) / fp32_ulp(ref);
}

}  // namespace detlogp::testing
