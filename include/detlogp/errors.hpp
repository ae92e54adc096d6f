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

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace detlogp {

// What kind of rule a ContractError reports. Stable: values are only ever added.
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

// The code's name, e.g. "out_of_range" (what Python's LogprobContractError.code holds).
constexpr std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::unspecified:
      return "unspecified";
    case ErrorCode::out_of_range:
      return "out_of_range";
    case ErrorCode::invalid_enum:
      return "invalid_enum";
    case ErrorCode::unsupported_value:
      return "unsupported_value";
    case ErrorCode::empty:
      return "empty";
    case ErrorCode::duplicate:
      return "duplicate";
    case ErrorCode::reserved_name:
      return "reserved_name";
    case ErrorCode::conflicting_fields:
      return "conflicting_fields";
    case ErrorCode::bad_shard_bounds:
      return "bad_shard_bounds";
    case ErrorCode::tile_misaligned:
      return "tile_misaligned";
    case ErrorCode::wrong_shape:
      return "wrong_shape";
    case ErrorCode::wrong_dtype:
      return "wrong_dtype";
    case ErrorCode::token_out_of_vocab:
      return "token_out_of_vocab";
    case ErrorCode::communicator_mismatch:
      return "communicator_mismatch";
    case ErrorCode::mode_mismatch:
      return "mode_mismatch";
    case ErrorCode::not_supported:
      return "not_supported";
    case ErrorCode::ranks_disagree:
      return "ranks_disagree";
    case ErrorCode::non_finite_result:
      return "non_finite_result";
    case ErrorCode::unknown_platform:
      return "unknown_platform";
  }
  return "unspecified";
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
