#include "run_scenario.hpp"

#include <algorithm>

#include "run_checks.hpp"

namespace detlogp::cli {

RunScenario in_process_scenario(const RunOptions& o) {
  const std::vector<int64_t> tps = in_process_tps(o);
  return run_scenario(o, tps);
}

RunScenario run_scenario(const RunOptions& o, std::span<const int64_t> tps) {
  RunScenario s;
  s.collective_timeout = parse_collective_timeout(o.collective_timeout);
  s.dtype = parse_dtype(o.dtype, "--dtype");
  s.threads = resolve_threads(o.threads);
  s.spec = {.tokens = o.tokens, .real_vocab = o.real_vocab, .dtype = s.dtype, .key = o.batch_key};
  s.widest_padded = o.real_vocab;
  for (int64_t tp : tps) {
    s.layouts.push_back(run_layout(o.real_vocab, tp, o.tile_width));
    s.widest_padded = std::max(s.widest_padded, s.layouts.back().padded_vocab_size);
  }
  return s;
}

ScoreRequest run_request(const RunOptions& o, const RunScenario& s, const VocabLayout& layout,
                         const SyntheticRows& rows) {
  return ScoreRequest{.dtype = s.dtype,
                      .real_vocab = o.real_vocab,
                      .padded_vocab = layout.padded_vocab_size,
                      .bounds = layout.vocab_shard_bounds,
                      .tile_width = o.tile_width,
                      .temperature = o.temperature,
                      .softcap = o.softcap,
                      .backend = o.backend,
                      .entropy = true,
                      .targets = rows.targets,
                      .active = &rows.active,
                      .grads = {.grad_logp = rows.grad_logp,
                                .grad_lse = rows.grad_lse,
                                .grad_entropy = rows.grad_entropy},
                      .collective_timeout = s.collective_timeout};
}

}  // namespace detlogp::cli
