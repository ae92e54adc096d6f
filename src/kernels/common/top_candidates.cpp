#include "kernels/common/top_candidates.hpp"

#include <algorithm>
#include <bit>
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

// z[0, n) = canon::scored_logit of the widened values, canonical NaN.
void score_in_place(float* z, int64_t n, float cap, float tau) {
  if (cap != 0.0f || tau != 1.0f) {
    for (int64_t i = 0; i < n; ++i) z[i] = canon::scored_logit(z[i], cap, tau);
  }
  for (int64_t i = 0; i < n; ++i) z[i] = canon::canonicalize(z[i]);
}

template <DType kDType>
void widen(const void* base, int64_t at, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = numerics::load_as_float<kDType>(base, at + i);
}

// An unsigned key whose order is the ranking's order of values: NaN highest, then descending
// value; -0 and +0 share the key of +0.
inline uint32_t rank_key(float z) {
  // Branch-free (signs are random): +0 for -0, then the sign-magnitude bits made monotonic.
  const uint32_t u = std::bit_cast<uint32_t>(z) & (0u - static_cast<uint32_t>(z != 0.0f));
  const uint32_t negative = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  const uint32_t key = u ^ (negative | 0x80000000u);
  return z != z ? 0xffffffffu : key;
}

constexpr int kKeyShift = 20;  // 4096 bins

// Up to this many candidates a row is scanned with TopCandidates (one pass, few compactions),
// beyond it with first_of_values (two passes, no compaction).
constexpr std::size_t kStreamingCount = 256;

// Offers z[0, n) as ids first_id + i, skipping with one comparison what cannot be kept.
void offer_all(TopCandidates& top, const float* z, int64_t n, int64_t first_id) {
  float floor = top.floor();
  for (int64_t i = 0; i < n; ++i) {
    if (z[i] < floor) continue;
    top.offer({.id = static_cast<int32_t>(first_id + i), .z = z[i]});
    floor = top.floor();
  }
}

}  // namespace

void scored_row(const LogitsView& shard, const ShardSpec& spec, int64_t r, int64_t n, float* z) {
  const int64_t at = r * shard.row_stride;
  switch (shard.dtype) {
    case DType::bf16:
      widen<DType::bf16>(shard.data, at, n, z);
      break;
    case DType::fp16:
      widen<DType::fp16>(shard.data, at, n, z);
      break;
    case DType::fp32:
      widen<DType::fp32>(shard.data, at, n, z);
      break;
  }
  score_in_place(z, n, spec.softcap, spec.temperature_of(r));
}

void TopCandidates::compact() {
  // The count-th best in place, the better ones before it in any order: no sort needed.
  const auto nth = pool_.begin() + static_cast<std::ptrdiff_t>(count_ - 1);
  std::nth_element(pool_.begin(), nth, pool_.end(), ranks_before);
  bar_ = *nth;
  has_bar_ = true;
  pool_.resize(count_);
}

std::vector<Candidate>& TopCandidates::ranked() {
  keep_first(pool_, count_);
  return pool_;
}

void first_of_values(std::span<const float> z, int64_t first_id, std::size_t count,
                     std::vector<Candidate>& out, std::vector<uint32_t>& hist) {
  out.clear();
  if (count == 0) return;
  hist.assign(std::size_t{1} << (32 - kKeyShift), 0);
  for (float v : z) ++hist[rank_key(v) >> kKeyShift];
  // The lowest bin b such that bins >= b hold at least `count` values (0 when all are fewer):
  // the first `count` all lie in bins >= b, since a bin's keys all exceed a lower bin's.
  std::size_t b = hist.size();
  for (std::size_t held = 0; b > 0 && held < count;) held += hist[--b];
  const uint32_t lowest = static_cast<uint32_t>(b) << kKeyShift;
  for (std::size_t i = 0; i < z.size(); ++i) {
    if (rank_key(z[i]) >= lowest) {
      out.push_back({.id = static_cast<int32_t>(first_id + static_cast<int64_t>(i)), .z = z[i]});
    }
  }
  keep_first(out, count);
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
  validate_shard(shard, spec, kernel, ShardBounds::any_bounds);  // element-wise: any bounds
  check_out(counts, shard.rows, width, spec.geometry.real_vocab, out, kernel);
  // Real columns of the shard only: padding is never read.
  const int64_t real_cols =
      std::clamp<int64_t>(spec.geometry.real_vocab - spec.vocab_start, 0, shard.cols);
  const int threads = resolve_threads(exec.threads, shard.rows);
  struct Scratch {
    std::vector<float> z;
    std::vector<Candidate> first;
    std::vector<uint32_t> hist;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(threads));
  run_items(shard.rows, threads, [&](int64_t r, int worker) {
    const auto count = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    Scratch& s = scratch[static_cast<std::size_t>(worker)];
    s.first.clear();
    if (count == 0) {
      write_row(s.first, r, width, out);
      return;
    }
    s.z.resize(static_cast<std::size_t>(real_cols));
    scored_row(shard, spec, r, real_cols, s.z.data());
    // Two ways to the same ids (the faster one for the count, measured on 152k columns).
    if (count <= kStreamingCount) {
      TopCandidates top(count);
      offer_all(top, s.z.data(), real_cols, spec.vocab_start);
      write_row(top.ranked(), r, width, out);
    } else {
      first_of_values(s.z, spec.vocab_start, count, s.first, s.hist);
      write_row(s.first, r, width, out);
    }
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
      if (counts[static_cast<std::size_t>(r)] == 0) return;
      float* z = logits.data() + r * n;
      score_in_place(z, n, shard.softcap, shard.temperature_of(r));
      offer_all(tops[static_cast<std::size_t>(r)], z, n, shard.vocab_start + c0);
    });
  }
  for (int64_t r = 0; r < rows; ++r) {
    write_row(tops[static_cast<std::size_t>(r)].ranked(), r, width, out);
  }
}

}  // namespace detlogp::kernels
