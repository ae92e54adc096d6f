#pragma once
// .npy files (numpy's format, versions 1.0, 2.0 and 3.0; docs/file-formats.md): the magic
// "\x93NUMPY", a major and minor version byte, a 2-byte (1.0) or 4-byte (2.0, 3.0) little-endian
// header length, a Python-literal dict {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by a newline, then the array data.
//
// The header is parsed strictly (exactly those three keys; a string descr among <f4 <f2 <i8 <i4
// |b1 |u1; fortran_order False; a tuple of non-negative integers) and the data must fill the
// rest of the file exactly. Bad input throws ContractError "<label>: <problem>".

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "io/tensor.hpp"

namespace detlogp::io {

// Largest header accepted; numpy's own writer never comes near it.
inline constexpr std::uint64_t kMaxNpyHeaderBytes = 1 << 20;

struct NpyHeader {
  int major = 1;
  int minor = 0;
  TensorDType dtype = TensorDType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t data_offset = 0;  // where the data starts: preamble + header length
  std::uint64_t data_bytes = 0;   // numel * itemsize, equal to total_size - data_offset
};

// In memory. Step 1: from the first bytes (up to 12), the offset where the data starts, checked
// against `total_size`. Step 2: the whole header (the first data_offset bytes) and its checks.
std::uint64_t parse_npy_data_offset(std::span<const std::byte> first_bytes,
                                    std::uint64_t total_size, std::string_view label);
NpyHeader parse_npy_header(std::span<const std::byte> header_bytes, std::uint64_t total_size,
                           std::string_view label);
// A whole file held in memory (the fuzz target's entry point). The tensor is named `name`.
Tensor parse_npy(std::span<const std::byte> bytes, std::string_view label,
                 std::string_view name = {});

// From a file; the tensor is named after the file's stem ("logits" for "dir/logits.npy").
NpyHeader read_npy_header(const std::filesystem::path& path);
Tensor read_npy(const std::filesystem::path& path);

// Writing format 1.0 (2.0 if the header would not fit), the header padded so the data starts at
// a multiple of 64 bytes, exactly as numpy.save. BF16 has no npy descr and is rejected.
std::vector<std::byte> serialize_npy(const TensorRef& tensor, std::string_view label = "npy");
// Atomic: a temp file in the same directory, fsync, rename; nothing is left behind on failure.
void write_npy(const std::filesystem::path& path, const TensorRef& tensor);
class AtomicOutputFile;
// The same bytes into an open output (not committed).
void write_npy_to(AtomicOutputFile& out, const TensorRef& tensor);

}  // namespace detlogp::io
