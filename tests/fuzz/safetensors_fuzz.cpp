// libFuzzer target: the .safetensors reader on arbitrary bytes. Every input must parse or be
// refused (fuzz_checks.hpp); whatever parses must survive a write and re-read unchanged.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.hpp"
#include "io/safetensors.hpp"

constexpr std::string_view kLabel = "fuzz.safetensors";

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace detlogp::io;
  const std::optional<SafetensorsContents> read = fuzz::parsed(
      kLabel, [&] { return parse_safetensors(std::as_bytes(std::span(data, size)), kLabel); });
  if (!read) return 0;
  const SafetensorsContents& contents = *read;
  std::vector<TensorRef> refs;
  for (const auto& tensor : contents.tensors) refs.push_back(tensor.ref());
  const std::vector<std::byte> written = serialize_safetensors(refs, contents.metadata, kLabel);
  const SafetensorsContents again = parse_safetensors(written, kLabel);
  if (again.metadata != contents.metadata || again.tensors.size() != contents.tensors.size()) {
    fuzz::finding("round trip", "tensor count or metadata changed");
  }
  for (std::size_t i = 0; i < again.tensors.size(); ++i) {
    const Tensor& a = contents.tensors[i];
    const Tensor& b = again.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.data != b.data) {
      fuzz::finding("round trip", "tensor changed");
    }
  }
  return 0;
}
