#pragma once
// The CLI's entry points: choose the format by the file's extension (.safetensors or .npy;
// anything else is a ContractError naming the file).

#include <filesystem>
#include <span>
#include <string_view>

#include "io/safetensors.hpp"
#include "io/tensor.hpp"

namespace detlogp::io {

enum class TensorFileFormat { safetensors, npy };

TensorFileFormat tensor_file_format(const std::filesystem::path& path);

// One tensor. .safetensors: the tensor named `name` if the file has one, else the only tensor
// (SafetensorsHeader::select). .npy: the file's array, named `name` (or the file's stem if
// `name` is empty).
Tensor read_tensor(const std::filesystem::path& path, std::string_view name = {});

// What read_tensor(path, name) would return, from the header alone (no data read): for
// checking sizes before anything is allocated.
struct TensorInfo {
  TensorDType dtype = TensorDType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;
};
TensorInfo read_tensor_info(const std::filesystem::path& path, std::string_view name = {});

// Atomic writes. .npy holds exactly one tensor and no metadata.
void write_tensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                   const Metadata& metadata = {});
// The same into an open output, by its path's extension; the caller commits (commit_all() to
// put several outputs in place all or nothing).
class AtomicOutputFile;
void write_tensors_to(AtomicOutputFile& out, std::span<const TensorRef> tensors,
                      const Metadata& metadata = {});

}  // namespace detlogp::io
