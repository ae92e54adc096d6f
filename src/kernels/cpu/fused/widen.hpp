#pragma once
// Exact widening of bf16 / fp16 / fp32 matrix rows to fp32 (the fused kernels run on fp32) and
// the one rounding of fp32 results to an output dtype (round to nearest even, canonical NaN).

#include <cstdint>
#include <cstring>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"

namespace detlogp::fused {

// Row `r` of `m`, columns [0, m.cols), into out.
inline void widen_row(const LogitsView& m, int64_t r, float* out) {
  const auto* base = static_cast<const unsigned char*>(m.data) +
                     static_cast<size_t>(r * m.row_stride) * dtype_size(m.dtype);
  if (m.dtype == DType::fp32) {
    std::memcpy(out, base, static_cast<size_t>(m.cols) * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(base);
  if (m.dtype == DType::bf16) {
    for (int64_t c = 0; c < m.cols; ++c) out[c] = canon::bf16_to_float(h[c]);
  } else {
    for (int64_t c = 0; c < m.cols; ++c) out[c] = canon::fp16_to_float(h[c]);
  }
}

// Writes fp32 values into row `r` of `out` (columns [0, n)), rounded once to out.dtype.
inline void narrow_row(const float* in, int64_t n, const MutableLogitsView& out, int64_t r) {
  auto* base = static_cast<unsigned char*>(out.data) +
               static_cast<size_t>(r * out.row_stride) * dtype_size(out.dtype);
  if (out.dtype == DType::fp32) {
    auto* f = reinterpret_cast<float*>(base);
    for (int64_t c = 0; c < n; ++c) f[c] = canon::canonicalize(in[c]);
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(base);
  if (out.dtype == DType::bf16) {
    for (int64_t c = 0; c < n; ++c) h[c] = canon::float_to_bf16(in[c]);
  } else {
    for (int64_t c = 0; c < n; ++c) h[c] = canon::float_to_fp16(in[c]);
  }
}

// +0 in columns [0, n) of row r.
inline void zero_row(const MutableLogitsView& out, int64_t r, int64_t n) {
  auto* base = static_cast<unsigned char*>(out.data) +
               static_cast<size_t>(r * out.row_stride) * dtype_size(out.dtype);
  std::memset(base, 0, static_cast<size_t>(n) * dtype_size(out.dtype));
}

}  // namespace detlogp::fused
