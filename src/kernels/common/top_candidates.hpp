#pragma once
// The per-shard scan of recomputed kept sets (docs/numerics.md "Recomputed kept sets (top-k,
// top-p)"): for each row, the shard's first `count` real columns in the canonical ranking,
// with their scored values z. A scalar scan: each z is the canon's scored value (widened or
// the canonical dot, softcapped, divided by the row's temperature), the same bits on every
// SIMD target, and the ranking is a total order, so the result depends on nothing but the
// shard's values (not on the thread count: each row is its own work item).

#include <cstdint>
#include <span>
#include <vector>

#include "detlogp/kernels.hpp"

namespace detlogp::kernels {

// One candidate: a global vocabulary id and its scored value; id -1 marks padding. 8 bytes,
// trivially copyable: it travels as is in the candidates' all-gather (vocabulary ids fit in
// int32: the scans reject a real vocabulary beyond kMaxCandidateVocab).
struct Candidate {
  int32_t id = -1;
  float z = 0.0f;
};
static_assert(sizeof(Candidate) == 8);
inline constexpr int64_t kMaxCandidateVocab = int64_t{1} << 31;

// The canonical ranking: a NaN z first (above every number; NaNs among themselves by id),
// then z descending (-0 and +0 are equal), then id ascending. A strict total order on
// candidates with distinct ids.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  const bool an = a.z != a.z;
  const bool bn = b.z != b.z;
  if (an != bn) return an;
  if (!an && a.z != b.z) return a.z > b.z;
  return a.id < b.id;
}

// The first `count` of a stream of candidates (distinct ids) in the canonical ranking, in
// O(count) memory and mostly one comparison per candidate: once `count` are held, a candidate
// that does not rank before the count-th best seen so far cannot be among the first.
class TopCandidates {
 public:
  explicit TopCandidates(std::size_t count) : count_(count) {}
  void offer(const Candidate& c) {
    if (count_ == 0 || (has_bar_ && !ranks_before(c, bar_))) return;
    pool_.push_back(c);
    if (pool_.size() >= 2 * count_) compact();
  }
  // A value below which an offered candidate cannot be kept: the count-th best z seen so far
  // (NaN when that is a NaN: nothing compares below it), -inf before `count` were held. Lets a
  // scan skip offer() for z < floor() with one comparison.
  float floor() const { return has_bar_ ? bar_.z : -__builtin_huge_valf(); }
  // The first `count` (all when fewer were offered), ranked.
  std::vector<Candidate>& ranked();

 private:
  void compact();
  std::size_t count_;
  std::vector<Candidate> pool_;
  Candidate bar_;  // the count-th best seen, once has_bar_
  bool has_bar_ = false;
};

// z of row r's first n columns of the shard, z[0, n): each the read_target_logits value (widened,
// softcapped, divided by the row's temperature, canonical NaN). The candidate scan and the
// sampler's draw (gumbel_scan) read the scored values through it.
void scored_row(const LogitsView& shard, const ShardSpec& spec, int64_t r, int64_t n, float* z);

// Ranks `pool` and keeps its first `count` candidates (all of them when it has fewer).
void keep_first(std::vector<Candidate>& pool, std::size_t count);

// The first `count` of the values z (ids first_id + i), ranked, into `out` (replaced), in two
// passes over z: a histogram of the 12 high bits of each value's ranking key finds the bin of
// the count-th, then only the values of that bin and above are ranked. `hist` is scratch.
void first_of_values(std::span<const float> z, int64_t first_id, std::size_t count,
                     std::vector<Candidate>& out, std::vector<uint32_t>& hist);

// For each row r of the shard: its first counts[r] real columns (global id < real vocab) in
// the canonical ranking, ranked, at out[r * width, ...), the rest of the row padded (id -1).
// counts[r] <= width; out has rows * width entries. Rows are spread over exec.threads.
void shard_top_candidates(const LogitsView& shard, const ShardSpec& spec,
                          std::span<const int64_t> counts, int64_t width, std::span<Candidate> out,
                          const ExecOptions& exec = {});

// The same for the fused lm_head: the logits are the canonical dot products of the hidden
// rows with blocks of `kScanBlock` weight rows (FusedKernels::linear_logits on [rows, block]
// pieces, never [rows, local vocab]), softcapped and divided by the row's temperature.
inline constexpr int64_t kScanBlock = 512;
void fused_top_candidates(const FusedKernels& kernels, const FusedShard& shard,
                          std::span<const int64_t> counts, int64_t width, std::span<Candidate> out,
                          const ExecOptions& exec = {});

}  // namespace detlogp::kernels
