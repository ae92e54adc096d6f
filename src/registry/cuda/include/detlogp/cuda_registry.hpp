#pragma once
// The "cuda" platform backend of the registry (docs/cuda.md): VocabParallelLogprob over
// CudaShardKernels (detlogp/cuda.hpp), with the canon's full capability. Part of detlogp::cuda;
// kept out of the core registry so that the core library never needs CUDA.

#include <string_view>

#include "detlogp/capability.hpp"
#include "detlogp/cuda.hpp"
#include "detlogp/registry.hpp"

namespace detlogp {

inline constexpr std::string_view kCudaCanonicalBackendId = "cuda-canonical-vocab-parallel-logp";
inline constexpr std::string_view kCudaCanonicalBackendName = "CUDA_CANONICAL_VOCAB_PARALLEL_LOGP";

// The capability the cuda backend declares: the canon's (any TP/CP, padding, both mask modes,
// LSE export, both determinism scopes, any tile width, temperature, bf16/fp16/fp32), production.
BackendCapability cuda_capability();

// Adds the cuda backend (kCudaCanonicalBackendName, id kCudaCanonicalBackendId) to the "cuda"
// platform's contract candidate list of `registry`. Its factory throws where no CUDA device
// exists, so that dispatch there reports it as failed to load instead of handing it out.
void register_cuda_backend(Registry& registry);

// register_cuda_backend(Registry::global()), exactly once per process however often it is
// called (thread-safe): what the command line and the Python package call before dispatching.
void ensure_cuda_backend_registered();

}  // namespace detlogp
