#pragma once
// The CUDA kernels' launchers: one per kernel, each in its own .cu file next to its kernel. A job
// is a plain description of one call whose pointers are DEVICE memory; CudaShardKernels
// (cuda_shard_kernels.cpp) checks the arguments, stages the host inputs (staging.hpp), calls a
// launcher and copies the results back. Launchers only enqueue work on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "detlogp/dtype.hpp"
#include "detlogp/numerics.hpp"

namespace detlogp::cuda_impl {

struct NodePartialsJob {
  const void* data;  // element (r, c) at data + (r * row_stride + c) * dtype size
  DType dtype;
  int64_t row_stride;
  int64_t rows;
  int64_t vocab_start;
  int64_t real_vocab;
  int64_t tile_width;
  float temperature;
  bool with_entropy;
  const TreeNode* nodes;
  int64_t num_nodes;
  NodePartial* out;  // [rows][num_nodes]
};
// Blocks of the node kernel: one per row, at most 16 per multiprocessor.
void launch_node_partials(const NodePartialsJob& job, int multiprocessors, cudaStream_t stream);

struct MergeRootsJob {
  const int32_t* ops;  // the root program (numerics/root_program.hpp)
  int64_t num_ops;
  const NodePartial* partials;  // [rows][num_nodes]
  int64_t num_nodes;
  int64_t rows;
  bool with_entropy;
  float* lse;      // [rows]
  float* entropy;  // [rows], written when with_entropy
};
void launch_merge_roots(const MergeRootsJob& job, cudaStream_t stream);

struct BackwardJob {
  const void* data;
  DType dtype;
  int64_t row_stride;
  void* grad;
  int64_t grad_row_stride;
  int64_t rows;
  int64_t cols;
  int64_t real_cols;  // local columns [0, real_cols) are real: min(cols, R - vocab_start)
  float temperature;
  bool has_logp, has_lse, has_entropy;
  const float* lse;  // [rows] each; those not supplied are never read
  const float* entropy;
  const float* grad_logp;
  const float* grad_lse;
  const float* grad_entropy;
  const int64_t* target;
};
void launch_backward(const BackwardJob& job, cudaStream_t stream);

struct ReadTargetsJob {
  const void* data;
  DType dtype;
  int64_t row_stride;
  int64_t rows;
  const int64_t* target;  // [rows]: local column, or -1
  float temperature;
  float* out;  // [rows]
};
void launch_read_targets(const ReadTargetsJob& job, cudaStream_t stream);

}  // namespace detlogp::cuda_impl
