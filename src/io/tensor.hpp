#pragma once
// The io layer's tensor value: a named, dense, row-major, little-endian array of one of seven
// dtypes, as read from or written to .safetensors and .npy files (docs/file-formats.md).
//
// The io layer is used by tools/ only; the library's API takes views (detlogp::LogitsView),
// never file names. as_logits_view() and the to_*_vector() helpers bridge the two, checking the
// dtype and rank and naming the file (the `label`) in every error.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detlogp/dtype.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/views.hpp"

namespace detlogp::io {

enum class TensorDType : std::uint8_t { F32, F16, BF16, I64, I32, BOOL, U8 };

// Bytes per element.
std::size_t itemsize(TensorDType dtype) noexcept;
// "F32", "F16", "BF16", "I64", "I32", "BOOL", "U8" (the safetensors names).
std::string_view dtype_name(TensorDType dtype) noexcept;
std::optional<TensorDType> dtype_from_safetensors_name(std::string_view name) noexcept;
// "<f4", "<f2", "<i8", "<i4", "|b1", "|u1"; nullopt for BF16, which has no standard npy descr.
std::optional<std::string_view> npy_descr(TensorDType dtype) noexcept;
std::optional<TensorDType> dtype_from_npy_descr(std::string_view descr) noexcept;
// The logits storage dtype for F32/F16/BF16; nullopt for the others.
std::optional<DType> logits_dtype(TensorDType dtype) noexcept;
TensorDType tensor_dtype(DType dtype) noexcept;

// Readers reject more dimensions than this (numpy's own limit is 64 in numpy 2, 32 before).
inline constexpr std::size_t kMaxRank = 64;

// Element count and byte size of a shape; nullopt for a negative dimension or when the count or
// the byte size does not fit in int64 (a zero dimension makes the count 0 whatever the others).
std::optional<std::uint64_t> checked_numel(std::span<const std::int64_t> shape) noexcept;
std::optional<std::uint64_t> checked_nbytes(std::span<const std::int64_t> shape,
                                            TensorDType dtype) noexcept;

// "[2, 3]" (safetensors style) for messages.
std::string format_shape(std::span<const std::int64_t> shape);

// A non-owning tensor, what the writers take (so a large output needs no copy).
struct TensorRef {
  std::string_view name;
  TensorDType dtype = TensorDType::F32;
  std::span<const std::int64_t> shape;
  std::span<const std::byte> data;
};

struct Tensor {
  std::string name;
  TensorDType dtype = TensorDType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;  // numel * itemsize bytes, row-major, little-endian

  std::int64_t numel() const;
  TensorRef ref() const { return TensorRef{name, dtype, shape, data}; }
};

// Checks what a writer needs: rank <= kMaxRank, dimensions >= 0, no overflow, and data holding
// exactly numel * itemsize bytes. Throws ContractError "<label>: tensor '<name>': ...".
void check_tensor(const TensorRef& tensor, std::string_view label);

// Builds a tensor from typed values (sizeof(T) must equal the dtype's itemsize; for F16/BF16 pass
// std::uint16_t bit patterns, for BOOL std::uint8_t 0/1). Checks the count against the shape.
template <class T>
Tensor make_tensor(std::string name, TensorDType dtype, std::vector<std::int64_t> shape,
                   std::span<const T> values) {
  if (sizeof(T) != itemsize(dtype)) {
    throw ContractError("make_tensor: element type size does not match dtype " +
                        std::string(dtype_name(dtype)));
  }
  Tensor t{std::move(name), dtype, std::move(shape), {}};
  t.data.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());
  check_tensor(t.ref(), "make_tensor");
  return t;
}

// Views of a 2-D F32/F16/BF16 tensor as logits (row_stride = cols). Anything else throws
// ContractError "<label>: tensor '<name>' ...: expected ...".
LogitsView as_logits_view(const Tensor& tensor, std::string_view label);
MutableLogitsView as_mutable_logits_view(Tensor& tensor, std::string_view label);

// Element values converted for the CLI's other inputs, any rank (flattened row-major):
// I64 or I32 -> int64; BOOL or U8 holding only 0/1 -> uint8 0/1; F32 -> float.
std::vector<std::int64_t> to_int64_vector(const Tensor& tensor, std::string_view label);
std::vector<std::uint8_t> to_mask_vector(const Tensor& tensor, std::string_view label);
std::vector<float> to_float_vector(const Tensor& tensor, std::string_view label);

}  // namespace detlogp::io
