// Contract dispatch of the fused lm_head (detlogp/fused_dispatch.hpp). Stateless: the op is
// immutable and cheap to build, so there is nothing to register or cache.
#include "detlogp/fused_dispatch.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "detlogp/version.hpp"

namespace detlogp {

BackendCapability fused_linear_logprob_capability(ImplementationKind kind) {
  return BackendCapability(
      {.backend_id = std::string(kCpuFusedBackendId),
       .roles = {Role::train, Role::infer},
       .dtypes = {DType::bf16, DType::fp16, DType::fp32},
       .supports_vocab_padding = true,
       .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
       .exports_vocab_lse = true,
       .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
       .implementation_kind = kind,
       .supports_temperature = true});
}

FusedDispatchResult get_fused_linear_logprob_op(const LogprobContract& contract,
                                                std::string_view kernel) {
  auto op = std::make_shared<const FusedLinearLogprob>(kernel, std::string(kCpuFusedBackendId));
  const bool reference = op->kernel_name() == "scalar-reference";
  BackendCapability cap = fused_linear_logprob_capability(
      reference ? ImplementationKind::reference : ImplementationKind::production);
  const std::vector<std::string> why = cap.incompatibilities(contract);
  if (!why.empty()) {
    std::string all;
    for (const std::string& w : why) all += (all.empty() ? "" : "; ") + w;
    throw std::runtime_error(
        fmt::format("{}: the contract does not fit {}: {}", kFusedOpKind, kCpuFusedBackendId, all));
  }
  nlohmann::json p;
  p["op_kind"] = kFusedOpKind;
  p["actual_backend"] = kCpuFusedBackendId;
  p["kernel"] = op->kernel_name();
  p["numerics_version"] = kNumericsVersion;
  p["capability"] = nlohmann::json::parse(cap.to_json());
  p["contract"] = nlohmann::json::parse(contract.to_json());
  return FusedDispatchResult{std::move(op), std::move(cap), p.dump()};
}

}  // namespace detlogp
