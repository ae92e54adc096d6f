#pragma once
// Test data for the numerics canon: logits buffers of any dtype with a row stride, bit-pattern
// helpers, random and adversarial row generators, and garbage for padding columns. Header-only,
// shared by the reference tests (tests/unit/numerics) and the SIMD tests (tests/unit/kernels).
// Values are generated in fp32 and narrowed with the canon's round-to-nearest-even, so a bf16 or
// fp16 buffer holds exactly the values its exact fp32 upcast (to_fp32) holds.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "detlogp/dtype.hpp"
#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"

namespace detlogp::testing {

// ------------------------------------------------------------------------------------------
// Bits.

// The canon's own bit casts, under the short names the tests use.
inline uint32_t bits(float f) { return canon::bits_of(f); }
inline float from_bits(uint32_t u) { return canon::float_of(u); }
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr uint32_t kCanonicalNan = canon::kCanonicalNanBits;

// ------------------------------------------------------------------------------------------
// A row-major logits (or gradient) buffer of any dtype, element (r, c) at r * row_stride + c.

struct Logits {
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  std::vector<unsigned char> bytes;

  Logits() = default;
  Logits(DType d, int64_t r, int64_t c, int64_t stride = -1)
      : dtype(d), rows(r), cols(c), row_stride(stride < 0 ? c : stride) {
    bytes.assign(static_cast<size_t>(r * row_stride) * dtype_size(d) + 1, 0);  // +1: never empty
  }

  size_t offset(int64_t r, int64_t c) const {
    return static_cast<size_t>(r * row_stride + c) * dtype_size(dtype);
  }
  // Raw bit pattern of an element (16 or 32 bits).
  uint32_t raw(int64_t r, int64_t c) const {
    if (dtype == DType::fp32) {
      uint32_t u;
      std::memcpy(&u, bytes.data() + offset(r, c), 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + offset(r, c), 2);
    return h;
  }
  void set_raw(int64_t r, int64_t c, uint32_t v) {
    if (dtype == DType::fp32) {
      std::memcpy(bytes.data() + offset(r, c), &v, 4);
    } else {
      const auto h = static_cast<uint16_t>(v);
      std::memcpy(bytes.data() + offset(r, c), &h, 2);
    }
  }
  // The element widened exactly to fp32.
  float get(int64_t r, int64_t c) const {
    const uint32_t v = raw(r, c);
    if (dtype == DType::fp32) return from_bits(v);
    return dtype == DType::bf16 ? canon::bf16_to_float(static_cast<uint16_t>(v))
                                : canon::fp16_to_float(static_cast<uint16_t>(v));
  }
  // Stores `f` narrowed to the dtype (round to nearest even; NaN payloads kept in fp32).
  void set(int64_t r, int64_t c, float f) {
    if (dtype == DType::fp32) {
      set_raw(r, c, bits(f));
    } else if (dtype == DType::bf16) {
      set_raw(r, c, canon::float_to_bf16(f));
    } else {
      set_raw(r, c, canon::float_to_fp16(f));
    }
  }

  LogitsView view() const { return view_cols(0, cols); }
  // Columns [col_begin, col_begin + ncols) of every row: a view with row_stride > ncols.
  // (An empty view may start past the last column; its pointer is clamped to the buffer.)
  LogitsView view_cols(int64_t col_begin, int64_t ncols) const {
    const int64_t at = col_begin < cols ? col_begin : cols;
    return LogitsView{bytes.data() + static_cast<size_t>(at) * dtype_size(dtype), dtype, rows,
                      ncols, row_stride};
  }
  MutableLogitsView mutable_view_cols(int64_t col_begin, int64_t ncols) {
    const int64_t at = col_begin < cols ? col_begin : cols;
    return MutableLogitsView{bytes.data() + static_cast<size_t>(at) * dtype_size(dtype), dtype,
                             rows, ncols, row_stride};
  }
  MutableLogitsView mutable_view() { return mutable_view_cols(0, cols); }
};

// The exact fp32 upcast of a buffer (same shape and stride).
inline Logits to_fp32(const Logits& x) {
  Logits y(DType::fp32, x.rows, x.cols, x.row_stride);
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) y.set(r, c, x.get(r, c));
  }
  return y;
}

// A copy of `x` narrowed to `dtype` element by element.
inline Logits convert(const Logits& x, DType dtype, int64_t row_stride = -1) {
  Logits y(dtype, x.rows, x.cols, row_stride < 0 ? x.row_stride : row_stride);
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) y.set(r, c, x.get(r, c));
  }
  return y;
}

// Rows [row_begin, row_begin + n) copied into a new buffer with another row stride.
inline Logits copy_rows(const Logits& x, int64_t row_begin, int64_t n, int64_t row_stride = -1) {
  Logits y(x.dtype, n, x.cols, row_stride < 0 ? x.cols : row_stride);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) y.set_raw(r, c, x.raw(row_begin + r, c));
  }
  return y;
}

// ------------------------------------------------------------------------------------------
// Row generators. Each fills the real columns [0, real) of one row of fp32 values; padding
// columns are filled separately with fill_padding_garbage.

enum class RowKind {
  normal,              // N(0, 3)
  uniform50,           // U(-50, 50)
  wide,                // U(-1e4, 1e4)
  huge_negative,       // mostly N(0, 3), some -1e30, some -1e4
  neg_inf_mixed,       // N(0, 3) with a third of the columns -inf
  only_target_finite,  // -inf everywhere but the target
  ties,                // values from {-1, 0, 2, 2.5}: many exact ties of the maximum
  subnormal,           // +-subnormals and +-0
  signed_zero,         // +0 and -0 only
  neg_zero,            // -0 only
  constant,            // one value everywhere
  all_neg_inf,         // every real column -inf (LSE = -inf)
  one_nan,             // N(0, 3) with one NaN (poisoned: canonical NaN outputs)
  one_pos_inf,         // N(0, 3) with one +inf (poisoned)
  extreme_range,       // finite values near +-3e38 (differences overflow fp32)
  tiny_scale,          // N(0, 1e-3): s close to the column count
  kCount
};

inline std::string row_kind_name(RowKind k) {
  static const char* const names[] = {
      "normal",  "uniform50",   "wide",          "huge_negative", "neg_inf_mixed", "only_target",
      "ties",    "subnormal",   "signed_zero",   "neg_zero",      "constant",      "all_neg_inf",
      "one_nan", "one_pos_inf", "extreme_range", "tiny_scale"};
  return names[static_cast<int>(k)];
}

// True when the canon says the row's LSE and entropy are finite.
inline bool row_kind_is_finite(RowKind k) {
  return k != RowKind::all_neg_inf && k != RowKind::one_nan && k != RowKind::one_pos_inf;
}
inline bool row_kind_is_poisoned(RowKind k) {
  return k == RowKind::one_nan || k == RowKind::one_pos_inf;
}

// Fills row[0, real) with `kind`; `target` (in [0, real)) is the column kept finite where the
// kind needs one.
inline void fill_row(std::span<float> row, RowKind kind, int64_t target, std::mt19937_64& rng) {
  const auto real = static_cast<int64_t>(row.size());
  std::normal_distribution<float> n3(0.0f, 3.0f);
  std::uniform_real_distribution<float> u50(-50.0f, 50.0f);
  std::uniform_real_distribution<float> u1e4(-1e4f, 1e4f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_int_distribution<int64_t> col(0, real > 0 ? real - 1 : 0);
  for (int64_t c = 0; c < real; ++c) {
    float v = 0.0f;
    switch (kind) {
      case RowKind::normal:
        v = n3(rng);
        break;
      case RowKind::uniform50:
        v = u50(rng);
        break;
      case RowKind::wide:
        v = u1e4(rng);
        break;
      case RowKind::huge_negative: {
        const int p = pick(rng);
        v = p < 20 ? -1e30f : p < 30 ? -1e4f : n3(rng);
        break;
      }
      case RowKind::neg_inf_mixed:
        v = pick(rng) < 33 ? -kInf : n3(rng);
        break;
      case RowKind::only_target_finite:
        v = c == target ? n3(rng) : -kInf;
        break;
      case RowKind::ties: {
        static const float kTies[] = {-1.0f, 0.0f, 2.0f, 2.5f};
        v = kTies[pick(rng) % 4];
        break;
      }
      case RowKind::subnormal: {
        const int p = pick(rng);
        const auto mant = static_cast<uint32_t>(rng() & 0x7fffffu);
        v = p < 10 ? (p < 5 ? 0.0f : -0.0f) : from_bits(((p & 1u) << 31) | mant);
        break;
      }
      case RowKind::signed_zero:
        v = pick(rng) < 50 ? 0.0f : -0.0f;
        break;
      case RowKind::neg_zero:
        v = -0.0f;
        break;
      case RowKind::constant:
        v = 1.75f;
        break;
      case RowKind::all_neg_inf:
        v = -kInf;
        break;
      case RowKind::one_nan:
      case RowKind::one_pos_inf:
        v = n3(rng);
        break;
      case RowKind::extreme_range: {
        const int p = pick(rng);
        v = p < 40 ? -3e38f : p < 50 ? 3e38f : p < 60 ? 2.9e38f : n3(rng);
        break;
      }
      case RowKind::tiny_scale:
        v = n3(rng) * 3e-4f;
        break;
      case RowKind::kCount:
        break;
    }
    row[static_cast<size_t>(c)] = v;
  }
  if (real == 0) return;
  if (kind == RowKind::one_nan) row[static_cast<size_t>(col(rng))] = from_bits(0x7fa01234u);
  if (kind == RowKind::one_pos_inf) row[static_cast<size_t>(col(rng))] = kInf;
}

// Padding garbage: large, NaN (with a payload), +-inf, -0, in a repeating pattern.
inline float padding_garbage(int64_t c) {
  static const float kGarbage[] = {1e4f,  from_bits(0x7fc0beefu), kInf, -kInf, 3e38f,
                                   -0.0f, from_bits(0xffc00001u), 88.0f};
  return kGarbage[c % 8];
}

// Fills columns [real, x.cols) of every row with garbage that must never matter.
inline void fill_padding_garbage(Logits& x, int64_t real) {
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = real; c < x.cols; ++c) x.set(r, c, padding_garbage(c));
  }
}

// A [rows, cols] buffer of `dtype` whose real columns [0, real) hold rows of `kinds` (cycled),
// padding columns garbage, and bytes beyond cols in each row (row_stride > cols) garbage too.
// targets[r] is the row's target column in [0, real).
inline Logits make_logits(DType dtype, int64_t rows, int64_t cols, int64_t real,
                          std::span<const RowKind> kinds, std::mt19937_64& rng,
                          std::vector<int64_t>* targets = nullptr, int64_t row_stride = -1) {
  Logits x(dtype, rows, cols, row_stride);
  std::vector<float> row(static_cast<size_t>(real));
  std::uniform_int_distribution<int64_t> col(0, real > 0 ? real - 1 : 0);
  if (targets) targets->assign(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = col(rng);
    if (targets) (*targets)[static_cast<size_t>(r)] = target;
    fill_row(row, kinds[static_cast<size_t>(r) % kinds.size()], target, rng);
    for (int64_t c = 0; c < real; ++c) x.set(r, c, row[static_cast<size_t>(c)]);
    for (int64_t c = real; c < x.row_stride; ++c) x.set(r, c, padding_garbage(c));
  }
  return x;
}

inline std::vector<RowKind> all_row_kinds() {
  std::vector<RowKind> kinds;
  for (int k = 0; k < static_cast<int>(RowKind::kCount); ++k) kinds.push_back(RowKind(k));
  return kinds;
}

}  // namespace detlogp::testing
