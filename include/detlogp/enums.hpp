#pragma once
// String-valued enums of the logprob contract (docs/contract.md, "Enums").
//
// Every enum prints to and parses from its lowercase value string; parsing is case-sensitive
// and a bad value throws ContractError naming the field and listing the allowed values:
//
//   detlogp::parse_role("train", "role")        -> Role::train
//   detlogp::parse_enum<detlogp::Merge>("lse_average", "merge")
//     throws "merge must be one of: max_sumexp; got 'lse_average'"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "detlogp/dtype.hpp"

namespace detlogp {

enum class Role : std::uint8_t { train, infer };
enum class Merge : std::uint8_t { max_sumexp };
enum class MergeAxis : std::uint8_t { tp_vocab };
// canonical_tile_tree: the numerics canon (fixed tile width, binary tree over tiles; bitwise
// equal across TP degrees). global_vocab_shard_index: the original order (fixed tile count, merge
// in global tile order). Backends declare which orders they implement.
enum class ReductionOrder : std::uint8_t { global_vocab_shard_index, canonical_tile_tree };
enum class Transport : std::uint8_t { all_gather };
enum class DowncastPoint : std::uint8_t { final_write };
enum class Engine : std::uint8_t { in_op_reference };
enum class TPPlacement : std::uint8_t { replicated };
// fixed_topology: bitwise-reproducible at one TP degree. cross_tp_bitwise: additionally
// bitwise equal across TP degrees.
enum class DeterminismScope : std::uint8_t { fixed_topology, cross_tp_bitwise };
enum class MaskMode : std::uint8_t { explicit_active_mask, ignore_index };
// A backend's tier; determinism is a separate axis (DeterminismScope).
enum class ImplementationKind : std::uint8_t { production, reference };

// The value strings of each enum, indexed by the enumerator's underlying value
// (declared with DETLOGP_CONTRACT_ENUM below).
template <typename E>
struct EnumValues;

template <typename E>
concept ContractEnum = std::is_enum_v<E> && requires {
  EnumValues<E>::values;
};

// All value strings of E, in enumerator order.
template <ContractEnum E>
constexpr std::span<const std::string_view> enum_values() noexcept {
  return EnumValues<E>::values;
}

// True when `value` is one of E's enumerators (an out-of-range cast is not).
template <ContractEnum E>
constexpr bool is_valid_enum(E value) noexcept {
  return static_cast<std::size_t>(value) < EnumValues<E>::values.size();
}

// The value string; "<invalid>" for an out-of-range value.
template <ContractEnum E>
constexpr std::string_view to_string(E value) noexcept {
  return is_valid_enum(value) ? EnumValues<E>::values[static_cast<std::size_t>(value)]
                              : std::string_view("<invalid>");
}

namespace detail {
// Throws ContractError("<field> must be one of: v1, v2; got '<got>'").
[[noreturn]] void throw_bad_enum_string(std::string_view field,
                                        std::span<const std::string_view> values,
                                        std::string_view got);
// Throws ContractError("<field> must be one of: v1, v2; got <raw>") for an out-of-range value.
[[noreturn]] void throw_bad_enum_value(std::string_view field,
                                       std::span<const std::string_view> values, long long raw);
}  // namespace detail

// Parses E from its exact (case-sensitive) value string.
template <ContractEnum E>
E parse_enum(std::string_view value, std::string_view field) {
  const auto& values = EnumValues<E>::values;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] == value) {
      return static_cast<E>(i);
    }
  }
  detail::throw_bad_enum_string(field, values, value);
}

// Throws ContractError when `value` is not one of E's enumerators (e.g. static_cast<Role>(7)).
template <ContractEnum E>
void check_enum(E value, std::string_view field) {
  if (!is_valid_enum(value)) {
    detail::throw_bad_enum_value(
        field, EnumValues<E>::values,
        static_cast<long long>(static_cast<std::underlying_type_t<E>>(value)));
  }
}

// Each enum's value strings and its parser, `parse_fn(value, field = default_field)`.
#define DETLOGP_CONTRACT_ENUM(E, parse_fn, default_field, ...)                     \
  template <>                                                                      \
  struct EnumValues<E> {                                                           \
    static constexpr auto values = std::to_array<std::string_view>({__VA_ARGS__}); \
  };                                                                               \
  inline E parse_fn(std::string_view v, std::string_view field = default_field) {  \
    return parse_enum<E>(v, field);                                                \
  }

DETLOGP_CONTRACT_ENUM(Role, parse_role, "role", "train", "infer")
DETLOGP_CONTRACT_ENUM(DType, parse_dtype, "dtype", "bf16", "fp16", "fp32")
DETLOGP_CONTRACT_ENUM(Merge, parse_merge, "merge", "max_sumexp")
DETLOGP_CONTRACT_ENUM(MergeAxis, parse_merge_axis, "merge_axis", "tp_vocab")
DETLOGP_CONTRACT_ENUM(ReductionOrder, parse_reduction_order, "order", "global_vocab_shard_index",
                      "canonical_tile_tree")
DETLOGP_CONTRACT_ENUM(Transport, parse_transport, "transport", "all_gather")
DETLOGP_CONTRACT_ENUM(DowncastPoint, parse_downcast_point, "downcast_at", "final_write")
DETLOGP_CONTRACT_ENUM(Engine, parse_engine, "engine", "in_op_reference")
DETLOGP_CONTRACT_ENUM(TPPlacement, parse_tp_placement, "tp_placement", "replicated")
DETLOGP_CONTRACT_ENUM(DeterminismScope, parse_determinism_scope, "determinism_scope",
                      "fixed_topology", "cross_tp_bitwise")
DETLOGP_CONTRACT_ENUM(MaskMode, parse_mask_mode, "mask_mode", "explicit_active_mask",
                      "ignore_index")
DETLOGP_CONTRACT_ENUM(ImplementationKind, parse_implementation_kind, "implementation_kind",
                      "production", "reference")

#undef DETLOGP_CONTRACT_ENUM

}  // namespace detlogp
