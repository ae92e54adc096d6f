// BackendCapability: validation, incompatibility reasons, JSON.

#include "detlogp/capability.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <unordered_set>

#include "contract/contract_json.hpp"

namespace detlogp {
namespace {

std::string_view strip(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) {
    return {};
  }
  const auto last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

// nullopt, or a non-empty list of distinct positive integers.
void check_size_list(const std::optional<std::vector<int64_t>>& list, std::string_view field) {
  if (!list) {
    return;
  }
  if (list->empty()) {
    throw ContractError(
        ErrorCode::empty, field,
        fmt::format("{} must not be empty; use std::nullopt (null) for unrestricted", field));
  }
  std::unordered_set<int64_t> seen;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const int64_t v = (*list)[i];
    if (v <= 0) {
      throw ContractError(ErrorCode::out_of_range, field,
                          fmt::format("{}[{}] must be a positive integer; got {}", field, i, v));
    }
    if (!seen.insert(v).second) {
      throw ContractError(ErrorCode::duplicate, field,
                          fmt::format("{} must not contain duplicates; got {} twice", field, v));
    }
  }
}

template <typename E>
void check_enum_set(const std::set<E>& values, std::string_view field) {
  for (E v : values) {
    check_enum(v, field);
  }
}

bool allows(const std::optional<std::vector<int64_t>>& list, int64_t value) {
  return !list || std::find(list->begin(), list->end(), value) != list->end();
}

template <typename E>
nlohmann::json sorted_values(const std::set<E>& values) {
  std::vector<std::string> names;
  names.reserve(values.size());
  for (E v : values) {
    names.emplace_back(to_string(v));
  }
  std::sort(names.begin(), names.end());
  return names;
}

nlohmann::json list_or_null(const std::optional<std::vector<int64_t>>& list) {
  return list ? nlohmann::json(*list) : nlohmann::json(nullptr);
}

std::string float_text(float value) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

}  // namespace

bool is_reserved_dispatch_policy(std::string_view word) {
  const std::string lowered = ascii_lower(strip(word));
  return std::find(kReservedDispatchPolicies.begin(), kReservedDispatchPolicies.end(), lowered) !=
         kReservedDispatchPolicies.end();
}

BackendCapability::BackendCapability(const CapabilityParams& params) : p_(params) {
  p_.backend_id = std::string(strip(params.backend_id));
  if (p_.backend_id.empty()) {
    throw ContractError(ErrorCode::empty, "backend_id", "backend_id must be a non-empty string");
  }
  if (is_reserved_dispatch_policy(p_.backend_id)) {
    throw ContractError(
        ErrorCode::reserved_name, "backend_id",
        fmt::format("backend_id='{}' shadows a reserved dispatch policy keyword", p_.backend_id));
  }
  check_enum_set(p_.roles, "roles");
  check_enum_set(p_.dtypes, "dtypes");
  if (p_.roles.empty() || p_.dtypes.empty()) {
    throw ContractError(ErrorCode::empty, p_.roles.empty() ? "roles" : "dtypes",
                        "backend roles and dtypes must not be empty");
  }
  check_size_list(p_.tp_world_sizes, "tp_world_sizes");
  check_size_list(p_.cp_world_sizes, "cp_world_sizes");
  check_enum_set(p_.mask_modes, "mask_modes");
  check_enum_set(p_.determinism_scopes, "determinism_scopes");
  check_enum(p_.implementation_kind, "implementation_kind");
  check_size_list(p_.tile_widths, "tile_widths");
  check_enum_set(p_.reduction_orders, "reduction_orders");
  if (p_.reduction_orders.empty()) {
    throw ContractError(ErrorCode::empty, "reduction_orders",
                        "reduction_orders must not be empty: a backend implements some order");
  }
}

std::vector<std::string> BackendCapability::incompatibilities(const LogprobContract& c) const {
  std::vector<std::string> reasons;
  const ShardingSpec& s = c.sharding();
  if (!p_.roles.contains(c.role())) {
    reasons.push_back(fmt::format("role={} is unsupported", to_string(c.role())));
  }
  if (!p_.dtypes.contains(c.dtype())) {
    reasons.push_back(fmt::format("dtype={} is unsupported", to_string(c.dtype())));
  }
  if (!allows(p_.tp_world_sizes, s.tp_world_size())) {
    reasons.push_back(fmt::format("TP={} is unsupported", s.tp_world_size()));
  }
  if (!allows(p_.cp_world_sizes, s.cp_world_size())) {
    reasons.push_back(fmt::format("CP={} is unsupported", s.cp_world_size()));
  }
  if (s.padded_vocab_size() != s.real_vocab_size() && !p_.supports_vocab_padding) {
    reasons.emplace_back("padded-vs-real vocab masking is unsupported");
  }
  // Inactive targets need not hold ignore_index, so ignore_index-only backends cannot serve them.
  if (c.mask().active_token_count() < c.mask().num_tokens() &&
      !p_.mask_modes.contains(MaskMode::explicit_active_mask)) {
    reasons.emplace_back("explicit active-token masking is unsupported");
  }
  if (c.export_lse() && !p_.exports_vocab_lse) {
    reasons.emplace_back("vocab-domain LSE export is unsupported");
  }
  const DeterminismScope scope = c.reduction().determinism_scope();
  if (!p_.determinism_scopes.contains(scope)) {
    reasons.push_back(fmt::format("determinism_scope={} is unsupported", to_string(scope)));
  }
  const ReductionOrder order = c.reduction().order();
  if (!p_.reduction_orders.contains(order)) {
    reasons.push_back(fmt::format("order={} is unsupported", to_string(order)));
  }
  if (!allows(p_.tile_widths, c.tile_width())) {
    reasons.push_back(fmt::format("tile_width={} is unsupported", c.tile_width()));
  }
  if (c.temperature() != 1.0f && !p_.supports_temperature) {
    reasons.push_back(fmt::format("temperature={} is unsupported", float_text(c.temperature())));
  }
  if (c.softcap() && !p_.supports_softcap) {
    reasons.push_back(fmt::format("softcap={} is unsupported", float_text(*c.softcap())));
  }
  if (!p_.supports_unaligned_bounds && tile_alignment_problem(c)) {
    reasons.push_back(
        fmt::format("shard bounds not aligned to tile_width={} are unsupported", c.tile_width()));
  }
  return reasons;
}

nlohmann::json capability_to_json(const BackendCapability& cap) {
  return {{"backend_id", cap.backend_id()},
          {"roles", sorted_values(cap.roles())},
          {"dtypes", sorted_values(cap.dtypes())},
          {"tp_world_sizes", list_or_null(cap.tp_world_sizes())},
          {"cp_world_sizes", list_or_null(cap.cp_world_sizes())},
          {"supports_vocab_padding", cap.supports_vocab_padding()},
          {"mask_modes", sorted_values(cap.mask_modes())},
          {"exports_vocab_lse", cap.exports_vocab_lse()},
          {"determinism_scopes", sorted_values(cap.determinism_scopes())},
          {"implementation_kind", to_string(cap.implementation_kind())},
          {"tile_widths", list_or_null(cap.tile_widths())},
          {"supports_temperature", cap.supports_temperature()},
          {"supports_softcap", cap.supports_softcap()},
          {"supports_kept_sets", cap.supports_kept_sets()},
          {"supports_unaligned_bounds", cap.supports_unaligned_bounds()},
          {"reduction_orders", sorted_values(cap.reduction_orders())}};
}

std::string BackendCapability::to_json() const { return canonical_json(capability_to_json(*this)); }

}  // namespace detlogp
