// backward on the device: canon::grad_element per real column, +0 on padding, narrowed by the
// canon's rounding (numerics/element_io.hpp). Each thread writes kVec consecutive columns of one
// row (16-byte loads and stores when everything is 16-byte aligned); the grid's x runs over
// column groups, its y over rows (strided).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::cuda_impl {
namespace {

constexpr int kThreads = 256;

// The canon's coefficients of row r.
__device__ __forceinline__ canon::GradCoefficients coefficients(const BackwardJob& job, int64_t r) {
  canon::GradCoefficients g{};
  g.has_logp = job.has_logp;
  g.has_lse = job.has_lse;
  g.has_entropy = job.has_entropy;
  g.g_logp = job.has_logp ? job.grad_logp[r] : 0.0f;
  g.g_lse = job.has_lse ? job.grad_lse[r] : 0.0f;
  g.g_entropy = job.has_entropy ? job.grad_entropy[r] : 0.0f;
  return g;
}

// The gradient of local column c of row r (+0 on padding columns), from its raw element x.
__device__ __forceinline__ float grad_of(const BackwardJob& job, const canon::GradCoefficients& g,
                                         float lse, float entropy, int64_t target, int64_t c,
                                         float x) {
  if (c >= job.real_cols) return 0.0f;
  const float z = canon::scale_logit(x, job.temperature);
  return canon::grad_element(z, c == target, lse, entropy, g, job.temperature);
}

// kVec columns from c0 through one 16-byte load and store: 4 fp32 or 8 16-bit elements.
template <DType kDT>
__device__ __forceinline__ void grad_vector(const BackwardJob& job,
                                            const canon::GradCoefficients& g, float lse,
                                            float entropy, int64_t target, int64_t r, int64_t c0) {
  constexpr int kSize = kDT == DType::fp32 ? 4 : 2;
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const char*>(job.data) +
                                                    (r * job.row_stride + c0) * kSize);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (kDT == DType::fp32) {
      const float v = grad_of(job, g, lse, entropy, target, c0 + q, canon::float_of(words[q]));
      out[q] = canon::bits_of(canon::canonicalize(v));
    } else {
      uint32_t packed = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const auto h = static_cast<uint16_t>(words[q] >> (16 * half));
        const float v =
            grad_of(job, g, lse, entropy, target, c0 + 2 * q + half, numerics::widen_half(kDT, h));
        packed |= static_cast<uint32_t>(numerics::narrow_half(kDT, v)) << (16 * half);
      }
      out[q] = packed;
    }
  }
  *reinterpret_cast<uint4*>(static_cast<char*>(job.grad) + (r * job.grad_row_stride + c0) * kSize) =
      make_uint4(out[0], out[1], out[2], out[3]);
}

template <DType kDT, bool kAligned>
__global__ void __launch_bounds__(kThreads) backward_kernel(BackwardJob job) {
  constexpr int kVec = kDT == DType::fp32 ? 4 : 8;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c0 >= job.cols) return;
  for (int64_t r = blockIdx.y; r < job.rows; r += gridDim.y) {
    const canon::GradCoefficients g = coefficients(job, r);
    const float lse = job.lse[r];
    const float entropy = job.has_entropy ? job.entropy[r] : 0.0f;
    const int64_t target = job.target[r];
    if (kAligned && c0 + kVec <= job.cols) {
      grad_vector<kDT>(job, g, lse, entropy, target, r, c0);
      continue;
    }
    for (int64_t c = c0; c < c0 + kVec && c < job.cols; ++c) {
      const float x = numerics::load_as_float<kDT>(job.data, r * job.row_stride + c);
      numerics::store_from_float<kDT>(job.grad, r * job.grad_row_stride + c,
                                      grad_of(job, g, lse, entropy, target, c, x));
    }
  }
}

}  // namespace

void launch_backward(const BackwardJob& job, cudaStream_t stream) {
  const int64_t es = job.dtype == DType::fp32 ? 4 : 2;
  const bool aligned = reinterpret_cast<uintptr_t>(job.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(job.grad) % 16 == 0 &&
                       (job.row_stride * es) % 16 == 0 && (job.grad_row_stride * es) % 16 == 0;
  const int64_t vec = job.dtype == DType::fp32 ? 4 : 8;
  const int64_t groups = (job.cols + vec - 1) / vec;
  const dim3 grid(static_cast<unsigned>((groups + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(job.rows, 65535)));
  dispatch_dtype(job.dtype, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    if (aligned) {
      backward_kernel<D, true><<<grid, kThreads, 0, stream>>>(job);
    } else {
      backward_kernel<D, false><<<grid, kThreads, 0, stream>>>(job);
    }
  });
}

}  // namespace detlogp::cuda_impl
