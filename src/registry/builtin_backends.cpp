// detlogp's built-in backends and the order they are tried in (docs/dispatch.md):
// on cpu the contract candidate list starts as a copy of the legacy batch_invariant_logp list
// (the single-shard op, whose truthful capability rejects every vocab-parallel contract), then the
// scalar canonical reference is prepended, then the canonical SIMD backend: production first.

#include "detlogp/registry.hpp"

namespace detlogp {
namespace {

const std::set<Role> kAllRoles = {Role::train, Role::infer};
const std::set<DType> kAllDtypes = {DType::bf16, DType::fp16, DType::fp32};

// Everything the canon offers: any TP and CP, padding, both mask modes, LSE export, both
// determinism scopes, any tile width, temperature.
BackendCapability canonical_capability(std::string_view id, ImplementationKind kind) {
  return BackendCapability(
      {.backend_id = std::string(id),
       .roles = kAllRoles,
       .dtypes = kAllDtypes,
       .supports_vocab_padding = true,
       .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
       .exports_vocab_lse = true,
       .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
       .implementation_kind = kind,
       .supports_temperature = true});
}

BackendCapability batch_invariant_capability() {
  return BackendCapability({.backend_id = std::string(kCpuBatchInvariantBackendId),
                            .roles = kAllRoles,
                            .dtypes = kAllDtypes,
                            .tp_world_sizes = std::vector<int64_t>{1},
                            .cp_world_sizes = std::nullopt,
                            .supports_vocab_padding = false,
                            .mask_modes = {MaskMode::ignore_index},
                            .exports_vocab_lse = false,
                            .determinism_scopes = {DeterminismScope::fixed_topology},
                            .implementation_kind = ImplementationKind::reference,
                            .supports_temperature = true,
                            // One shard, one left-to-right sum: not the canonical tile tree.
                            .reduction_orders = {ReductionOrder::global_vocab_shard_index}});
}

}  // namespace

std::unique_ptr<Registry> Registry::with_builtin_backends() {
  auto r = std::make_unique<Registry>();
  const Backend batch_invariant{
      "CPU_BATCH_INVARIANT_LOGP", [] {
        return std::make_shared<BatchInvariantLogprob>(std::string(kCpuBatchInvariantBackendId));
      }};
  const Backend reference{"CPU_REFERENCE_VOCAB_PARALLEL_LOGP", [] {
                            return std::make_shared<VocabParallelLogprob>(
                                reference_kernels(), std::string(kCpuReferenceBackendId));
                          }};
  const Backend canonical{"CPU_CANONICAL_VOCAB_PARALLEL_LOGP", [] {
                            return std::make_shared<VocabParallelLogprob>(
                                simd_kernels(), std::string(kCpuCanonicalBackendId));
                          }};
  // Legacy priority list (get_op("batch_invariant_logp")).
  r->register_legacy_backend("batch_invariant_logp", batch_invariant, "cpu");
  // The contract list starts as a copy of it, with the single-shard capability attached...
  r->register_logprob_backend(batch_invariant, batch_invariant_capability(), "cpu");
  // ...then the reference and the production backend go in front.
  r->register_logprob_backend(
      reference, canonical_capability(kCpuReferenceBackendId, ImplementationKind::reference), "cpu",
      /*prepend=*/true);
  r->register_logprob_backend(
      canonical, canonical_capability(kCpuCanonicalBackendId, ImplementationKind::production),
      "cpu", /*prepend=*/true);
  return r;
}

}  // namespace detlogp
