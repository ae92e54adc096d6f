#pragma once
// CUDA runtime errors as std::runtime_error (an environment failure, not a contract violation).

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace detlogp::cuda_impl {

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* what) {
  throw std::runtime_error(std::string("detlogp cuda: ") + what + ": " + cudaGetErrorName(err) +
                           " (" + cudaGetErrorString(err) + ")");
}

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw_cuda(err, what);
}

}  // namespace detlogp::cuda_impl
