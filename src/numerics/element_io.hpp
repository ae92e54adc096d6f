#pragma once
// One element of a logits or gradient buffer, read as fp32 or written from fp32, for every
// logit dtype: the one widening (exact: bf16_to_float / fp16_to_float) and one narrowing
// (round to nearest even, canonical NaNs: float_to_bf16 / float_to_fp16 / canon::canonicalize)
// of detlogp/dtype.hpp and the canon. Host and device (the CUDA kernels compile it too); every
// scalar path of every backend, and the tools, read and write elements through it.

#include <cstdint>
#include <cstring>

#include "detlogp/dtype.hpp"
#include "numerics/canon.hpp"

namespace detlogp::numerics {

// A 16-bit pattern of `dtype` widened exactly to fp32, and fp32 narrowed to one (the public
// conversions of detlogp/dtype.hpp, which the canon's are).
using detlogp::narrow_half;
using detlogp::widen_half;

// Element `index` (in elements, not bytes) of a buffer of `dtype`, widened exactly to fp32.
// (Device code reads through typed pointers, one load instruction; host code through memcpy,
// which makes no assumption about the buffer's alignment or declared type.)
template <DType kDType>
DETLOGP_HD float load_as_float(const void* base, int64_t index) {
#if defined(__CUDA_ARCH__)
  if constexpr (kDType == DType::fp32) {
    return static_cast<const float*>(base)[index];
  } else {
    return widen_half(kDType, static_cast<const uint16_t*>(base)[index]);
  }
#else
  const auto* bytes = static_cast<const unsigned char*>(base);
  if constexpr (kDType == DType::fp32) {
    float f;
    std::memcpy(&f, bytes + index * 4, sizeof f);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, bytes + index * 2, sizeof h);
    return widen_half(kDType, h);
  }
#endif
}

// Writes `value` narrowed to `dtype` (round to nearest even, canonical NaN) at element `index`.
template <DType kDType>
DETLOGP_HD void store_from_float(void* base, int64_t index, float value) {
#if defined(__CUDA_ARCH__)
  if constexpr (kDType == DType::fp32) {
    static_cast<float*>(base)[index] = canon::canonicalize(value);
  } else {
    static_cast<uint16_t*>(base)[index] = narrow_half(kDType, value);
  }
#else
  auto* bytes = static_cast<unsigned char*>(base);
  if constexpr (kDType == DType::fp32) {
    const float f = canon::canonicalize(value);
    std::memcpy(bytes + index * 4, &f, sizeof f);
  } else {
    const uint16_t h = narrow_half(kDType, value);
    std::memcpy(bytes + index * 2, &h, sizeof h);
  }
#endif
}

// The same with the dtype known only at run time.
DETLOGP_HD float load_as_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::bf16:
      return load_as_float<DType::bf16>(base, index);
    case DType::fp16:
      return load_as_float<DType::fp16>(base, index);
    case DType::fp32:
      break;
  }
  return load_as_float<DType::fp32>(base, index);
}

DETLOGP_HD void store_from_float(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::bf16:
      return store_from_float<DType::bf16>(base, index, value);
    case DType::fp16:
      return store_from_float<DType::fp16>(base, index, value);
    case DType::fp32:
      break;
  }
  store_from_float<DType::fp32>(base, index, value);
}

}  // namespace detlogp::numerics
