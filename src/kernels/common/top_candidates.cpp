#include "kernels/common/top_candidates.hpp"

#include <algorithm>
#include <string>

#include "detlogp/errors.hpp"
#include "kernels/common/validate.hpp"
#include "kernels/common/work_pool.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::kernels {

namespace {

void check_out(std::span<const int64_t> counts, int64_t rows, int64_t width, int64_t real_vocab,
               std::span<const Candidate> out, const char* kernel) {
  const std::string where = std::string("detlogp ") + kernel + ": ";
  if (static_cast<int64_t>(counts.size()) != rows || width < 0 ||
      static_cast<int64_t>(out.size()) != rows * width) {
    throw ContractError(where + "counts has " + std::to_string(counts.size()) +
                        " entries and out " + std::to_string(out.size()) + " for rows = " +
                        std::to_string(rows) + " and width = " + std::to_string(width) +
                        "; expected rows counts and rows * width candidates");
  }
  for (int64_t c : counts) {
    if (c < 0 || c > width) {
      throw ContractError(where + "a row asks for " + std::to_string(c) +
                          " candidates, outside [0, width = " + std::to_string(width) + "]");
    }
  }
  if (real_vocab > kMaxCandidateVocab) {
    throw ContractError(where + "the real vocabulary has " + std::to_string(real_vocab) +
                        " ids; kept sets are recomputed for vocabularies of at most 2^31 ids");
  }
}

// Row r's ranked candidates written at its place in `out`, padded.
void write_row(const std::vector<Candidate>& ranked, int64_t r, int64_t width,
               std::span<Candidate> out) {
  Candidate* row = out.data() + r * width;
  std::copy(ranked.begin(), ranked.end(), row);
  std::fill(row + ranked.size(), row + width, Candidate{});
}

}  // namespace

void TopCandidates::compact() {
  keep_first(pool_, count_);
  bar_ = pool_.back();
  has_bar_ = true;
}

std::vector<Candidate>& TopCandidates::ranked() {
  keep_first(pool_, count_);
  return pool_;
}

void keep_first(std::vector<Candidate>& pool, std::size_t count) {
  if (pool.size() > count) {
    std::nth_element(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(count), pool.end(),
                     ranks_before);
    pool.resize(count);
  }
  std::sort(pool.begin(), pool.end(), ranks_before);
}

void shard_top_candidates(const LogitsView& shard, const ShardSpec& spec,
                          std::span<const int64_t> counts, int64_t width, std::span<Candidate> out,
                          const ExecOptions& exec) {
  const char* kernel = "shard_top_candidates";
  validate_shard(shard, spec, kernel);
  check_out(counts, shard.rows, width, spec.geometry.real_vocab, out, kernel);
  // Real columns of the shard only: padding is never read.
  const int64_t real_cols =
      std::clamp<int64_t>(spec.geometry.real_vocab - spec.vocab_start, 0, shard.cols);
  const int threads = resolve_threads(exec.threads, shard.rows);
  run_items(shard.rows, threads, [&](int64_t r, int /*worker*/) {
    TopCandidates top(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    const float tau = spec.temperature_of(r);
    for (int64_t c = 0; counts[static_cast<std::size_t>(r)] > 0 && c < real_cols; ++c) {
      const float x = numerics::load_as_float(shard.data, shard.dtype, r * shard.row_stride + c);
      top.offer({.id = static_cast<int32_t>(spec.vocab_start + c),
                 .z = canon::canonicalize(canon::scored_logit(x, spec.softcap, tau))});
    }
    write_row(top.ranked(), r, width, out);
  });
}

void fused_top_candidates(const FusedKernels& kernels, const FusedShard& shard,
                          std::span<const int64_t> counts, int64_t width, std::span<Candidate> out,
                          const ExecOptions& exec) {
  const int64_t rows = shard.hidden.rows;
  check_out(counts, rows, width, shard.geometry.real_vocab, out, "fused_top_candidates");
  const int64_t real_cols =
      std::clamp<int64_t>(shard.geometry.real_vocab - shard.vocab_start, 0, shard.weight.rows);
  std::vector<TopCandidates> tops;
  tops.reserve(static_cast<std::size_t>(rows));
  for (int64_t count : counts) tops.emplace_back(static_cast<std::size_t>(count));
  const bool any = std::any_of(counts.begin(), counts.end(), [](int64_t c) { return c > 0; });
  std::vector<float> logits;
  if (any) logits.resize(static_cast<std::size_t>(rows * std::min(kScanBlock, real_cols)));
  const int threads = resolve_threads(exec.threads, rows);
  for (int64_t c0 = 0; any && c0 < real_cols; c0 += kScanBlock) {
    const int64_t n = std::min(kScanBlock, real_cols - c0);
    const auto esz = static_cast<int64_t>(dtype_size(shard.weight.dtype));
    const LogitsView block{
        .data = static_cast<const char*>(shard.weight.data) + c0 * shard.weight.row_stride * esz,
        .dtype = shard.weight.dtype,
        .rows = n,
        .cols = shard.weight.cols,
        .row_stride = shard.weight.row_stride};
    const MutableLogitsView dst{
        .data = logits.data(), .dtype = DType::fp32, .rows = rows, .cols = n, .row_stride = n};
    kernels.linear_logits(shard.hidden, block, dst, exec);
    run_items(rows, threads, [&](int64_t r, int /*worker*/) {
      TopCandidates& top = tops[static_cast<std::size_t>(r)];
      const float tau = shard.temperature_of(r);
      for (int64_t c = 0; counts[static_cast<std::size_t>(r)] > 0 && c < n; ++c) {
        const float x = logits[static_cast<std::size_t>(r * n + c)];
        top.offer({.id = static_cast<int32_t>(shard.vocab_start + c0 + c),
                   .z = canon::canonicalize(canon::scored_logit(x, shard.softcap, tau))});
      }
    });
  }
  for (int64_t r = 0; r < rows; ++r) {
    write_row(tops[static_cast<std::size_t>(r)].ranked(), r, width, out);
  }
}

}  // namespace detlogp::kernels
