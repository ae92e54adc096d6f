#pragma once
// The fused lm_head in the registry (detlogp/registry.hpp, OpKind::fused_linear): its built-in
// CPU backends and the short call. The caller states its contract; it gets the fused op with a
// truthful capability and a provenance record, or a std::runtime_error listing why each
// candidate was rejected: never a silent fallback to different numerics.
//
//   auto d = detlogp::get_fused_linear_logprob_op(contract);           // best SIMD kernels
//   auto out = d.op->forward(hidden, weight_shard, targets, contract, comm);

#include <string>
#include <string_view>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/registry.hpp"

namespace detlogp {

inline constexpr std::string_view kFusedOpKind = to_string(OpKind::fused_linear);
// The built-in fused backends (platform cpu): the best SIMD kernels (production) and the scalar
// reference kernels (reference); the same bits.
inline constexpr std::string_view kCpuFusedBackendId = "cpu-fused-linear-logp";
inline constexpr std::string_view kCpuFusedReferenceBackendId = "cpu-fused-linear-reference-logp";

// What the fused op serves: every role and dtype, any TP and CP degree, vocab padding, both
// mask modes, LSE export, both determinism scopes (it always runs the canon), any tile width,
// temperature, the softcap, kept sets; the canonical tile tree. The same as the canonical logits
// backends.
BackendCapability fused_linear_logprob_capability(
    ImplementationKind kind = ImplementationKind::production,
    std::string_view backend_id = kCpuFusedBackendId);

// A fused backend over detlogp's CPU dense kernels: `kernel` as for FusedLinearLogprob ("" for
// the best SIMD target, "scalar-reference", or a name from fused_kernel_names()). The factory
// builds the op under `backend_id`; `provides` is fused_linear_logprob_capability().
FusedBackend cpu_fused_backend(std::string name, std::string backend_id, std::string kernel);

// Registry::global().get_fused_linear_logprob_op by kernel: "" dispatches with policy "auto"
// (the production backend first), "scalar-reference" asks for the reference backend
// (kCpuFusedReferenceBackendId), and a SIMD target from fused_kernel_names() gets the
// production backend's capability check and provenance with its op pinned to that target
// (the same bits and backend id). Throws ContractError for an unknown kernel and
// std::runtime_error when no candidate fits the contract.
FusedDispatchResult get_fused_linear_logprob_op(const LogprobContract& contract,
                                                std::string_view kernel = {});

}  // namespace detlogp
