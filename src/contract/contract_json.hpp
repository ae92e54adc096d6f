#pragma once
// Internal (not installed): the contract layer's JSON for other layers (registry provenance,
// drift reports), and the canonical serialisation the cross-rank fingerprint hashes.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "detlogp/capability.hpp"
#include "detlogp/contract.hpp"

namespace detlogp {

// The provenance of a contract (docs/contract.md "JSON").
nlohmann::json contract_to_json(const LogprobContract& contract);

// The provenance of a capability.
nlohmann::json capability_to_json(const BackendCapability& capability);

// The canonical JSON text of `value`, byte-identical to Python's
//   json.dumps(value, sort_keys=True, separators=(",", ":"))   (ensure_ascii=True)
// keys sorted at every level, no spaces, integers as integers, floating-point numbers in
// Python's repr form (shortest round-trip digits; "1.0", "1e-05", "1e+16"), non-ASCII as \uXXXX.
// Throws ContractError on a NaN or infinite number (not valid JSON).
std::string canonical_json(const nlohmann::json& value);

// Python's repr() of a finite double (shortest round-trip digits, Python's layout).
std::string python_float_repr(double value);

// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

}  // namespace detlogp
