#include "kernels/common/top_candidates.hpp"

#include <algorithm>

#include "detlogp/errors.hpp"
#include "kernels/common/validate.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::kernels {

namespace {

void check_out(std::span<const int64_t> counts, int64_t rows, int64_t width,
               std::span<const Candidate> out, const char* kernel) {
  if (static_cast<int64_t>(counts.size()) != rows || width < 0 ||
      static_cast<int64_t>(out.size()) != rows * width) {
    throw ContractError(std::string("detlogp ") + kernel + ": counts has " +
                        std::to_string(counts.size()) + " entries and out " +
                        std::to_string(out.size()) + " for rows = " + std::to_string(rows) +
                        " and width = " + std::to_string(width) +
                        "; expected rows counts and rows * width candidates");
  }
  for (int64_t c : counts) {
    if (c < 0 || c > width) {
      throw ContractError(std::string("detlogp ") + kernel + ": a row asks for " +
                          std::to_string(c) +
                          " candidates, outside [0, width = " + std::to_string(width) + "]");
    }
  }
}

// Row r's ranked pool written at its place in `out`, padded.
void write_row(const std::vector<Candidate>& pool, int64_t r, int64_t width,
               std::span<Candidate> out) {
  Candidate* row = out.data() + r * width;
  std::copy(pool.begin(), pool.end(), row);
  std::fill(row + pool.size(), row + width, Candidate{});
}

}  // namespace

void keep_first(std::vector<Candidate>& pool, std::size_t count) {
  if (pool.size() > count) {
    std::nth_element(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(count), pool.end(),
                     ranks_before);
    pool.resize(count);
  }
  std::sort(pool.begin(), pool.end(), ranks_before);
}

void shard_top_candidates(const LogitsView& shard, const ShardSpec& spec,
                          std::span<const int64_t> counts, int64_t width,
                          std::span<Candidate> out) {
  const char* kernel = "shard_top_candidates";
  validate_shard(shard, spec, kernel);
  check_out(counts, shard.rows, width, out, kernel);
  // Real columns of the shard only: padding is never read.
  const int64_t real_cols =
      std::clamp<int64_t>(spec.geometry.real_vocab - spec.vocab_start, 0, shard.cols);
  std::vector<Candidate> pool;
  for (int64_t r = 0; r < shard.rows; ++r) {
    pool.clear();
    const auto count = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    if (count > 0) {
      pool.reserve(static_cast<std::size_t>(real_cols));
      const float tau = spec.temperature_of(r);
      for (int64_t c = 0; c < real_cols; ++c) {
        const float x = numerics::load_as_float(shard.data, shard.dtype, r * shard.row_stride + c);
        pool.push_back({.id = spec.vocab_start + c,
                        .z = canon::canonicalize(canon::scored_logit(x, spec.softcap, tau))});
      }
      keep_first(pool, count);
    }
    write_row(pool, r, width, out);
  }
}

void fused_top_candidates(const FusedKernels& kernels, const FusedShard& shard,
                          std::span<const int64_t> counts, int64_t width, std::span<Candidate> out,
                          const ExecOptions& exec) {
  const int64_t rows = shard.hidden.rows;
  check_out(counts, rows, width, out, "fused_top_candidates");
  const int64_t real_cols =
      std::clamp<int64_t>(shard.geometry.real_vocab - shard.vocab_start, 0, shard.weight.rows);
  std::vector<std::vector<Candidate>> pools(static_cast<std::size_t>(rows));
  const int64_t wanted = rows > 0 ? *std::max_element(counts.begin(), counts.end()) : 0;
  std::vector<float> logits;
  if (rows > 0 && wanted > 0) {
    logits.resize(static_cast<std::size_t>(rows * std::min(kScanBlock, real_cols)));
  }
  for (int64_t c0 = 0; rows > 0 && wanted > 0 && c0 < real_cols; c0 += kScanBlock) {
    const int64_t n = std::min(kScanBlock, real_cols - c0);
    const LogitsView block{
        .data = static_cast<const char*>(shard.weight.data) +
                c0 * shard.weight.row_stride * static_cast<int64_t>(dtype_size(shard.weight.dtype)),
        .dtype = shard.weight.dtype,
        .rows = n,
        .cols = shard.weight.cols,
        .row_stride = shard.weight.row_stride};
    const MutableLogitsView dst{
        .data = logits.data(), .dtype = DType::fp32, .rows = rows, .cols = n, .row_stride = n};
    kernels.linear_logits(shard.hidden, block, dst, exec);
    for (int64_t r = 0; r < rows; ++r) {
      const auto count = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      if (count == 0) continue;
      std::vector<Candidate>& pool = pools[static_cast<std::size_t>(r)];
      const float tau = shard.temperature_of(r);
      for (int64_t c = 0; c < n; ++c) {
        const float x = logits[static_cast<std::size_t>(r * n + c)];
        pool.push_back({.id = shard.vocab_start + c0 + c,
                        .z = canon::canonicalize(canon::scored_logit(x, shard.softcap, tau))});
      }
      keep_first(pool, count);
    }
  }
  for (int64_t r = 0; r < rows; ++r) write_row(pools[static_cast<std::size_t>(r)], r, width, out);
}

}  // namespace detlogp::kernels
