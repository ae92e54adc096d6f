// libFuzzer target: the .npy reader on arbitrary bytes. Every input must either parse or throw
// ContractError with a one-line message naming the input; whatever parses must survive a write
// and re-read unchanged. Anything else (a crash, a sanitizer report, another exception, an
// allocation beyond -rss_limit_mb/-malloc_limit_mb) is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/errors.hpp"
#include "io/npy.hpp"

namespace {

constexpr std::string_view kLabel = "fuzz.npy";

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace detlogp::io;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  Tensor tensor;
  try {
    tensor = parse_npy(bytes, kLabel, "x");
  } catch (const detlogp::ContractError& error) {
    const std::string message = error.what();
    if (message.rfind(std::string(kLabel) + ": ", 0) != 0) finding("unlabelled error", message);
    if (message.find('\n') != std::string::npos) finding("multi-line error", message);
    return 0;
  }
  const std::vector<std::byte> written = serialize_npy(tensor.ref(), kLabel);
  const Tensor again = parse_npy(written, kLabel, "x");
  if (again.dtype != tensor.dtype || again.shape != tensor.shape || again.data != tensor.data) {
    finding("round trip", "tensor changed");
  }
  return 0;
}
