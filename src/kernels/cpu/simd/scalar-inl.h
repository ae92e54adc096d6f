// The single-lane fallback target (HWY_SCALAR, a CPU without SSE4): the scalar canon itself,
// element by element.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd/simd_kernels.hpp"
#include "numerics/element_io.hpp"

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_SCALAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_SCALAR_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_SCALAR_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_SCALAR_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR

void DetExpArray(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = canon::det_exp(x[i]);
}

void DetTanhArray(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = canon::det_tanh(x[i]);
}

void NodePartialsRows(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  const int64_t W = job.geometry.tile_width;
  const int64_t R = job.geometry.real_vocab;
  const int64_t real_tiles = job.geometry.num_real_tiles();
  std::vector<float> z;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t row_base = row * job.row_stride - job.vocab_start;
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const TreeNode& node = job.nodes[j];
      const int64_t first = node.first_tile();
      const int64_t n = std::min(node.end_tile(), real_tiles) - first;
      std::vector<canon::Partial> level;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t col = (first + i) * W;
        const int64_t count = std::min(W, R - col);
        z.resize(static_cast<size_t>(count));
        for (int64_t k = 0; k < count; ++k) {
          const float x = numerics::load_as_float(job.data, job.dtype, row_base + col + k);
          z[static_cast<size_t>(k)] = canon::scored_logit(x, job.softcap, job.temperature);
        }
        level.push_back(canon::leaf_partial(z.data(), count, job.with_entropy));
      }
      canon::Partial p = canon::identity_partial();
      if (n > 0) {
        int done = 0;
        while (level.size() > 1) {
          std::vector<canon::Partial> next;
          for (size_t i = 0; i < level.size(); i += 2) {
            next.push_back(canon::merge(
                level[i], i + 1 < level.size() ? level[i + 1] : canon::identity_partial(),
                job.with_entropy));
          }
          level.swap(next);
          ++done;
        }
        p = level[0];
        if (done < node.level) p = canon::merge(p, canon::identity_partial(), job.with_entropy);
      }
      job.out[row * job.num_nodes + j] = p;
    }
  }
}

void BackwardRows(const BackwardJob& job, int64_t row_begin, int64_t row_end) {
  const int64_t real_end =
      std::clamp<int64_t>(job.geometry.real_vocab - job.vocab_start, 0, job.cols);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const canon::GradCoefficients g = job.coefficients(row);
    const float lse = job.lse[row];
    const float entropy = job.entropy != nullptr ? job.entropy[row] : 0.0f;
    for (int64_t c = 0; c < job.cols; ++c) {
      float grad = 0.0f;  // padding columns: exactly +0
      if (c < real_end) {
        const float x = numerics::load_as_float(job.data, job.dtype, row * job.row_stride + c);
        grad = canon::grad_of_logit(x, c == job.target_local[row], lse, entropy, g, job.temperature,
                                    job.softcap);
      }
      numerics::store_from_float(job.grad, job.dtype, row * job.grad_row_stride + c, grad);
    }
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
