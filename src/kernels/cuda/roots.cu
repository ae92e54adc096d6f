// merge_roots on the device: one thread per row runs the root program (numerics/root_program.hpp,
// the same function the CPU kernels run) over the row's node partials and finishes the root.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.hpp"
#include "numerics/canon.hpp"
#include "numerics/root_program.hpp"

namespace detlogp::cuda_impl {
namespace {

constexpr int kThreads = 128;

template <bool kEntropy>
__global__ void merge_roots_kernel(MergeRootsJob job) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= job.rows) return;
  const canon::Partial root =
      numerics::run_root_program<kEntropy>(job.ops, job.num_ops, job.partials + r * job.num_nodes);
  const canon::RootValues v = canon::finish_root(root);
  job.lse[r] = v.lse;
  if (kEntropy) job.entropy[r] = v.entropy;
}

}  // namespace

void launch_merge_roots(const MergeRootsJob& job, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((job.rows + kThreads - 1) / kThreads);
  if (job.with_entropy) {
    merge_roots_kernel<true><<<blocks, kThreads, 0, stream>>>(job);
  } else {
    merge_roots_kernel<false><<<blocks, kThreads, 0, stream>>>(job);
  }
}

}  // namespace detlogp::cuda_impl
