// Device and pinned host staging buffers of the CUDA kernels (staging.hpp).
#include "kernels/cuda/staging.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "kernels/cuda/cuda_error.hpp"

namespace detlogp::cuda_impl {

void StagingLayout::throw_order() {
  throw std::logic_error("detlogp cuda staging: inputs are laid out before outputs");
}

Staging::~Staging() {
  if (device_) cudaFree(device_);
  if (host_) cudaFreeHost(host_);
}

void Staging::prepare(const StagingLayout& layout) {
  const size_t bytes = layout.end();
  if (bytes > device_size_) {
    if (device_) check(cudaFree(device_), "cudaFree");
    device_ = nullptr;
    device_size_ = 0;
    check(cudaMalloc(reinterpret_cast<void**>(&device_), bytes), "cudaMalloc (scratch)");
    device_size_ = bytes;
  }
  if (bytes > host_size_) {
    if (host_) check(cudaFreeHost(host_), "cudaFreeHost");
    host_ = nullptr;
    host_size_ = 0;
    check(cudaMallocHost(reinterpret_cast<void**>(&host_), bytes),
          "cudaMallocHost (pinned staging)");
    host_size_ = bytes;
  }
}

void Staging::upload(const StagingLayout& layout, cudaStream_t stream) const {
  if (layout.inputs_end() == 0) return;
  check(cudaMemcpyAsync(device_, host_, layout.inputs_end(), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (inputs)");
}

void Staging::download_bytes(size_t offset, size_t bytes, cudaStream_t stream) const {
  check(cudaMemcpyAsync(host_ + offset, device_ + offset, bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (outputs)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace detlogp::cuda_impl
