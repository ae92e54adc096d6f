// read_target_logits on the device: one thread per row reads z of the row's target column
// (canonical NaN), +0 for rows without a target in this shard.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::cuda_impl {
namespace {

constexpr int kThreads = 128;

template <DType kDT>
__global__ void read_targets_kernel(ReadTargetsJob job) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= job.rows) return;
  const int64_t t = job.target[r];
  if (t < 0) {
    job.out[r] = 0.0f;
    return;
  }
  const float x = numerics::load_as_float<kDT>(job.data, r * job.row_stride + t);
  job.out[r] = canon::canonicalize(canon::scale_logit(x, job.temperature));
}

}  // namespace

void launch_read_targets(const ReadTargetsJob& job, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((job.rows + kThreads - 1) / kThreads);
  dispatch_dtype(job.dtype, [&](auto dt) {
    read_targets_kernel<decltype(dt)::value><<<blocks, kThreads, 0, stream>>>(job);
  });
}

}  // namespace detlogp::cuda_impl
