// The "cuda" platform backend of the registry (docs/cuda.md): VocabParallelLogprob over
// CudaShardKernels, with the canon's full capability. Kept out of builtin_backends.cpp so that
// the core library never needs CUDA; a program linking detlogp::cuda calls
// register_cuda_backend() once (or registers the backend itself).
#include <memory>
#include <stdexcept>
#include <string>

#include "detlogp/cuda.hpp"

namespace detlogp {

BackendCapability cuda_capability() {
  return BackendCapability(
      {.backend_id = std::string(kCudaCanonicalBackendId),
       .roles = {Role::train, Role::infer},
       .dtypes = {DType::bf16, DType::fp16, DType::fp32},
       .supports_vocab_padding = true,
       .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
       .exports_vocab_lse = true,
       .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
       .implementation_kind = ImplementationKind::production,
       .supports_temperature = true});
}

void register_cuda_backend(Registry& registry) {
  const Backend cuda{
      std::string(kCudaCanonicalBackendName), [] {
        std::string why;
        if (cuda_device_count(&why) == 0) {
          throw std::runtime_error("detlogp cuda backend: no CUDA device (" + why + ")");
        }
        return std::make_shared<VocabParallelLogprob>(cuda_kernels(),
                                                      std::string(kCudaCanonicalBackendId));
      }};
  registry.register_logprob_backend(cuda, cuda_capability(), "cuda");
}

}  // namespace detlogp
