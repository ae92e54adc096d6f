#include "io/tensor.hpp"

#include <array>
#include <bit>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "io/detail.hpp"

namespace detlogp::io {

static_assert(std::endian::native == std::endian::little,
              "the io layer stores tensors in the files' little-endian byte order");

namespace detail {

std::string printable(std::string_view text, std::size_t max_chars) {
  std::string out;
  for (char ch : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto byte = static_cast<unsigned char>(ch);
    if (byte >= 0x20 && byte < 0x7f) {
      out += ch;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

std::string in_quotes(std::string_view text) {
  // Appended piecewise: "'" + std::string trips a GCC 12 -Wrestrict false positive.
  std::string out(1, '\'');
  out += printable(text);
  out += '\'';
  return out;
}

std::string tensor_named(std::string_view name) {
  return fmt::format("tensor {}", in_quotes(name));
}

std::string in_quotes_list(const std::vector<std::string>& names, std::size_t max_names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max_names; ++i) {
    if (i > 0) out += ", ";
    out += in_quotes(names[i]);
  }
  if (names.size() > max_names) out += fmt::format(" and {} more", names.size() - max_names);
  return out;
}

void fail(std::string_view label, std::string_view message) {
  throw ContractError(fmt::format("{}: {}", printable(label, 4096), printable(message, 2000)));
}

}  // namespace detail

namespace {

struct DTypeInfo {
  TensorDType dtype;
  std::string_view name;
  std::string_view descr;  // empty: no npy descr
  std::size_t size;
};

constexpr std::array<DTypeInfo, 7> kDTypes{{
    {TensorDType::F32, "F32", "<f4", 4},
    {TensorDType::F16, "F16", "<f2", 2},
    {TensorDType::BF16, "BF16", "", 2},
    {TensorDType::I64, "I64", "<i8", 8},
    {TensorDType::I32, "I32", "<i4", 4},
    {TensorDType::BOOL, "BOOL", "|b1", 1},
    {TensorDType::U8, "U8", "|u1", 1},
}};

const DTypeInfo& info(TensorDType dtype) noexcept {
  for (const auto& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDTypes[0];  // unreachable for valid enumerators
}

std::string tensor_prefix(std::string_view name) {
  return fmt::format("tensor {}", detail::in_quotes(name));
}

}  // namespace

std::size_t itemsize(TensorDType dtype) noexcept { return info(dtype).size; }

std::string_view dtype_name(TensorDType dtype) noexcept { return info(dtype).name; }

std::optional<TensorDType> dtype_from_safetensors_name(std::string_view name) noexcept {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> npy_descr(TensorDType dtype) noexcept {
  const auto& entry = info(dtype);
  if (entry.descr.empty()) return std::nullopt;
  return entry.descr;
}

std::optional<TensorDType> dtype_from_npy_descr(std::string_view descr) noexcept {
  if (descr.empty()) return std::nullopt;
  for (const auto& entry : kDTypes) {
    if (entry.descr == descr) return entry.dtype;
  }
  return std::nullopt;
}

namespace {

// The tensor dtypes that hold logits, and the logits dtype of each.
constexpr std::pair<TensorDType, DType> kLogitsDTypes[] = {{TensorDType::F32, DType::fp32},
                                                           {TensorDType::F16, DType::fp16},
                                                           {TensorDType::BF16, DType::bf16}};

}  // namespace

std::optional<DType> logits_dtype(TensorDType dtype) noexcept {
  for (const auto& [tensor, logits] : kLogitsDTypes) {
    if (tensor == dtype) return logits;
  }
  return std::nullopt;
}

TensorDType tensor_dtype(DType dtype) noexcept {
  for (const auto& [tensor, logits] : kLogitsDTypes) {
    if (logits == dtype) return tensor;
  }
  return TensorDType::F32;
}

std::optional<std::uint64_t> checked_numel(std::span<const std::int64_t> shape) noexcept {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  bool has_zero = false;
  for (std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim == 0) has_zero = true;
  }
  if (has_zero) return 0;
  std::uint64_t count = 1;
  for (std::int64_t dim : shape) {
    if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(dim), &count) || count > kMax) {
      return std::nullopt;
    }
  }
  return count;
}

std::optional<std::uint64_t> checked_nbytes(std::span<const std::int64_t> shape,
                                            TensorDType dtype) noexcept {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  const auto count = checked_numel(shape);
  if (!count) return std::nullopt;
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(*count, itemsize(dtype), &bytes) || bytes > kMax) return std::nullopt;
  return bytes;
}

std::string format_shape(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::int64_t Tensor::numel() const {
  const auto count = checked_numel(shape);
  return count ? static_cast<std::int64_t>(*count) : -1;
}

void check_tensor(const TensorRef& tensor, std::string_view label) {
  const std::string who = tensor_prefix(tensor.name);
  if (tensor.shape.size() > kMaxRank) {
    detail::fail(label, fmt::format("{}: rank {} exceeds the limit of {} dimensions", who,
                                    tensor.shape.size(), kMaxRank));
  }
  for (std::int64_t dim : tensor.shape) {
    if (dim < 0) {
      detail::fail(label, fmt::format("{}: shape {} has a negative dimension", who,
                                      format_shape(tensor.shape)));
    }
  }
  const auto bytes = checked_nbytes(tensor.shape, tensor.dtype);
  if (!bytes) {
    detail::fail(label, fmt::format("{}: shape {} of {} overflows 64-bit byte sizes", who,
                                    format_shape(tensor.shape), dtype_name(tensor.dtype)));
  }
  if (*bytes != tensor.data.size()) {
    detail::fail(label, fmt::format("{}: shape {} of {} needs {} bytes but the data holds {}", who,
                                    format_shape(tensor.shape), dtype_name(tensor.dtype), *bytes,
                                    tensor.data.size()));
  }
}

namespace {

template <class View, class Ptr>
View logits_view_of(const Tensor& tensor, Ptr data, std::string_view label) {
  check_tensor(tensor.ref(), label);
  const auto dtype = logits_dtype(tensor.dtype);
  if (!dtype) {
    detail::fail(label, fmt::format("{} has dtype {}; logits must be F32, F16 or BF16",
                                    tensor_prefix(tensor.name), dtype_name(tensor.dtype)));
  }
  if (tensor.shape.size() != 2) {
    detail::fail(label, fmt::format("{} has shape {}; logits must be 2-D [tokens, vocab]",
                                    tensor_prefix(tensor.name), format_shape(tensor.shape)));
  }
  View view;
  view.data = data;
  view.dtype = *dtype;
  view.rows = tensor.shape[0];
  view.cols = tensor.shape[1];
  view.row_stride = tensor.shape[1];
  return view;
}

[[noreturn]] void wrong_dtype(const Tensor& tensor, std::string_view label,
                              std::string_view expected) {
  detail::fail(label, fmt::format("{} has dtype {}; expected {}", tensor_prefix(tensor.name),
                                  dtype_name(tensor.dtype), expected));
}

}  // namespace

LogitsView as_logits_view(const Tensor& tensor, std::string_view label) {
  return logits_view_of<LogitsView>(tensor, static_cast<const void*>(tensor.data.data()), label);
}

MutableLogitsView as_mutable_logits_view(Tensor& tensor, std::string_view label) {
  return logits_view_of<MutableLogitsView>(tensor, static_cast<void*>(tensor.data.data()), label);
}

std::vector<std::int64_t> to_int64_vector(const Tensor& tensor, std::string_view label) {
  check_tensor(tensor.ref(), label);
  const std::size_t n = tensor.data.size() / itemsize(tensor.dtype);
  std::vector<std::int64_t> out(n);
  if (tensor.dtype == TensorDType::I64) {
    if (n > 0) std::memcpy(out.data(), tensor.data.data(), n * sizeof(std::int64_t));
  } else if (tensor.dtype == TensorDType::I32) {
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t value = 0;
      std::memcpy(&value, tensor.data.data() + i * sizeof(value), sizeof(value));
      out[i] = value;
    }
  } else {
    wrong_dtype(tensor, label, "I64 or I32");
  }
  return out;
}

std::vector<std::uint8_t> to_mask_vector(const Tensor& tensor, std::string_view label) {
  check_tensor(tensor.ref(), label);
  if (tensor.dtype != TensorDType::BOOL && tensor.dtype != TensorDType::U8) {
    wrong_dtype(tensor, label, "BOOL or U8");
  }
  std::vector<std::uint8_t> out(tensor.data.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto value = static_cast<std::uint8_t>(tensor.data[i]);
    if (value > 1) {
      detail::fail(label, fmt::format("{}: element {} is {}; a mask holds only 0 and 1",
                                      tensor_prefix(tensor.name), i, value));
    }
    out[i] = value;
  }
  return out;
}

std::vector<float> to_float_vector(const Tensor& tensor, std::string_view label) {
  check_tensor(tensor.ref(), label);
  if (tensor.dtype != TensorDType::F32) wrong_dtype(tensor, label, "F32");
  std::vector<float> out(tensor.data.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), tensor.data.data(), tensor.data.size());
  return out;
}

}  // namespace detlogp::io
