#include "io/tensor_file.hpp"

#include <fmt/format.h>

#include "io/detail.hpp"
#include "io/file.hpp"
#include "io/npy.hpp"

namespace detlogp::io {

TensorFileFormat tensor_file_format(const std::filesystem::path& path) {
  const std::string extension = path.extension().string();
  if (extension == ".safetensors") return TensorFileFormat::safetensors;
  if (extension == ".npy") return TensorFileFormat::npy;
  detail::fail(path.string(),
               extension.empty()
                   ? std::string("no file extension (expected .safetensors or .npy)")
                   : fmt::format("unsupported file extension {} (expected .safetensors or .npy)",
                                 detail::in_quotes(extension)));
}

Tensor read_tensor(const std::filesystem::path& path, std::string_view name) {
  if (tensor_file_format(path) == TensorFileFormat::safetensors) {
    return read_safetensors_tensor(path, name);
  }
  Tensor tensor = read_npy(path);
  if (!name.empty()) tensor.name = std::string(name);
  return tensor;
}

TensorInfo read_tensor_info(const std::filesystem::path& path, std::string_view name) {
  if (tensor_file_format(path) == TensorFileFormat::safetensors) {
    const SafetensorsHeader header = read_safetensors_header(path);
    const SafetensorsEntry& entry = header.select(name, path.string());
    return {entry.dtype, entry.shape, entry.end - entry.begin};
  }
  NpyHeader header = read_npy_header(path);
  return {header.dtype, std::move(header.shape), header.data_bytes};
}

namespace {

// What an .npy output can hold: exactly one tensor, no metadata.
const TensorRef& the_npy_tensor(std::span<const TensorRef> tensors, const Metadata& metadata,
                                std::string_view label) {
  if (tensors.size() != 1) {
    detail::fail(label,
                 fmt::format("an .npy file holds exactly one tensor, got {}", tensors.size()));
  }
  if (!metadata.empty()) detail::fail(label, "an .npy file cannot hold metadata");
  return tensors.front();
}

}  // namespace

void write_tensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                   const Metadata& metadata) {
  if (tensor_file_format(path) == TensorFileFormat::safetensors) {
    write_safetensors(path, tensors, metadata);
    return;
  }
  write_npy(path, the_npy_tensor(tensors, metadata, path.string()));
}

void write_tensors_to(AtomicOutputFile& out, std::span<const TensorRef> tensors,
                      const Metadata& metadata) {
  if (tensor_file_format(out.path()) == TensorFileFormat::safetensors) {
    write_safetensors_to(out, tensors, metadata);
    return;
  }
  write_npy_to(out, the_npy_tensor(tensors, metadata, out.label()));
}

}  // namespace detlogp::io
