#pragma once
// Internal interface between the Highway per-target kernels (simd_targets.cpp, compiled once per
// SIMD target through hwy/foreach_target.h) and the target-independent driver (simd_kernels.cpp:
// argument checks, threads, the ShardKernels objects).
//
// A job is a plain description of one kernel call; a target's row function computes rows
// [row_begin, row_end) of it. Rows are independent and each row's bits depend only on that row,
// so the driver may split rows across threads in any way.

#include <cstdint>
#include <vector>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"

namespace detlogp::simd {

// The shard a job reads: element (r, c) at data + (r * row_stride + c) * dtype_size.
struct ShardJob {
  const void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t row_stride = 0;
  int64_t cols = 0;
  int64_t vocab_start = 0;
  TileGeometry geometry;
  float temperature = 1.0f;
  float softcap = 0.0f;  // 0: none
};

struct NodePartialsJob : ShardJob {
  const TreeNode* nodes = nullptr;
  int64_t num_nodes = 0;
  bool with_entropy = false;
  NodePartial* out = nullptr;  // out[row * num_nodes + j]
};

struct BackwardJob : ShardJob {
  const float* lse = nullptr;
  const float* entropy = nullptr;         // null unless grad_entropy is given
  const int64_t* target_local = nullptr;  // -1: no target column in this shard
  const float* grad_logp = nullptr;       // null: not supplied
  const float* grad_lse = nullptr;
  const float* grad_entropy = nullptr;
  void* grad = nullptr;  // same dtype as data
  int64_t grad_row_stride = 0;
  bool stream_stores = false;  // non-temporal stores for the gradient (large outputs)

  // Row `row`'s gradient coefficients (a gradient not supplied is absent, not zero).
  canon::GradCoefficients coefficients(int64_t row) const {
    canon::GradCoefficients g{};
    g.has_logp = grad_logp != nullptr;
    g.has_lse = grad_lse != nullptr;
    g.has_entropy = grad_entropy != nullptr;
    g.g_logp = g.has_logp ? grad_logp[row] : 0.0f;
    g.g_lse = g.has_lse ? grad_lse[row] : 0.0f;
    g.g_entropy = g.has_entropy ? grad_entropy[row] : 0.0f;
    return g;
  }
};

using NodePartialsRowsFn = void (*)(const NodePartialsJob& job, int64_t row_begin, int64_t row_end);
using BackwardRowsFn = void (*)(const BackwardJob& job, int64_t row_begin, int64_t row_end);
// y[i] = det_exp(x[i]) with the target's vector det_exp (for tests).
using DetExpArrayFn = void (*)(const float* x, float* y, int64_t n);
// y[i] = det_tanh(x[i]) with the target's vector det_tanh (for tests).
using DetTanhArrayFn = void (*)(const float* x, float* y, int64_t n);

// One compiled SIMD target.
struct TargetOps {
  int64_t target = 0;       // the HWY_* bit
  const char* name = "";    // hwy::TargetName
  bool native_fma = false;  // false: fma emulated per lane with std::fma (correct, slower)
  NodePartialsRowsFn node_partials_rows = nullptr;
  BackwardRowsFn backward_rows = nullptr;
  DetExpArrayFn det_exp_array = nullptr;
  DetTanhArrayFn det_tanh_array = nullptr;
};

// The targets compiled in and supported by this CPU, best first. Read from Highway's dispatch
// tables, without touching Highway's global target choice.
std::vector<TargetOps> supported_target_ops();

}  // namespace detlogp::simd
