// The "cuda" platform backend of the registry (detlogp/cuda_registry.hpp).
#include "detlogp/cuda_registry.hpp"

#include <memory>
#include <mutex>
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

void ensure_cuda_backend_registered() {
  static std::once_flag once;
  std::call_once(once, [] { register_cuda_backend(Registry::global()); });
}

}  // namespace detlogp
