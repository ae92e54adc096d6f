#pragma once
// .safetensors files (https://github.com/huggingface/safetensors, format in
// docs/file-formats.md): an 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"<key>": "<string>"}}, then the data buffer.
//
// Every check runs before any allocation sized by the file's claims: N against the file size
// (and a 100 MB cap, as the reference implementation), the JSON's nesting, repeated keys and
// the number of tensors, in one linear pass, then each entry's dtype, shape and
// offsets, with the offsets required to tile the data buffer exactly (no gaps, no overlaps, no
// trailing bytes). Bad input throws ContractError "<label>: <problem>".

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/tensor.hpp"

namespace detlogp::io {

inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// At most this many tensors in one file (docs/file-formats.md): far above any checkpoint shard,
// and it bounds the memory a header can make the reader spend on its entries.
inline constexpr std::size_t kMaxSafetensorsTensors = 250'000;

using Metadata = std::map<std::string, std::string>;
// The header's key of the metadata (no tensor may have this name).
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

struct SafetensorsEntry {
  std::string name;
  TensorDType dtype = TensorDType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets within the data buffer
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by name
  Metadata metadata;
  std::uint64_t data_start = 0;  // 8 + N: file offset of the data buffer

  const SafetensorsEntry* find(std::string_view name) const;
  std::vector<std::string> names() const;
  // The entry to read: the one named `name` if there is one; otherwise the only entry when the
  // file holds exactly one; otherwise ContractError listing the names the file holds.
  const SafetensorsEntry& select(std::string_view name, std::string_view label) const;
};

struct SafetensorsContents {
  std::vector<Tensor> tensors;  // sorted by name
  Metadata metadata;

  const Tensor* find(std::string_view name) const;
};

// In memory. Step 1: the header length from the first 8 bytes, checked against `total_size`
// (the size of the whole file). Step 2: the JSON header, checked against the data buffer size
// (total_size - 8 - N).
std::uint64_t parse_safetensors_header_length(std::span<const std::byte> first_bytes,
                                              std::uint64_t total_size, std::string_view label);
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> json,
                                           std::uint64_t data_buffer_size, std::string_view label);
// A whole file held in memory (the fuzz target's entry point): both steps, then every tensor.
SafetensorsContents parse_safetensors(std::span<const std::byte> bytes, std::string_view label);

// From a file. Only the header and the selected tensor's bytes are read.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);
SafetensorsContents read_safetensors(const std::filesystem::path& path);
// The tensor chosen by SafetensorsHeader::select (`name` may be empty: "the only tensor").
Tensor read_safetensors_tensor(const std::filesystem::path& path, std::string_view name = {});

// Writing: names must be unique and not "__metadata__"; each tensor passes check_tensor. The
// header is compact JSON with keys sorted, padded with spaces to a multiple of 8 bytes; tensor
// data is laid out by descending itemsize, then name, so every tensor is naturally aligned.
std::vector<std::byte> serialize_safetensors(std::span<const TensorRef> tensors,
                                             const Metadata& metadata = {},
                                             std::string_view label = "safetensors");
// Atomic: a temp file in the same directory, fsync, rename; nothing is left behind on failure.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                       const Metadata& metadata = {});
void write_safetensors(const std::filesystem::path& path, std::span<const Tensor> tensors,
                       const Metadata& metadata = {});
class AtomicOutputFile;
// The same bytes into an open output (not committed: the caller commits, e.g. with commit_all).
void write_safetensors_to(AtomicOutputFile& out, std::span<const TensorRef> tensors,
                          const Metadata& metadata = {});

}  // namespace detlogp::io
