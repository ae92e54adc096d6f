// The fused lm_head's built-in CPU backends and the short call by kernel
// (detlogp/fused_dispatch.hpp); dispatch itself is the registry's (registry.cpp).
#include "detlogp/fused_dispatch.hpp"

#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

namespace detlogp {

BackendCapability fused_linear_logprob_capability(ImplementationKind kind,
                                                  std::string_view backend_id) {
  // The fused op computes exactly the canonical logits op's outputs (docs/fused.md), on any
  // shard bounds (tiles split across ranks completed from the fragments' weight rows).
  return canon_capability(backend_id, kind, /*softcap=*/true, /*kept_sets=*/true,
                          /*unaligned_bounds=*/true);
}

FusedBackend cpu_fused_backend(std::string name, std::string backend_id, std::string kernel) {
  return FusedBackend{
      std::move(name),
      [kernel = std::move(kernel), backend_id] {
        return std::make_shared<const FusedLinearLogprob>(kernel, backend_id);
      },
      fused_linear_logprob_capability(ImplementationKind::production, "cpu-fused-kernels")};
}

FusedDispatchResult get_fused_linear_logprob_op(const LogprobContract& contract,
                                                std::string_view kernel) {
  Registry& registry = Registry::global();
  if (kernel.empty()) return registry.get_fused_linear_logprob_op(contract);
  // Built first: an unknown kernel is a ContractError whatever the contract.
  auto pinned = std::make_shared<const FusedLinearLogprob>(kernel, std::string(kCpuFusedBackendId));
  if (pinned->kernel_name() == "scalar-reference") {
    return registry.get_fused_linear_logprob_op(contract, kCpuFusedReferenceBackendId);
  }
  // A SIMD target: the production backend's check and provenance, the op on that target.
  FusedDispatchResult d = registry.get_fused_linear_logprob_op(contract, kCpuFusedBackendId);
  nlohmann::json provenance = nlohmann::json::parse(d.provenance_json);
  provenance["kernel"] = pinned->kernel_name();
  d.provenance_json = provenance.dump();
  d.op = std::move(pinned);
  return d;
}

}  // namespace detlogp
