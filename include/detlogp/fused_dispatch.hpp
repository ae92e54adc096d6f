#pragma once
// Contract dispatch for the fused lm_head: a separate op kind ("fused_linear_logprob") next to
// the logits operator's registry (detlogp/registry.hpp), because its inputs differ (hidden
// states and a weight shard, not logits). The caller states its contract; it gets the fused op
// with a truthful capability and a provenance record, or a std::runtime_error listing why the
// capability does not fit: never a silent fallback to different numerics.
//
//   auto d = detlogp::get_fused_linear_logprob_op(contract);           // best SIMD kernels
//   auto out = d.op->forward(hidden, weight_shard, targets, contract, comm);

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/fused.hpp"

namespace detlogp {

inline constexpr std::string_view kFusedOpKind = "fused_linear_logprob";
inline constexpr std::string_view kCpuFusedBackendId = "cpu-fused-linear-logp";

// What the fused op serves: every role and dtype, any TP and CP degree, vocab padding, both
// mask modes, LSE export, both determinism scopes (it always runs the canon), any tile width,
// temperature; the canonical tile tree.
BackendCapability fused_linear_logprob_capability(
    ImplementationKind kind = ImplementationKind::production);

struct FusedDispatchResult {
  std::shared_ptr<const FusedLinearLogprob> op;
  BackendCapability capability;
  std::string provenance_json;  // op kind, backend, kernels, numerics version, contract
};

// `kernel`: "" (the best SIMD target, a production backend), "scalar-reference" (a reference
// backend) or a name from fused_kernel_names(). Throws ContractError for an unknown kernel and
// std::runtime_error when the contract asks for something the capability does not offer.
FusedDispatchResult get_fused_linear_logprob_op(const LogprobContract& contract,
                                                std::string_view kernel = {});

}  // namespace detlogp
