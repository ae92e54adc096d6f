// detlogp's built-in backends and the order they are tried in (docs/dispatch.md), on cpu:
// - logits: the contract candidate list starts as a copy of the legacy batch_invariant_logp list
//   (the single-shard op, whose truthful capability rejects every vocab-parallel contract), then
//   the scalar canonical reference is prepended, then the canonical SIMD backend;
// - fused_linear: the fused op on the best SIMD kernels, then on the scalar reference kernels.
// Production first.

#include "detlogp/fused_dispatch.hpp"
#include "detlogp/registry.hpp"

#include <fmt/format.h>

#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

const std::set<Role> kAllRoles = {Role::train, Role::infer};
const std::set<DType> kAllDtypes = {DType::bf16, DType::fp16, DType::fp32};

BackendCapability batch_invariant_capability(std::string_view id, ImplementationKind kind) {
  return BackendCapability({.backend_id = std::string(id),
                            .roles = kAllRoles,
                            .dtypes = kAllDtypes,
                            .tp_world_sizes = std::vector<int64_t>{1},
                            .cp_world_sizes = std::nullopt,
                            .supports_vocab_padding = false,
                            .mask_modes = {MaskMode::ignore_index},
                            .exports_vocab_lse = false,
                            .determinism_scopes = {DeterminismScope::fixed_topology},
                            .implementation_kind = kind,
                            .supports_temperature = true,
                            // One shard, one left-to-right sum: not the canonical tile tree.
                            .reduction_orders = {ReductionOrder::global_vocab_shard_index}});
}

constexpr std::string_view kCpuKernels[] = {"canonical", "reference", "batch_invariant"};

void check_kernels(std::string_view kernels) {
  for (std::string_view k : kCpuKernels) {
    if (k == kernels) return;
  }
  throw ContractError(
      ErrorCode::invalid_enum, "kernels",
      fmt::format("kernels must be one of: {}; got '{}'", fmt::join(kCpuKernels, ", "), kernels));
}

}  // namespace

BackendCapability canon_capability(std::string_view backend_id, ImplementationKind kind,
                                   bool softcap, bool kept_sets, bool unaligned_bounds) {
  return BackendCapability(
      {.backend_id = std::string(backend_id),
       .roles = kAllRoles,
       .dtypes = kAllDtypes,
       .supports_vocab_padding = true,
       .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
       .exports_vocab_lse = true,
       .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
       .implementation_kind = kind,
       .supports_temperature = true,
       .supports_softcap = softcap,
       .supports_kept_sets = kept_sets,
       .supports_unaligned_bounds = unaligned_bounds});
}

BackendCapability cpu_kernels_capability(std::string_view kernels, std::string_view backend_id,
                                         ImplementationKind kind) {
  check_kernels(kernels);
  if (kernels == "batch_invariant") return batch_invariant_capability(backend_id, kind);
  return canon_capability(backend_id, kind);
}

Backend cpu_backend(std::string name, std::string backend_id, std::string_view kernels) {
  check_kernels(kernels);
  // What the kernels provide (the id and implementation kind are labels, not limits).
  BackendCapability provides = cpu_kernels_capability(
      kernels, fmt::format("cpu-{}-kernels", kernels), ImplementationKind::production);
  if (kernels == "batch_invariant") {
    return Backend{std::move(name),
                   [backend_id] { return std::make_shared<BatchInvariantLogprob>(backend_id); },
                   std::move(provides)};
  }
  const ShardKernels* k = kernels == "canonical" ? &simd_kernels() : &reference_kernels();
  return Backend{std::move(name),
                 [k, backend_id] { return std::make_shared<VocabParallelLogprob>(*k, backend_id); },
                 std::move(provides)};
}

std::unique_ptr<Registry> Registry::with_builtin_backends() {
  auto r = std::make_unique<Registry>();
  const Backend batch_invariant = cpu_backend(
      "CPU_BATCH_INVARIANT_LOGP", std::string(kCpuBatchInvariantBackendId), "batch_invariant");
  const Backend reference = cpu_backend("CPU_REFERENCE_VOCAB_PARALLEL_LOGP",
                                        std::string(kCpuReferenceBackendId), "reference");
  const Backend canonical = cpu_backend("CPU_CANONICAL_VOCAB_PARALLEL_LOGP",
                                        std::string(kCpuCanonicalBackendId), "canonical");
  // Legacy priority list (get_op("batch_invariant_logp")).
  r->register_legacy_backend("batch_invariant_logp", batch_invariant, "cpu");
  // The contract list starts as a copy of it, with the single-shard capability attached...
  r->register_logprob_backend(batch_invariant,
                              cpu_kernels_capability("batch_invariant", kCpuBatchInvariantBackendId,
                                                     ImplementationKind::reference),
                              "cpu");
  // ...then the reference and the production backend go in front.
  r->register_logprob_backend(
      reference,
      cpu_kernels_capability("reference", kCpuReferenceBackendId, ImplementationKind::reference),
      "cpu", /*prepend=*/true);
  r->register_logprob_backend(
      canonical,
      cpu_kernels_capability("canonical", kCpuCanonicalBackendId, ImplementationKind::production),
      "cpu", /*prepend=*/true);
  // The fused lm_head: production (best SIMD target) first, then the scalar reference.
  r->register_fused_backend(
      cpu_fused_backend("CPU_FUSED_LINEAR_LOGP", std::string(kCpuFusedBackendId), ""),
      fused_linear_logprob_capability(ImplementationKind::production, kCpuFusedBackendId), "cpu");
  r->register_fused_backend(
      cpu_fused_backend("CPU_FUSED_LINEAR_REFERENCE_LOGP", std::string(kCpuFusedReferenceBackendId),
                        "scalar-reference"),
      fused_linear_logprob_capability(ImplementationKind::reference, kCpuFusedReferenceBackendId),
      "cpu");
  return r;
}

}  // namespace detlogp
