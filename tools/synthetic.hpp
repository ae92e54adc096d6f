#pragma once
// Keyed synthetic batches with LLM-like statistics, for `detlogp run` and `detlogp bench`.
//
// Every value is a pure function of (key, row, column), computed with integer hashing and
// IEEE double arithmetic (the logits use no libm), so any block of the matrix can be generated
// on its own (each MPI rank makes just its token slice x vocab shard) with the same bits:
//   - background: N(0, 2^2) (an Irwin-Hall sum of six 21-bit uniforms, scaled);
//   - 3 to 8 large logits per row, uniform in [8, 20], at hashed real columns;
//   - padding columns (>= real) hold +/-30000: a padding leak would dominate the LSE;
//   - tokens come in sequences of min(256, tokens); the first tenth of each is an inactive
//     prompt token (target = ignore_index -100);
//   - active targets: 3 in 4 drawn from the row's distribution (a large-logit column with its
//     softmax weight against the background's expected mass R e^2, else a uniform background
//     column), 1 in 4 uniform over the real vocabulary;
//   - upstream gradients (fp32, exact multiples of 2^-10): grad_logp in [-1, 1], grad_lse in
//     [-1/4, 1/4], grad_entropy in [-1/8, 1/8].

#include <cstddef>
#include <cstdint>
#include <vector>

#include "detlogp/dtype.hpp"

namespace detlogp::cli {

struct SyntheticSpec {
  int64_t tokens = 0;
  int64_t real_vocab = 0;
  DType dtype = DType::bf16;
  uint64_t key = 0;
};

inline constexpr int64_t kIgnoreIndex = -100;
inline constexpr int64_t kMaxSequenceLength = 256;

// The fp32 value (before rounding to the dtype) at (row, col); col may be a padding column.
float synthetic_logit(const SyntheticSpec& spec, int64_t row, int64_t col);
// The value as stored: synthetic_logit rounded to spec.dtype and widened back to fp32.
float synthetic_stored_logit(const SyntheticSpec& spec, int64_t row, int64_t col);

// Writes rows [row_begin, row_end) x columns [col_begin, col_end) in spec.dtype to `out`
// (element (r, c) at out + ((r - row_begin) * row_stride + (c - col_begin)) * dtype_size).
void fill_logits(const SyntheticSpec& spec, int64_t row_begin, int64_t row_end, int64_t col_begin,
                 int64_t col_end, void* out, int64_t row_stride, int threads);

struct SyntheticRows {
  std::vector<int64_t> targets;
  std::vector<bool> active;
  std::vector<float> grad_logp;
  std::vector<float> grad_lse;
  std::vector<float> grad_entropy;
};

// Per-token data of rows [row_begin, row_end).
SyntheticRows synthetic_rows(const SyntheticSpec& spec, int64_t row_begin, int64_t row_end);

// `value` stored in `dtype` at `out` (fp32 as is; bf16 and fp16 rounded to nearest even).
void store(DType dtype, float value, std::byte* out);

// A dense [rows, cols] matrix in `dtype` for `run --fused` (hidden states, an lm_head weight):
// element i = row * cols + col is about N(0, scale^2) (a sum of three 21-bit uniforms), a pure
// function of (salt, i).
std::vector<uint8_t> dense_matrix(DType dtype, int64_t rows, int64_t cols, uint64_t salt,
                                  double scale, int threads);

}  // namespace detlogp::cli
