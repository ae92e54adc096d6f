#include "detlogp/enums.hpp"

#include <string>

#include "detlogp/errors.hpp"

namespace detlogp::detail {
namespace {

std::string allowed(std::string_view field, std::span<const std::string_view> values) {
  std::string message(field);
  message += " must be one of: ";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) {
      message += ", ";
    }
    message += values[i];
  }
  return message;
}

}  // namespace

void throw_bad_enum_string(std::string_view field, std::span<const std::string_view> values,
                           std::string_view got) {
  throw ContractError(ErrorCode::invalid_enum, field,
                      allowed(field, values) + "; got '" + std::string(got) + "'");
}

void throw_bad_enum_value(std::string_view field, std::span<const std::string_view> values,
                          long long raw) {
  throw ContractError(ErrorCode::invalid_enum, field,
                      allowed(field, values) + "; got out-of-range value " + std::to_string(raw));
}

}  // namespace detlogp::detail
