// `detlogp run --fused`: the fused lm_head on a keyed Qwen3-like shape (hidden states
// [tokens, H], an lm_head weight [padded, H] in the run's dtype) at every requested TP degree on
// the in-process rank group: forward with entropy and backward into both the hidden states and
// each rank's weight shard, the op obtained from the registry (get_fused_linear_logprob_op).
// Checked bitwise (fused_report.hpp) against linear_logits + the registry's operator at TP=1.
// The logits are never materialised by the fused path (only by the reference, [tokens, R]).

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "cli.hpp"
#include "detlogp/fused.hpp"
#include "fused_report.hpp"
#include "progress.hpp"
#include "run_checks.hpp"
#include "run_scenario.hpp"

namespace detlogp::cli {
namespace {

// What the run holds at once: the inputs, the reference's fp32 logits, and every degree's
// gradients (kept for the bitwise comparison). Refused up front when it does not fit.
void require_fused_memory(const RunOptions& o, const RunScenario& s) {
  const std::uint64_t esz = dtype_size(s.dtype);
  uint64_t ranks_total = 0;
  for (const VocabLayout& l : s.layouts) ranks_total += l.vocab_shard_bounds.size();
  const auto tokens = static_cast<uint64_t>(o.tokens), h = static_cast<uint64_t>(o.hidden);
  const auto padded = static_cast<uint64_t>(s.widest_padded);
  const RunBuffer buffers[] = {
      {.name = "the hidden states", .rows = tokens, .cols = h, .element_size = esz},
      {.name = "the lm_head weight", .rows = padded, .cols = h, .element_size = esz},
      {.name = "the reference logits",
       .rows = tokens,
       .cols = static_cast<uint64_t>(o.real_vocab),
       .element_size = 4},
      {.name = "a hidden-state gradient per rank",
       .count = ranks_total,
       .rows = tokens,
       .cols = h,
       .element_size = esz},
      {.name = "a weight gradient per TP degree",
       .count = s.layouts.size(),
       .rows = padded,
       .cols = h,
       .element_size = esz}};
  require_run_memory(buffers,
                     fmt::format("--tokens {} x --hidden {} x {} columns of {}", o.tokens, o.hidden,
                                 s.widest_padded, o.dtype),
                     "use fewer --tokens or a smaller --hidden");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// linear_logits at TP=1 + the registry's operator (--backend) on those fp32 logits.
FusedReference fused_reference(const RunOptions& o, const RunScenario& s, const SyntheticRows& rows,
                               const LogitsView& hidden, const LogitsView& weight) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<std::size_t>(o.tokens * o.real_vocab));
  const MutableLogitsView out{logits.data(), DType::fp32, o.tokens, o.real_vocab, o.real_vocab};
  linear_logits(hidden, LogitsView{weight.data, weight.dtype, o.real_vocab, o.hidden, o.hidden},
                out, {.threads = s.threads});
  ScoreRequest req = run_request(o, s, VocabLayout{o.real_vocab, {{0, o.real_vocab}}}, rows);
  req.dtype = DType::fp32;
  req.grads = {};  // forward only
  SelfComm self;
  RankScore score = score_rank(
      self, req, LogitsView{logits.data(), DType::fp32, o.tokens, o.real_vocab, o.real_vocab},
      MutableLogitsView{}, s.threads);
  return {.result = std::move(score.result),
          .backend = score.actual_backend,
          .seconds = seconds_since(t0)};
}

// Every rank of one TP degree on the in-process group, with its own gradient buffers.
FusedTpRun fused_tp_run(const RunOptions& o, const RunScenario& s, const VocabLayout& layout,
                        const SyntheticRows& rows, const LogitsView& hidden,
                        const LogitsView& weight) {
  FusedTpRun run;
  run.tp = static_cast<int64_t>(layout.vocab_shard_bounds.size());
  run.padded_vocab = layout.padded_vocab_size;
  const std::size_t esz = dtype_size(s.dtype);
  run.grad_hidden.assign(static_cast<std::size_t>(run.tp),
                         std::vector<uint8_t>(static_cast<std::size_t>(o.tokens * o.hidden) * esz));
  // Garbage (all bits set: NaN) so that a row backward does not write shows.
  run.grad_weight.assign(static_cast<std::size_t>(layout.padded_vocab_size * o.hidden) * esz, 0xff);
  std::vector<MutableLogitsView> grad_hidden;
  for (std::vector<uint8_t>& g : run.grad_hidden) {
    grad_hidden.push_back({g.data(), s.dtype, o.tokens, o.hidden, o.hidden});
  }
  const MutableLogitsView grad_weight{run.grad_weight.data(), s.dtype, layout.padded_vocab_size,
                                      o.hidden, o.hidden};
  run.ranks = score_fused_in_process(run_request(o, s, layout, rows), hidden, weight, grad_hidden,
                                     grad_weight, s.threads);
  return run;
}

}  // namespace

int fused_run_command(const RunOptions& o) {
  // Everything that needs no data first, with the same checks as `run` (run_checks.hpp).
  check_run_options(o);
  if (o.comm == "mpi") throw UsageError("--fused runs on the in-process group; drop --comm mpi");
  if (o.device != "cpu") throw UsageError("--fused runs on the CPU; drop --device " + o.device);
  const RunScenario s = in_process_scenario(o);
  require_fused_memory(o, s);
  const SyntheticRows rows = synthetic_rows(s.spec, 0, o.tokens);

  Progress progress(true);
  progress.step("[run --fused] generating hidden states and lm_head weight...");
  const std::vector<uint8_t> hidden =
      dense_matrix(s.dtype, o.tokens, o.hidden, o.batch_key, 1.0, s.threads);
  // Logit scale about 2.5: weight entries ~ N(0, (2.5 / sqrt(H))^2).
  const std::vector<uint8_t> weight =
      dense_matrix(s.dtype, s.widest_padded, o.hidden, o.batch_key + 1,
                   2.5 / std::sqrt(static_cast<double>(o.hidden)), s.threads);
  const LogitsView hidden_view{hidden.data(), s.dtype, o.tokens, o.hidden, o.hidden};
  const LogitsView weight_view{weight.data(), s.dtype, s.widest_padded, o.hidden, o.hidden};

  FusedReport report;
  report.options = o;
  report.dtype = s.dtype;
  report.threads = s.threads;
  progress.step("[run --fused] reference: linear_logits + operator...");
  report.reference = fused_reference(o, s, rows, hidden_view, weight_view);
  for (const VocabLayout& layout : s.layouts) {
    progress.step(fmt::format("[run --fused] TP={}: forward + backward...",
                              layout.vocab_shard_bounds.size()));
    report.runs.push_back(fused_tp_run(o, s, layout, rows, hidden_view, weight_view));
  }
  progress.clear();
  judge_fused_run(report);
  return print_fused_report(report);
}

}  // namespace detlogp::cli
