// libFuzzer target: the .safetensors reader on arbitrary bytes. Every input must either parse
// or throw ContractError with a one-line message naming the input; whatever parses must survive
// a write and re-read unchanged. Anything else (a crash, a sanitizer report, another exception,
// an allocation beyond -rss_limit_mb/-malloc_limit_mb) is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/errors.hpp"
#include "io/safetensors.hpp"

namespace {

constexpr std::string_view kLabel = "fuzz.safetensors";

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace detlogp::io;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  SafetensorsContents contents;
  try {
    contents = parse_safetensors(bytes, kLabel);
  } catch (const detlogp::ContractError& error) {
    const std::string message = error.what();
    if (message.rfind(std::string(kLabel) + ": ", 0) != 0) finding("unlabelled error", message);
    if (message.find('\n') != std::string::npos) finding("multi-line error", message);
    return 0;
  }
  std::vector<TensorRef> refs;
  for (const auto& tensor : contents.tensors) refs.push_back(tensor.ref());
  const std::vector<std::byte> written = serialize_safetensors(refs, contents.metadata, kLabel);
  const SafetensorsContents again = parse_safetensors(written, kLabel);
  if (again.metadata != contents.metadata || again.tensors.size() != contents.tensors.size()) {
    finding("round trip", "tensor count or metadata changed");
  }
  for (std::size_t i = 0; i < again.tensors.size(); ++i) {
    const Tensor& a = contents.tensors[i];
    const Tensor& b = again.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.data != b.data) {
      finding("round trip", "tensor changed");
    }
  }
  return 0;
}
