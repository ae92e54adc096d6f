#pragma once
// The sampler's per-shard draw (docs/numerics.md "Sampling"): for each row, the shard's best
// Gumbel-max key over the row's candidate ids (its kept set's ids in this shard, or every real
// column of the shard) with that id and its scored value z. A scalar scan over the canon's z
// (kernels::scored_row, the read_target_logits value) and canon::gumbel_key, so its bits are
// every backend's; the best key is a maximum under a total order, so the result does not depend
// on the thread count (each row is its own work item) and the ranks' draws merge exactly.

#include <cstdint>
#include <span>

#include "detlogp/kernels.hpp"

namespace detlogp::kernels {

// One row's best draw on a shard: 16 bytes, trivially copyable (it travels as is in the
// sampler's all-gather). id -1: the shard holds none of the row's candidates.
struct Draw {
  float key = 0.0f;  // the Gumbel-max key (a greedy row: z itself)
  float z = 0.0f;    // the scored value of `id`
  int32_t id = -1;
  int32_t unused = 0;
};
static_assert(sizeof(Draw) == 16);

// Whether draw `a` beats draw `b`: any id beats none; then the canonical ranking of the keys (a
// NaN key first, then the larger key, then the lower id).
bool draw_beats(const Draw& a, const Draw& b);

// Per row: its seed and position (the generator's key and counter), whether it is greedy (key =
// z: the first id of the ranking), and its candidate ids: row r's kept set at kept[r * width,
// ...) ascending, -1 padded; a row with no id there (or width 0) draws over every real column.
struct DrawRows {
  std::span<const int64_t> seeds = {};
  std::span<const int64_t> positions = {};
  std::span<const uint8_t> greedy = {};
  std::span<const int64_t> kept = {};
  int64_t kept_width = 0;
};

// For each row of the shard (global columns [spec.vocab_start, ...), real columns only): its
// best draw, out[r]. Rows are spread over exec.threads.
void shard_draws(const LogitsView& shard, const ShardSpec& spec, const DrawRows& rows,
                 std::span<Draw> out, const ExecOptions& exec = {});

}  // namespace detlogp::kernels
