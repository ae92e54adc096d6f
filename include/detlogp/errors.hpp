#pragma once
// detlogp's error types. Every contract or input violation throws ContractError; failures of
// the environment (a transport, a file system, a missing device) throw std::runtime_error.
// Messages name the field, the bad value and the fix.
//
// A ContractError also carries, as data, what kind of rule was broken (code()) and the field
// it is about (field(), e.g. "tp_world_size"; empty when no single field is to blame), so that
// callers and tests can tell errors apart without parsing the wording (docs/contract.md,
// "Error codes"):
//
//   try { ... } catch (const detlogp::ContractError& e) {
//     if (e.code() == detlogp::ErrorCode::out_of_range && e.field() == "temperature") ...
//   }

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace detlogp {

// What kind of rule a ContractError reports. Stable: values are only ever added, at the end,
// each with its name at the end of kErrorCodeNames.
enum class ErrorCode : std::uint8_t {
  unspecified,            // built from a message alone
  out_of_range,           // a number outside its range: not positive, negative, too large, not
                          // finite, an index not below its size
  invalid_enum,           // not one of the field's allowed values
  unsupported_value,      // a valid value this contract never allows (export_lse=false,
                          // acc_dtype bf16, a non-fp32 output dtype)
  empty,                  // an empty string or list, or a missing value, where one is required
  duplicate,              // a list holds a value twice
  reserved_name,          // a name that is a reserved dispatch policy word
  conflicting_fields,     // fields that disagree with each other (rank >= world size,
                          // padded < real, tile_width vs num_vocab_tiles, ignore_index in the
                          // real vocabulary)
  bad_shard_bounds,       // vocab_shard_bounds is not a contiguous partition of [0, padded)
  tile_misaligned,        // shard bounds not multiples of the tile width (deterministic mode)
  wrong_shape,            // a length, shape or stride that does not match (logits, targets,
                          // mask, gradients)
  wrong_dtype,            // a tensor's dtype differs from the contract's
  token_out_of_vocab,     // a token or target id outside the real vocabulary
  communicator_mismatch,  // the communicator's size or rank differs from the contract's
  mode_mismatch,          // the call's mode or options contradict the contract or the forward
                          // (deterministic=false with cross_tp_bitwise, grad_entropy without
                          // entropy, backward on another operator's result)
  not_supported,          // the backend does not compute what was asked (entropy on the
                          // single-shard op)
  ranks_disagree,         // the cross-rank preflight: ranks disagree, or another rank failed
  non_finite_result,      // validation: a non-finite LSE on an active row
  unknown_platform,       // a registry platform that does not exist
};

// The codes' names, indexed by the enumerator's value (what Python's LogprobContractError.code
// holds).
inline constexpr auto kErrorCodeNames = std::to_array<std::string_view>(
    {"unspecified", "out_of_range", "invalid_enum", "unsupported_value", "empty", "duplicate",
     "reserved_name", "conflicting_fields", "bad_shard_bounds", "tile_misaligned", "wrong_shape",
     "wrong_dtype", "token_out_of_vocab", "communicator_mismatch", "mode_mismatch", "not_supported",
     "ranks_disagree", "non_finite_result", "unknown_platform"});
static_assert(kErrorCodeNames.size() == static_cast<std::size_t>(ErrorCode::unknown_platform) + 1,
              "one name per ErrorCode: a new code appends its name here");

// The code's name, e.g. "out_of_range"; "unspecified" for a value outside the enum.
constexpr std::string_view to_string(ErrorCode code) {
  const auto i = static_cast<std::size_t>(code);
  return i < kErrorCodeNames.size() ? kErrorCodeNames[i] : kErrorCodeNames[0];
}

class ContractError : public std::invalid_argument {
 public:
  // Message only: code() is ErrorCode::unspecified and field() is empty.
  explicit ContractError(const std::string& what)
      : ContractError(ErrorCode::unspecified, {}, what) {}
  // `field`: the contract or argument field the rule is about ("" when none is to blame).
  ContractError(ErrorCode code, std::string_view field, const std::string& what)
      : std::invalid_argument(what),
        code_(code),
        field_(std::make_shared<const std::string>(field)) {}

  ErrorCode code() const noexcept { return code_; }
  const std::string& field() const noexcept { return *field_; }

 private:
  ErrorCode code_;
  std::shared_ptr<const std::string> field_;  // shared: copying an exception never throws
};

}  // namespace detlogp
