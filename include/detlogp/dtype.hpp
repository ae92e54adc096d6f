#pragma once
// Storage dtype of logits and gradients, and the one conversion of each 16-bit dtype to and
// from fp32: exact widening, round-to-nearest-even narrowing with one canonical NaN (the
// canon's rule, docs/numerics.md). The canon, every backend's element loads and stores, the
// tools and the Python package all convert through these functions. String conversion lives
// with the other contract enums (detlogp/enums.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

// Host and device: the CUDA kernels compile these same functions.
#if defined(__CUDACC__)
#define DETLOGP_DTYPE_HD __host__ __device__ __forceinline__
#else
#define DETLOGP_DTYPE_HD inline
#endif

namespace detlogp {

enum class DType : std::uint8_t { bf16, fp16, fp32 };

constexpr std::size_t dtype_size(DType d) noexcept { return d == DType::fp32 ? 4 : 2; }

// The one NaN pattern written in each 16-bit dtype (any NaN narrows to it).
inline constexpr std::uint16_t kCanonicalBf16NanBits = 0x7fc0u;
inline constexpr std::uint16_t kCanonicalFp16NanBits = 0x7e00u;

namespace dtype_detail {
DETLOGP_DTYPE_HD std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
DETLOGP_DTYPE_HD float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace dtype_detail

// bf16 -> fp32: exact (the upper half of the fp32 pattern).
DETLOGP_DTYPE_HD float bf16_to_float(std::uint16_t h) {
  return dtype_detail::float_of(static_cast<std::uint32_t>(h) << 16);
}

// fp32 -> bf16: round to nearest, ties to even; overflow gives inf; NaN gives the canonical NaN.
DETLOGP_DTYPE_HD std::uint16_t float_to_bf16(float f) {
  if (f != f) return kCanonicalBf16NanBits;
  const std::uint32_t u = dtype_detail::bits_of(f);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // ties to even; overflow: inf
  return static_cast<std::uint16_t>(rounded >> 16);
}

// fp16 -> fp32: exact (subnormals included).
DETLOGP_DTYPE_HD float fp16_to_float(std::uint16_t h) {
  using dtype_detail::float_of;
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return float_of(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return float_of(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in fp32
  const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;
  return sign ? -mag : mag;
}

// fp32 -> fp16: round to nearest, ties to even; >= 65520 gives inf; NaN gives the canonical NaN.
DETLOGP_DTYPE_HD std::uint16_t float_to_fp16(float f) {
  if (f != f) return kCanonicalFp16NanBits;
  const std::uint32_t u = dtype_detail::bits_of(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself)
  if (abs >= 0x38800000u) {                       // normal fp16 range: >= 2^-14
    const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | static_cast<std::uint16_t>((rounded - (112u << 23)) >> 13);
  }
  // subnormal fp16 (or zero): value / 2^-24 rounded to an integer, ties to even (the default
  // rounding mode). The product is exact (a power of two) and the rounding happens once.
  const float scaled = dtype_detail::float_of(abs) * 16777216.0f;  // 2^24
#if defined(__CUDA_ARCH__)
  return sign | static_cast<std::uint16_t>(rintf(scaled));
#else
  return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
#endif
}

// A 16-bit pattern of `dtype` (bf16 or fp16) widened exactly to fp32.
DETLOGP_DTYPE_HD float widen_half(DType dtype, std::uint16_t h) {
  return dtype == DType::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

// fp32 narrowed to a 16-bit pattern of `dtype` (bf16 or fp16).
DETLOGP_DTYPE_HD std::uint16_t narrow_half(DType dtype, float value) {
  return dtype == DType::bf16 ? float_to_bf16(value) : float_to_fp16(value);
}

}  // namespace detlogp
