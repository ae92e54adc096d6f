#include "op/full_vocabulary_rows.hpp"

#include <algorithm>

namespace detlogp::op {

std::vector<uint8_t> full_vocabulary_rows(std::span<const int64_t> kept, int64_t rows,
                                          int64_t width) {
  std::vector<uint8_t> out(static_cast<std::size_t>(std::max<int64_t>(rows, 0)), 0);
  for (std::size_t r = 0; r < out.size(); ++r) {
    // Resolved rows are ascending with the padding last: empty iff the first slot is -1.
    out[r] = width == 0 || kept[r * static_cast<std::size_t>(width)] < 0 ? 1 : 0;
  }
  return out;
}

bool any_row(std::span<const uint8_t> rows) {
  return std::any_of(rows.begin(), rows.end(), [](uint8_t v) { return v != 0; });
}

void take_full_rows(std::span<const uint8_t> full_rows, std::span<const float> logp,
                    std::span<const float> lse, std::span<const float> entropy, KeptOutputs& kept) {
  const bool with_entropy = !entropy.empty() && !kept.entropy.empty();
  for (std::size_t r = 0; r < full_rows.size(); ++r) {
    if (!full_rows[r]) continue;
    kept.logp[r] = logp[r];
    if (!lse.empty()) kept.lse[r] = lse[r];
    if (with_entropy) kept.entropy[r] = entropy[r];
    if (!kept.outside.empty()) kept.outside[r] = 0;
  }
}

}  // namespace detlogp::op
