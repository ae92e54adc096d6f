// The "cuda" platform backend of the registry (detlogp/cuda_registry.hpp).
#include "detlogp/cuda_registry.hpp"

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "detlogp/cuda.hpp"

namespace detlogp {

BackendCapability cuda_capability() {
  // The CUDA kernels run the whole canon (docs/cuda.md) but the logit softcap, kept sets and
  // shard bounds that split tiles: a contract with a softcap or such bounds is refused with that
  // reason, never served by a fallback, and a call with kept sets by the operator.
  return canon_capability(kCudaCanonicalBackendId, ImplementationKind::production,
                          /*softcap=*/false, /*kept_sets=*/false, /*unaligned_bounds=*/false);
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
