#include "run_checks.hpp"

#include <vector>

namespace detlogp::cli {

VocabLayout run_layout(int64_t real_vocab, int64_t tp, int64_t tile_width) {
  VocabLayout layout = megatron_bounds(real_vocab, tp);
  for (const VocabRange& b : layout.vocab_shard_bounds) {
    if (b.start % tile_width != 0) {
      layout.vocab_shard_bounds =
          even_tile_aligned_bounds(layout.padded_vocab_size, tp, tile_width);
      break;
    }
  }
  return layout;
}

bool padding_is_zero(const LogitsView& grad, int64_t real) {
  const std::size_t esz = dtype_size(grad.dtype);
  const auto* base = static_cast<const std::byte*>(grad.data);
  for (int64_t r = 0; r < grad.rows; ++r) {
    const std::byte* row = base + static_cast<std::size_t>(r * grad.row_stride) * esz;
    for (std::size_t k = static_cast<std::size_t>(real) * esz;
         k < static_cast<std::size_t>(grad.cols) * esz; ++k) {
      if (row[k] != std::byte{0}) return false;
    }
  }
  return true;
}

Accuracy check_sampled_rows(const SyntheticSpec& spec, const SyntheticRows& rows, float temperature,
                            std::span<const float> logp, std::span<const float> lse,
                            std::span<const float> entropy, const LogitsView& grad) {
  Accuracy acc;
  const int64_t real = spec.real_vocab;
  const std::size_t esz = dtype_size(spec.dtype);
  std::vector<std::byte> raw(static_cast<std::size_t>(real) * esz);
  std::vector<float> z, g;
  for (int64_t row : sample_rows(spec.tokens, kSampleRows)) {
    fill_logits(spec, row, row + 1, 0, real, raw.data(), real, 1);
    widen_row(spec.dtype, raw.data(), real, z);
    widen_row(grad.dtype,
              static_cast<const std::byte*>(grad.data) +
                  static_cast<std::size_t>(row * grad.row_stride) * esz,
              real, g);
    const auto i = static_cast<std::size_t>(row);
    check_row(
        acc, grad.dtype,
        RowInputs{.logits = z,
                  .target = rows.targets[i],
                  .active = rows.active[i],
                  .temperature = temperature,
                  .grad_logp = rows.grad_logp[i],
                  .grad_lse = rows.grad_lse[i],
                  .grad_entropy = rows.grad_entropy[i]},
        RowOutputs{
            .logp = logp[i], .lse = lse[i], .entropy = entropy[i], .has_entropy = true, .grad = g});
  }
  return acc;
}

}  // namespace detlogp::cli
