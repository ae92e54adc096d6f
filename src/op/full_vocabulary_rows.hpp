#pragma once
// The rows of a kept-set call that are scored over the full vocabulary (docs/numerics.md "Kept
// sets", "Recomputed kept sets (top-k, top-p)"): in a batch that mixes restricted and
// unrestricted rows, a row whose resolved kept ids are all -1 (an unrestricted row of recomputed
// sets or of the sampler, or a given empty row with EmptyKeptRow::full_vocabulary) takes the
// full-vocabulary outputs, every other row its kept-set outputs. Written once for the sampler
// and both operators.

#include <cstdint>
#include <span>
#include <vector>

#include "op/kept_sets.hpp"

namespace detlogp::op {

// 1 per row of resolved kept ids [rows, width] that holds no id (all -1).
std::vector<uint8_t> full_vocabulary_rows(std::span<const int64_t> kept, int64_t rows,
                                          int64_t width);

// Whether some row is 1.
bool any_row(std::span<const uint8_t> rows);

// The kept outputs of the full rows replaced by the full-vocabulary ones (logp, lse, and entropy
// when both have it), and their `outside` cleared (a full row holds every id).
void take_full_rows(std::span<const uint8_t> full_rows, std::span<const float> logp,
                    std::span<const float> lse, std::span<const float> entropy, KeptOutputs& kept);

}  // namespace detlogp::op
