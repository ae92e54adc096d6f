// libFuzzer target: the .safetensors header parser's worst cases. The first input byte picks
// how the rest becomes a header, so that short inputs reach the shapes that used to be slow or
// deep:
//   0  the rest is the header JSON itself;
//   1  many keys: {"k0": B, "k1": B, ...} with a 13-bit count (up to 8191) and body B;
//   2  deep nesting: a 13-bit depth of "[" (or of {"a": when the next byte is '{'), the body,
//      then the closers;
//   3  many metadata keys: {"__metadata__": {"m0": B, "m1": B, ...}}.
// Every header must parse or be refused (fuzz_checks.hpp);
// -timeout (10 s) catches a parse that is no longer linear.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fuzz_checks.hpp"
#include "io/safetensors.hpp"

namespace {

constexpr std::string_view kLabel = "header.safetensors";

std::string build(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return std::string(reinterpret_cast<const char*>(data), size);
  const unsigned mode = data[0] % 4;
  // 13 bits: large enough for the quadratic behaviours to show (libFuzzer's -timeout), small
  // enough for many executions per second under the sanitizers.
  const std::size_t count = (data[1] | (static_cast<std::size_t>(data[2]) << 8)) & 0x1fff;
  const std::string body(reinterpret_cast<const char*>(data + 3), size - 3);
  std::string out;
  switch (mode) {
    case 0:
      return body;
    case 1:
    case 3: {
      const char* prefix = mode == 1 ? "k" : "m";
      out = mode == 1 ? "{" : "{\"__metadata__\":{";
      out.reserve(count * (body.size() + 10));
      for (std::size_t i = 0; i < count; ++i) {
        if (i > 0) out += ',';
        out += '"';
        out += prefix;
        out += std::to_string(i);
        out += "\":";
        out += body;
      }
      out += mode == 1 ? "}" : "}}";
      return out;
    }
    default: {
      const bool objects = !body.empty() && body[0] == '{';
      for (std::size_t i = 0; i < count; ++i) out += objects ? "{\"a\":" : "[";
      out += objects ? body.substr(1) : body;
      for (std::size_t i = 0; i < count; ++i) out += objects ? '}' : ']';
      return out;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string header = build(data, size);
  const std::uint64_t data_buffer_size = size > 0 ? data[size - 1] : 0;
  const auto parsed = fuzz::parsed(kLabel, [&] {
    return detlogp::io::parse_safetensors_header(std::as_bytes(std::span(header)), data_buffer_size,
                                                 kLabel);
  });
  if (parsed && parsed->entries.size() > detlogp::io::kMaxSafetensorsTensors) {
    fuzz::finding("tensor cap", std::to_string(parsed->entries.size()) + " entries");
  }
  return 0;
}
