// libFuzzer target: the .npy reader on arbitrary bytes. Every input must parse or be refused
// (fuzz_checks.hpp); whatever parses must survive a write and re-read unchanged.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.hpp"
#include "io/npy.hpp"

constexpr std::string_view kLabel = "fuzz.npy";

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace detlogp::io;
  const auto read = fuzz::parsed(
      kLabel, [&] { return parse_npy(std::as_bytes(std::span(data, size)), kLabel, "x"); });
  if (!read) return 0;
  const Tensor& tensor = *read;
  const std::vector<std::byte> written = serialize_npy(tensor.ref(), kLabel);
  const Tensor again = parse_npy(written, kLabel, "x");
  if (again.dtype != tensor.dtype || again.shape != tensor.shape || again.data != tensor.data) {
    fuzz::finding("round trip", "tensor changed");
  }
  return 0;
}
