#include "kernels/common/gumbel_scan.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "detlogp/errors.hpp"
#include "kernels/common/top_candidates.hpp"
#include "kernels/common/validate.hpp"
#include "kernels/common/work_pool.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"
#include "numerics/philox.hpp"

namespace detlogp::kernels {

namespace {

// The key of id `id` with scored value z on a row.
struct RowKey {
  uint64_t seed;
  uint64_t position;
  bool greedy;
  float operator()(float z, int64_t id) const {
    if (greedy) return z;
    return canon::gumbel_key(z, canon::sample_uniform(seed, position, static_cast<uint32_t>(id)));
  }
};

// Upper bounds of the noise of each bucket of words (canon::kNoiseBucketShift): the noise of
// the bucket's last value (the noise is nondecreasing in x >> 9).
constexpr std::size_t kBuckets = std::size_t{1} << (32 - canon::kNoiseBucketShift);
const std::array<float, kBuckets>& noise_ceilings() {
  static const std::array<float, kBuckets> table = [] {
    std::array<float, kBuckets> t{};
    for (std::size_t b = 0; b < kBuckets; ++b) {
      const auto last = static_cast<uint32_t>(((b + 1) << canon::kNoiseBucketShift) - 1);
      t[b] = canon::gumbel_key(0.0f, canon::uniform_of_word(last));
    }
    return t;
  }();
  return table;
}

// Offers (key, z, id) to `best`; ids arrive in ascending order, so an equal key keeps the
// earlier (lower) id.
inline void offer(Draw& best, float key, float z, int64_t id) {
  const Draw d{.key = key, .z = z, .id = static_cast<int32_t>(id)};
  if (draw_beats(d, best)) best = d;
}

void check_rows(const DrawRows& rows, int64_t n, std::span<const Draw> out) {
  const auto un = static_cast<std::size_t>(n);
  if (rows.seeds.size() != un || rows.positions.size() != un || rows.greedy.size() != un ||
      out.size() != un || rows.kept_width < 0 ||
      rows.kept.size() != un * static_cast<std::size_t>(rows.kept_width)) {
    throw ContractError(
        "detlogp shard_draws: expected one seed, position, greedy flag and draw "
        "per row and [rows, kept_width] kept ids; got " +
        std::to_string(rows.seeds.size()) + ", " + std::to_string(rows.positions.size()) + ", " +
        std::to_string(rows.greedy.size()) + ", " + std::to_string(out.size()) + " and " +
        std::to_string(rows.kept.size()) + " for " + std::to_string(n) + " rows");
  }
}

}  // namespace

bool draw_beats(const Draw& a, const Draw& b) {
  if (a.id < 0 || b.id < 0) return a.id >= 0 && b.id < 0;
  return ranks_before(Candidate{.id = a.id, .z = a.key}, Candidate{.id = b.id, .z = b.key});
}

void shard_draws(const LogitsView& shard, const ShardSpec& spec, const DrawRows& rows,
                 std::span<Draw> out, const ExecOptions& exec) {
  validate_shard(shard, spec, "shard_draws", ShardBounds::any_bounds);
  check_rows(rows, shard.rows, out);
  const int64_t begin = spec.vocab_start;
  const int64_t real_cols = std::clamp<int64_t>(spec.geometry.real_vocab - begin, 0, shard.cols);
  const int threads = resolve_threads(exec.threads, shard.rows);
  std::vector<std::vector<float>> scratch(static_cast<std::size_t>(threads));
  run_items(shard.rows, threads, [&](int64_t r, int worker) {
    const auto ri = static_cast<std::size_t>(r);
    const RowKey key{.seed = static_cast<uint64_t>(rows.seeds[ri]),
                     .position = static_cast<uint64_t>(rows.positions[ri]),
                     .greedy = rows.greedy[ri] != 0};
    Draw best;
    const int64_t* kept = rows.kept.data() + r * rows.kept_width;
    if (rows.kept_width > 0 && kept[0] >= 0) {  // the row's kept ids this shard holds
      const float tau = spec.temperature_of(r);
      for (int64_t j = 0; j < rows.kept_width && kept[j] >= 0; ++j) {
        const int64_t id = kept[j];
        if (id < begin || id >= begin + real_cols) continue;
        const float x =
            numerics::load_as_float(shard.data, shard.dtype, r * shard.row_stride + (id - begin));
        const float z = canon::canonicalize(canon::scored_logit(x, spec.softcap, tau));
        offer(best, key(z, id), z, id);
      }
      out[ri] = best;
      return;
    }
    std::vector<float>& z = scratch[static_cast<std::size_t>(worker)];
    z.resize(static_cast<std::size_t>(real_cols));
    scored_row(shard, spec, r, real_cols, z.data());
    // Ids that cannot be drawn are skipped, with the result of computing every key: no key
    // exceeds z + kGumbelNoiseMax and the row's largest z, M, has a key of at least
    // M + kGumbelNoiseMin (rounding is monotonic), so an id whose z + kGumbelNoiseMax is below
    // the bar (that, then the best key so far) cannot win; nor can one whose z plus its noise
    // bucket's bound is below it (its two det_log are not computed). A NaN z is never skipped
    // (every comparison with it is false). A greedy row's key is z itself: the bar is M.
    float m = -canon::kInf;
    for (int64_t c = 0; c < real_cols; ++c) m = std::max(m, z[static_cast<std::size_t>(c)]);
    float bar = key.greedy ? m : m + canon::kGumbelNoiseMin;
    if (key.greedy) {
      for (int64_t c = 0; c < real_cols; ++c) {
        const float zc = z[static_cast<std::size_t>(c)];
        if (!(zc < bar)) offer(best, zc, zc, begin + c);
      }
      out[ri] = best;
      return;
    }
    const std::array<float, kBuckets>& ceiling = noise_ceilings();
    for (int64_t c = 0; c < real_cols; ++c) {
      const float zc = z[static_cast<std::size_t>(c)];
      if (zc + canon::kGumbelNoiseMax < bar) continue;
      const int64_t id = begin + c;
      const uint32_t x = canon::sample_word(key.seed, key.position, static_cast<uint32_t>(id));
      if (zc + ceiling[x >> canon::kNoiseBucketShift] < bar) continue;
      offer(best, canon::gumbel_key(zc, canon::uniform_of_word(x)), zc, id);
      if (best.key > bar) bar = best.key;
    }
    out[ri] = best;
  });
}

}  // namespace detlogp::kernels
