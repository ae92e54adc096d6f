#pragma once
// detlogp's error types. Every contract or input violation throws ContractError; failures of
// the environment (a transport, a file system, a missing device) throw std::runtime_error.
// Messages name the field, the bad value and the fix.

#include <stdexcept>
#include <string>

namespace detlogp {

class ContractError : public std::invalid_argument {
 public:
  explicit ContractError(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace detlogp
