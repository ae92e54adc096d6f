#include "run_checks.hpp"

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "device.hpp"
#include "memory/memory.hpp"

namespace detlogp::cli {

void check_run_options(const RunOptions& o) {
  if (o.tokens <= 0) throw UsageError(fmt::format("--tokens must be > 0; got {}", o.tokens));
  if (o.real_vocab <= 0) {
    throw UsageError(fmt::format("--real-vocab must be > 0; got {}", o.real_vocab));
  }
  if (o.tile_width <= 0) {
    throw UsageError(fmt::format("--tile-width must be > 0; got {}", o.tile_width));
  }
  if (o.fused && o.hidden <= 0) {
    throw UsageError(fmt::format("--hidden must be > 0; got {}", o.hidden));
  }
  if (!(std::isfinite(o.temperature) && o.temperature > 0)) {
    throw UsageError(fmt::format("--temperature must be finite and > 0; got {}", o.temperature));
  }
  check_softcap_option(o.softcap);
  if (o.threads < 0) throw UsageError(fmt::format("--threads must be >= 0; got {}", o.threads));
  parse_dtype(o.dtype, "--dtype");
  parse_device(o.device);
  parse_collective_timeout(o.collective_timeout);
}

std::vector<int64_t> in_process_tps(const RunOptions& o) {
  if (o.cp != 1) throw UsageError("--cp needs --comm mpi (context parallelism splits processes)");
  const std::vector<int64_t> tps = parse_int_list(o.tp.empty() ? "1,2,4" : o.tp, "--tp");
  for (int64_t tp : tps) check_in_process_tp(tp, "--tp");
  return tps;
}

std::uint64_t require_run_memory(std::span<const RunBuffer> buffers, std::string_view what,
                                 std::string_view fix) {
  std::uint64_t total = 0;
  std::string names;
  for (const RunBuffer& b : buffers) {
    const std::uint64_t bytes = io::checked_product(
        {b.count, b.rows, b.cols, b.element_size}, fmt::format("{}: the size of {}", what, b.name));
    if (__builtin_add_overflow(total, bytes, &total)) {
      throw ContractError(fmt::format("{}: the sum of its buffers overflows 64-bit sizes", what));
    }
    names += (names.empty() ? "" : ", ") + std::string(b.name);
  }
  io::require_memory(total, fmt::format("{} ({})", what, names), fix);
  return total;
}

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
                            std::optional<float> softcap, std::span<const float> logp,
                            std::span<const float> lse, std::span<const float> entropy,
                            const LogitsView& grad) {
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
                  .softcap = softcap,
                  .grad_logp = rows.grad_logp[i],
                  .grad_lse = rows.grad_lse[i],
                  .grad_entropy = rows.grad_entropy[i]},
        RowOutputs{
            .logp = logp[i], .lse = lse[i], .entropy = entropy[i], .has_entropy = true, .grad = g});
  }
  return acc;
}

}  // namespace detlogp::cli
