#pragma once
// What a backend can serve (alias LogprobBackendCapability), including tile widths, reduction
// orders and temperature support; docs/contract.md, "Backend capabilities". Declared truthfully by
// each backend; the registry asks incompatibilities(contract) and never falls back silently.
//
//   detlogp::BackendCapability cap({.backend_id = "cpu-canonical",
//                                   .roles = {detlogp::Role::train, detlogp::Role::infer},
//                                   .dtypes = {detlogp::DType::bf16, detlogp::DType::fp32},
//                                   .supports_vocab_padding = true, ...});
//   for (const std::string& why : cap.incompatibilities(contract)) ...

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/contract.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/enums.hpp"

namespace detlogp {

// Dispatch policy words a backend id may not shadow (compared case-insensitively).
inline constexpr std::array<std::string_view, 4> kReservedDispatchPolicies = {
    "auto", "production", "reference", "deterministic"};

// True when `word`, stripped of surrounding whitespace and lowercased, is a reserved policy.
bool is_reserved_dispatch_policy(std::string_view word);

struct CapabilityParams {
  std::string backend_id = {};  // stored stripped of surrounding whitespace
  std::set<Role> roles = {};    // non-empty
  std::set<DType> dtypes = {};  // non-empty
  // nullopt: any degree. Otherwise non-empty, positive, no duplicates.
  std::optional<std::vector<int64_t>> tp_world_sizes = std::nullopt;
  std::optional<std::vector<int64_t>> cp_world_sizes = std::nullopt;
  bool supports_vocab_padding = false;
  std::set<MaskMode> mask_modes = {};
  bool exports_vocab_lse = false;
  std::set<DeterminismScope> determinism_scopes = {};
  ImplementationKind implementation_kind = ImplementationKind::production;
  // detlogp additions.
  // nullopt: any tile width. Otherwise non-empty, positive, no duplicates.
  std::optional<std::vector<int64_t>> tile_widths = std::nullopt;
  bool supports_temperature = false;  // temperature != 1
  bool supports_softcap = false;      // a logit softcap
  // Sampling-replay kept sets (ForwardOptions::kept / FusedOptions::kept): a call option, not a
  // contract field, so incompatibilities() never names it; the operator refuses kept sets on
  // kernels without them (ContractError not_supported, field "kept_ids").
  bool supports_kept_sets = false;
  // Shard bounds that are not multiples of the tile width (tiles split across ranks).
  bool supports_unaligned_bounds = false;
  std::set<ReductionOrder> reduction_orders = {ReductionOrder::canonical_tile_tree};  // non-empty
};

class BackendCapability {
 public:
  // Validates in the field order of docs/contract.md, then tile_widths and reduction_orders.
  explicit BackendCapability(const CapabilityParams& params);

  const std::string& backend_id() const { return p_.backend_id; }
  const std::set<Role>& roles() const { return p_.roles; }
  const std::set<DType>& dtypes() const { return p_.dtypes; }
  const std::optional<std::vector<int64_t>>& tp_world_sizes() const { return p_.tp_world_sizes; }
  const std::optional<std::vector<int64_t>>& cp_world_sizes() const { return p_.cp_world_sizes; }
  bool supports_vocab_padding() const { return p_.supports_vocab_padding; }
  const std::set<MaskMode>& mask_modes() const { return p_.mask_modes; }
  bool exports_vocab_lse() const { return p_.exports_vocab_lse; }
  const std::set<DeterminismScope>& determinism_scopes() const { return p_.determinism_scopes; }
  ImplementationKind implementation_kind() const { return p_.implementation_kind; }
  const std::optional<std::vector<int64_t>>& tile_widths() const { return p_.tile_widths; }
  bool supports_temperature() const { return p_.supports_temperature; }
  bool supports_softcap() const { return p_.supports_softcap; }
  bool supports_kept_sets() const { return p_.supports_kept_sets; }
  bool supports_unaligned_bounds() const { return p_.supports_unaligned_bounds; }
  const std::set<ReductionOrder>& reduction_orders() const { return p_.reduction_orders; }

  // Every reason this backend cannot serve `contract` (empty: it can), in this order:
  //   role=<r> is unsupported; dtype=<d> is unsupported; TP=<n> is unsupported;
  //   CP=<n> is unsupported; padded-vs-real vocab masking is unsupported;
  //   explicit active-token masking is unsupported; vocab-domain LSE export is unsupported;
  //   determinism_scope=<s> is unsupported; order=<o> is unsupported;
  //   tile_width=<W> is unsupported; temperature=<t> is unsupported;
  //   softcap=<c> is unsupported; shard bounds not aligned to tile_width=<W> are unsupported.
  std::vector<std::string> incompatibilities(const LogprobContract& contract) const;
  bool supports(const LogprobContract& contract) const {
    return incompatibilities(contract).empty();
  }

  // Compact JSON with sorted keys; enum sets as sorted value lists, unrestricted lists as null.
  std::string to_json() const;

 private:
  CapabilityParams p_;
};

using LogprobBackendCapability = BackendCapability;

}  // namespace detlogp
