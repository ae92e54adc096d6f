#pragma once
// Contract-aware dispatch (docs/dispatch.md), one registry for every op kind: the logits
// operator (OpKind::logits, a LogprobOp over logits) and the fused lm_head
// (OpKind::fused_linear, a FusedLinearLogprob over hidden states and a weight shard).
//
// A caller states what it needs (a LogprobContract) and gets a backend whose declared
// capability fits it, or a std::runtime_error listing why every candidate was rejected; never a
// silent fallback to different numerics. The provenance says what was asked, what runs and why.
//
//   auto d = detlogp::get_logprob_op(contract);               // policy "auto"
//   auto out = d.op->forward(logits, targets, contract, comm);
//   std::cout << d.provenance_json << "\n";
//
// Policies (case-insensitive): "auto" (first fitting candidate), "production", "reference".
// Anything else is an exact, case-sensitive backend id. "deterministic" is not a policy:
// determinism is requested with ReductionSpec::determinism_scope.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/fused.hpp"
#include "detlogp/operator.hpp"

namespace detlogp {

// Platforms with a candidate list. "cuda" stays empty until a program registers the CUDA
// backend (detlogp::register_cuda_backend, docs/cuda.md); the CLI and Python do.
inline constexpr std::array<std::string_view, 2> kPlatforms = {"cpu", "cuda"};

// What a backend computes from: each kind has its own candidate lists, capabilities and op type;
// registry names are unique across kinds.
enum class OpKind : std::uint8_t {
  logits,        // LogprobOp: the vocab-parallel logprob of a logits shard
  fused_linear,  // FusedLinearLogprob: the same logprob from hidden states and a weight shard
};
inline constexpr std::array<OpKind, 2> kOpKinds = {OpKind::logits, OpKind::fused_linear};

// Its names, "logits" and "fused_linear" (the provenance's op_kind), like the contract's enums
// (detlogp/enums.hpp: to_string, parse_enum).
template <>
struct EnumValues<OpKind> {
  static constexpr auto values = std::to_array<std::string_view>({"logits", "fused_linear"});
};
inline OpKind parse_op_kind(std::string_view v, std::string_view field = "op_kind") {
  return parse_enum<OpKind>(v, field);
}

// A backend as the registry knows it: a stable enum-style name (e.g.
// "CPU_CANONICAL_VOCAB_PARALLEL_LOGP") and a factory of its op. The factory may throw: the
// backend then counts as failed to load, is never retried in this registry, and dispatch moves
// on. The factory runs outside the registry's lock, once per backend: it may call the registry
// (register, introspect, even dispatch); a thread that needs the same backend meanwhile waits
// for it, and a dispatch from inside the factory skips the backend being built.
template <class Op>
struct BasicBackend {
  std::string name;
  std::function<std::shared_ptr<Op>()> create;
  // What the operator behind the factory can serve, when the library knows it (its own CPU
  // operators: cpu_backend, cpu_fused_backend). Registration refuses a capability that claims
  // more.
  std::optional<BackendCapability> provides = std::nullopt;
};
using Backend = BasicBackend<LogprobOp>;                      // OpKind::logits
using FusedBackend = BasicBackend<const FusedLinearLogprob>;  // OpKind::fused_linear

// detlogp's CPU operators, by the kernels they run: "canonical" (VocabParallelLogprob over the
// SIMD kernels), "reference" (over the scalar reference kernels; the same bits) or
// "batch_invariant" (BatchInvariantLogprob, the single-shard op). The factory builds the
// operator under `backend_id`; `provides` is what those kernels serve (cpu_kernels_capability).
// ContractError for another `kernels`.
Backend cpu_backend(std::string name, std::string backend_id, std::string_view kernels);

// Everything the canon offers: every role and dtype, any TP and CP degree, vocab padding, both
// mask modes, LSE export, both determinism scopes, any tile width, temperature, the logit
// softcap when `softcap` (the CPU kernels run it; the CUDA kernels do not, and declare false),
// kept sets when `kept_sets` (likewise);
// the canonical tile tree. What a backend that runs the whole canon declares (the canonical CPU
// backends, the fused lm_head, CUDA).
// Unaligned shard bounds when `unaligned_bounds` (the logits op and the fused lm_head on the CPU
// kernels; not the CUDA kernels).
BackendCapability canon_capability(std::string_view backend_id, ImplementationKind kind,
                                   bool softcap = true, bool kept_sets = true,
                                   bool unaligned_bounds = true);

// What one of those operators serves, as the capability it declares when registered under
// `backend_id` with `kind` (the built-in backends declare exactly this).
BackendCapability cpu_kernels_capability(std::string_view kernels, std::string_view backend_id,
                                         ImplementationKind kind);

// What dispatch hands out: the op and why it was chosen.
template <class Op>
struct BasicDispatchResult {
  std::shared_ptr<Op> op;
  BackendCapability capability;
  std::string requested_backend;  // the stripped request, as given ("auto", "REFERENCE", an id)
  std::string actual_backend;     // capability.backend_id()
  std::string backend_name;       // the backend's registry name
  std::string platform;
  bool fallback = false;  // an earlier policy-eligible candidate was skipped
  std::vector<std::string> prior_rejections;
  std::string provenance_json;  // all of the above + op kind, contract, capability, numerics
                                // version, kernel (SIMD target) actually used
};
using DispatchResult = BasicDispatchResult<LogprobOp>;
using FusedDispatchResult = BasicDispatchResult<const FusedLinearLogprob>;

class Registry {
 public:
  // An empty registry (for tests and embedders who want full control).
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  // A registry holding detlogp's built-in backends (what global() holds).
  static std::unique_ptr<Registry> with_builtin_backends();
  // The process-wide registry. Thread-safe, like every member function.
  static Registry& global();

  // Contract dispatch. Throws ContractError for a bad request (blank, or "deterministic") and
  // std::runtime_error when no candidate fits. A retired backend id (kRetiredBackendIds) is
  // accepted and resolved to its current id.
  DispatchResult get_logprob_op(const LogprobContract& contract,
                                std::string_view requested_backend = "auto",
                                std::string_view platform = "cpu");
  // The same for the fused lm_head: same policies, rejections, fallback and provenance, over
  // the fused candidate list.
  FusedDispatchResult get_fused_linear_logprob_op(const LogprobContract& contract,
                                                  std::string_view requested_backend = "auto",
                                                  std::string_view platform = "cpu");

  // Declares (or replaces) `backend`'s capability on `platform` and adds it to that platform's
  // contract candidate list (at the front with prepend) unless already there: re-registering
  // keeps the position and swaps the capability. Never touches the legacy lists. An empty
  // optional capability throws ContractError "capability must be a BackendCapability"; an
  // unknown platform "unsupported platform"; a capability that claims more than
  // backend.provides (determinism scopes, reduction orders, TP/CP sizes, dtypes, ...)
  // ContractError(not_supported, "capability.<field>") naming what the kernels provide.
  void register_logprob_backend(const Backend& backend,
                                const std::optional<BackendCapability>& capability,
                                std::string_view platform = "cpu", bool prepend = false);
  // The same for a fused lm_head backend (its own candidate list). A name already registered
  // for the other op kind throws ContractError(duplicate, "backend").
  void register_fused_backend(const FusedBackend& backend,
                              const std::optional<BackendCapability>& capability,
                              std::string_view platform = "cpu", bool prepend = false);

  // Adds a backend to a contract candidate list WITHOUT a capability (dispatch then records
  // "no LogprobBackendCapability declared" for it), for contract lists that start as a copy
  // of the legacy priority list.
  void add_contract_candidate(const Backend& backend, std::string_view platform = "cpu");

  // Legacy path: a per-(op type, platform) priority list, first backend that
  // instantiates wins; "No functional backend found for <op> on <platform>" otherwise.
  void register_legacy_backend(std::string_view op_type, const Backend& backend,
                               std::string_view platform = "cpu", bool prepend = false);
  std::shared_ptr<LogprobOp> get_op(std::string_view op_type, std::string_view platform = "cpu");

  // Introspection (copies, for tests and tools).
  std::vector<std::string> contract_candidates(std::string_view platform,
                                               OpKind kind = OpKind::logits) const;
  std::vector<std::string> legacy_priority(std::string_view op_type,
                                           std::string_view platform) const;
  std::optional<BackendCapability> capability(std::string_view platform,
                                              std::string_view backend_name) const;
  bool failed_to_load(std::string_view backend_name) const;

  // Internal: the registry's state, a registered backend of either kind, and its built op.
  struct State;
  struct Entry;
  struct Instance;

 private:
  // The backend's instance: cached, built once (outside the lock), a failure never retried.
  Instance instance(const std::string& name);
  // Contract dispatch over `kind`'s candidates, the one implementation behind
  // get_logprob_op and get_fused_linear_logprob_op.
  template <class Op>
  BasicDispatchResult<Op> dispatch(OpKind kind, const LogprobContract& contract,
                                   std::string_view requested_backend, std::string_view platform);
  void register_backend(OpKind kind, const Entry& entry,
                        const std::optional<BackendCapability>& capability,
                        std::string_view platform, bool prepend);

  std::unique_ptr<State> state_;
  mutable std::mutex mutex_;
};

// Registry::global() shortcuts.
DispatchResult get_logprob_op(const LogprobContract& contract,
                              std::string_view requested_backend = "auto");
void register_logprob_backend(const Backend& backend,
                              const std::optional<BackendCapability>& capability,
                              std::string_view platform = "cpu", bool prepend = false);

// Built-in backend ids.
inline constexpr std::string_view kCpuCanonicalBackendId = "cpu-canonical-vocab-parallel-logp";
inline constexpr std::string_view kCpuReferenceBackendId = "cpu-reference-vocab-parallel-logp";
// The single-shard batch-invariant backend (BatchInvariantLogprob).
inline constexpr std::string_view kCpuBatchInvariantBackendId =
    "cpu-single-shard-batch-invariant-logp";

// Retired backend ids still accepted as requested_backend, each with the id it resolves to.
// Kept for one release after the rename (docs/dispatch.md, "Retired backend ids").
struct RetiredBackendId {
  std::string_view retired;
  std::string_view current;
};
inline constexpr std::array<RetiredBackendId, 1> kRetiredBackendIds = {
    {{"cpu-batch-invariant-logp-ws1", kCpuBatchInvariantBackendId}}};

// The current id for a retired one; any other request unchanged.
std::string_view resolve_retired_backend_id(std::string_view requested_backend);

}  // namespace detlogp
