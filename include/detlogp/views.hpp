#pragma once
// Views of a row-major matrix in one of detlogp's storage dtypes: how logits, hidden states,
// weights and gradients cross every API (the library never takes file names or owns the
// caller's buffers). Element (r, c) is at data + (r * row_stride + c) * dtype_size(dtype);
// row_stride >= cols (rows may be views into a larger buffer).

#include <cstdint>

#include "detlogp/dtype.hpp"

namespace detlogp {

struct LogitsView {
  const void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements
};

struct MutableLogitsView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements
};

}  // namespace detlogp
