// Refusing a capability that claims more than the backend's kernels provide.

#include "registry/capability_ceiling.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

[[noreturn]] void over_claim(std::string_view backend, std::string_view field,
                             const std::string& claimed, const std::string& provided) {
  throw ContractError(
      ErrorCode::not_supported, fmt::format("capability.{}", field),
      fmt::format("backend {} declares {}={} but its kernels provide {}={}: a capability must "
                  "not claim more than the kernels compute (dispatch would hand out other "
                  "numerics than the contract asks for); declare {} within {}, or register a "
                  "backend over kernels that provide it",
                  backend, field, claimed, field, provided, field, provided));
}

template <typename E>
std::string show(const std::set<E>& values) {
  std::vector<std::string> names;
  for (E v : values) names.emplace_back(to_string(v));
  return fmt::format("[{}]", fmt::join(names, ", "));
}

std::string show(const std::optional<std::vector<int64_t>>& sizes) {
  return sizes ? fmt::format("[{}]", fmt::join(*sizes, ", ")) : std::string("any");
}

std::string show(bool b) { return b ? "true" : "false"; }

template <typename E>
void check_set(std::string_view backend, std::string_view field, const std::set<E>& claimed,
               const std::set<E>& provided) {
  if (!std::includes(provided.begin(), provided.end(), claimed.begin(), claimed.end())) {
    over_claim(backend, field, show(claimed), show(provided));
  }
}

// nullopt is "any size".
void check_sizes(std::string_view backend, std::string_view field,
                 const std::optional<std::vector<int64_t>>& claimed,
                 const std::optional<std::vector<int64_t>>& provided) {
  if (!provided) return;
  const bool within = claimed && std::all_of(claimed->begin(), claimed->end(), [&](int64_t v) {
                        return std::find(provided->begin(), provided->end(), v) != provided->end();
                      });
  if (!within) over_claim(backend, field, show(claimed), show(provided));
}

void check_flag(std::string_view backend, std::string_view field, bool claimed, bool provided) {
  if (claimed && !provided) over_claim(backend, field, show(claimed), show(provided));
}

}  // namespace

void check_within_provided(std::string_view backend, const BackendCapability& c,
                           const BackendCapability& p) {
  check_set(backend, "roles", c.roles(), p.roles());
  check_set(backend, "dtypes", c.dtypes(), p.dtypes());
  check_sizes(backend, "tp_world_sizes", c.tp_world_sizes(), p.tp_world_sizes());
  check_sizes(backend, "cp_world_sizes", c.cp_world_sizes(), p.cp_world_sizes());
  check_flag(backend, "supports_vocab_padding", c.supports_vocab_padding(),
             p.supports_vocab_padding());
  check_set(backend, "mask_modes", c.mask_modes(), p.mask_modes());
  check_flag(backend, "exports_vocab_lse", c.exports_vocab_lse(), p.exports_vocab_lse());
  check_set(backend, "determinism_scopes", c.determinism_scopes(), p.determinism_scopes());
  check_set(backend, "reduction_orders", c.reduction_orders(), p.reduction_orders());
  check_sizes(backend, "tile_widths", c.tile_widths(), p.tile_widths());
  check_flag(backend, "supports_temperature", c.supports_temperature(), p.supports_temperature());
  check_flag(backend, "supports_softcap", c.supports_softcap(), p.supports_softcap());
  check_flag(backend, "supports_kept_sets", c.supports_kept_sets(), p.supports_kept_sets());
  check_flag(backend, "supports_unaligned_bounds", c.supports_unaligned_bounds(),
             p.supports_unaligned_bounds());
}

}  // namespace detlogp
