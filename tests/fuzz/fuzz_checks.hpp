#pragma once
// What every io fuzz target asks of an input: it parses, or it is refused with a ContractError
// of one line that starts with the input's label. Anything else (a crash, a sanitizer report,
// another exception, an allocation beyond -rss_limit_mb/-malloc_limit_mb) is a finding.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "detlogp/errors.hpp"

namespace fuzz {

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.substr(0, 2000).c_str());
  std::abort();
}

// parse(): what it returns, or nothing when it refused the input as it should.
template <class Parse>
auto parsed(std::string_view label, Parse&& parse) -> std::optional<decltype(parse())> {
  try {
    return parse();
  } catch (const detlogp::ContractError& error) {
    const std::string message = error.what();
    if (message.rfind(std::string(label) + ": ", 0) != 0) finding("unlabelled error", message);
    if (message.find('\n') != std::string::npos) finding("multi-line error", message);
    return std::nullopt;
  }
}

}  // namespace fuzz
