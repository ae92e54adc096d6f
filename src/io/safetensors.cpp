// .safetensors reading and writing; the header parser is safetensors_header.cpp.

#include "io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/detail.hpp"
#include "io/file.hpp"
#include "memory/memory.hpp"

namespace detlogp::io {
namespace {

using namespace detail;  // fail, in_quotes, tensor_named
using nlohmann::json;

struct WritePlan {
  std::vector<std::byte> header;   // length prefix + padded JSON
  std::vector<std::size_t> order;  // tensor indices in data-buffer order
  std::uint64_t data_bytes = 0;
};

WritePlan plan_write(std::span<const TensorRef> tensors, const Metadata& metadata,
                     std::string_view label) {
  std::set<std::string_view> names;
  for (const auto& tensor : tensors) {
    check_tensor(tensor, label);
    if (tensor.name == kSafetensorsMetadataKey) {
      fail(label, "a tensor cannot be named '__metadata__' (reserved for the metadata)");
    }
    if (!names.insert(tensor.name).second) {
      fail(label, fmt::format("two tensors are named {}", in_quotes(tensor.name)));
    }
  }
  WritePlan plan;
  plan.order.resize(tensors.size());
  std::iota(plan.order.begin(), plan.order.end(), std::size_t{0});
  std::sort(plan.order.begin(), plan.order.end(), [&](std::size_t a, std::size_t b) {
    const auto size_a = itemsize(tensors[a].dtype);
    const auto size_b = itemsize(tensors[b].dtype);
    if (size_a != size_b) return size_a > size_b;
    return tensors[a].name < tensors[b].name;
  });
  json header = json::object();
  if (!metadata.empty()) header[std::string(kSafetensorsMetadataKey)] = metadata;
  for (std::size_t index : plan.order) {
    const auto& tensor = tensors[index];
    const std::uint64_t begin = plan.data_bytes;
    plan.data_bytes += tensor.data.size();
    header[std::string(tensor.name)] = {
        {"dtype", std::string(dtype_name(tensor.dtype))},
        {"shape", std::vector<std::int64_t>(tensor.shape.begin(), tensor.shape.end())},
        {"data_offsets", {begin, plan.data_bytes}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) {
    fail(label, "tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  plan.header.resize(8 + text.size());
  std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) {
    plan.header[i] = static_cast<std::byte>(length & 0xff);
    length >>= 8;
  }
  std::memcpy(plan.header.data() + 8, text.data(), text.size());
  return plan;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::vector<std::string> SafetensorsHeader::names() const {
  std::vector<std::string> out;
  out.reserve(entries.size());
  for (const auto& entry : entries) out.push_back(entry.name);
  return out;
}

const SafetensorsEntry& SafetensorsHeader::select(std::string_view name,
                                                  std::string_view label) const {
  if (!name.empty()) {
    if (const auto* entry = find(name)) return *entry;
  }
  if (entries.size() == 1) return entries.front();
  if (entries.empty()) fail(label, "the file holds no tensors");
  if (!name.empty()) {
    fail(label, fmt::format("no tensor named {}; the file holds {} tensors: {}", in_quotes(name),
                            entries.size(), detail::in_quotes_list(names())));
  }
  fail(label, fmt::format("the file holds {} tensors ({}); say which one to read", entries.size(),
                          detail::in_quotes_list(names())));
}

const Tensor* SafetensorsContents::find(std::string_view name) const {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

SafetensorsContents parse_safetensors(std::span<const std::byte> bytes, std::string_view label) {
  const std::uint64_t length = parse_safetensors_header_length(bytes, bytes.size(), label);
  const std::uint64_t data_start = 8 + length;
  SafetensorsHeader header =
      parse_safetensors_header(bytes.subspan(8, length), bytes.size() - data_start, label);
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  contents.tensors.reserve(header.entries.size());
  for (auto& entry : header.entries) {
    const auto data = bytes.subspan(data_start + entry.begin, entry.end - entry.begin);
    contents.tensors.push_back(Tensor{std::move(entry.name), entry.dtype, std::move(entry.shape),
                                      std::vector<std::byte>(data.begin(), data.end())});
  }
  return contents;
}

namespace {

SafetensorsHeader read_header(const InputFile& file) {
  std::array<std::byte, 8> first{};
  const std::size_t first_size = static_cast<std::size_t>(std::min<std::uint64_t>(8, file.size()));
  file.read_at(0, std::span(first).first(first_size));
  const std::uint64_t length = parse_safetensors_header_length(
      std::span<const std::byte>(first).first(first_size), file.size(), file.label());
  std::vector<std::byte> text(length);  // length <= file size and <= 100 MB: checked above
  file.read_at(8, text);
  SafetensorsHeader header = parse_safetensors_header(text, file.size() - 8 - length, file.label());
  header.data_start = 8 + length;
  return header;
}

Tensor read_entry(const InputFile& file, const SafetensorsHeader& header,
                  const SafetensorsEntry& entry) {
  Tensor tensor{entry.name, entry.dtype, entry.shape, {}};
  // Within the file (checked by the header parser), but a sparse file can claim terabytes.
  const std::uint64_t bytes = entry.end - entry.begin;
  require_memory(
      bytes,
      fmt::format("{}: reading {} of shape {} ({})", file.label(), tensor_named(entry.name),
                  format_shape(entry.shape), dtype_name(entry.dtype)),
      "use a smaller file (fewer tokens per file)");
  tensor.data =
      allocate_bytes(bytes, fmt::format("{}: reading {}", file.label(), tensor_named(entry.name)));
  file.read_at(header.data_start + entry.begin, tensor.data);
  return tensor;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const InputFile file(path);
  return read_header(file);
}

SafetensorsContents read_safetensors(const std::filesystem::path& path) {
  const InputFile file(path);
  SafetensorsHeader header = read_header(file);
  SafetensorsContents contents;
  for (const auto& entry : header.entries)
    contents.tensors.push_back(read_entry(file, header, entry));
  contents.metadata = std::move(header.metadata);
  return contents;
}

Tensor read_safetensors_tensor(const std::filesystem::path& path, std::string_view name) {
  const InputFile file(path);
  const SafetensorsHeader header = read_header(file);
  return read_entry(file, header, header.select(name, file.label()));
}

std::vector<std::byte> serialize_safetensors(std::span<const TensorRef> tensors,
                                             const Metadata& metadata, std::string_view label) {
  const WritePlan plan = plan_write(tensors, metadata, label);
  std::vector<std::byte> out;
  out.reserve(plan.header.size() + plan.data_bytes);
  out.insert(out.end(), plan.header.begin(), plan.header.end());
  for (std::size_t index : plan.order) {
    out.insert(out.end(), tensors[index].data.begin(), tensors[index].data.end());
  }
  return out;
}

void write_safetensors_to(AtomicOutputFile& out, std::span<const TensorRef> tensors,
                          const Metadata& metadata) {
  const WritePlan plan = plan_write(tensors, metadata, out.label());
  out.write(plan.header);
  for (std::size_t index : plan.order) out.write(tensors[index].data);
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                       const Metadata& metadata) {
  plan_write(tensors, metadata, path.string());  // validates before creating anything
  AtomicOutputFile out(path);
  write_safetensors_to(out, tensors, metadata);
  out.commit();
}

void write_safetensors(const std::filesystem::path& path, std::span<const Tensor> tensors,
                       const Metadata& metadata) {
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  for (const auto& tensor : tensors) refs.push_back(tensor.ref());
  write_safetensors(path, refs, metadata);
}

}  // namespace detlogp::io
