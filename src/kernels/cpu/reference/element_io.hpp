#pragma once
// One element of a logits or gradient buffer, read as fp32 or written from fp32, for every
// logit dtype. Widening is exact (canon::bf16_to_float / fp16_to_float); narrowing rounds to
// nearest even and writes canonical NaNs (canon::float_to_bf16 / float_to_fp16 / canonicalize).
// Shared by the scalar reference and by every CPU kernel that needs a scalar path.

#include <cstdint>
#include <cstring>

#include "detlogp/dtype.hpp"
#include "numerics/canon.hpp"

namespace detlogp::cpu {

// Element `index` (in elements, not bytes) of a buffer of `dtype`, widened exactly to fp32.
inline float load_as_float(const void* base, DType dtype, int64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  if (dtype == DType::fp32) {
    float f;
    std::memcpy(&f, bytes + index * 4, sizeof f);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + index * 2, sizeof h);
  return dtype == DType::bf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
}

// Writes `value` narrowed to `dtype` (round to nearest even, canonical NaN) at element `index`.
inline void store_from_float(void* base, DType dtype, int64_t index, float value) {
  auto* bytes = static_cast<unsigned char*>(base);
  if (dtype == DType::fp32) {
    const float f = canon::canonicalize(value);
    std::memcpy(bytes + index * 4, &f, sizeof f);
    return;
  }
  const uint16_t h =
      dtype == DType::bf16 ? canon::float_to_bf16(value) : canon::float_to_fp16(value);
  std::memcpy(bytes + index * 2, &h, sizeof h);
}

}  // namespace detlogp::cpu
