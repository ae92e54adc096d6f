#pragma once
// The scenario of a `detlogp run` (logits or --fused, in-process or under MPI): everything the run
// works on, resolved once from its options before anything is made, and the score request of each
// of its TP degrees. The pipeline of both op kinds: scenario -> score (scoring.hpp) -> verdict and
// report (run_report.hpp, fused_report.hpp).

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {

struct RunScenario {
  DType dtype = DType::bf16;
  int threads = 1;  // in total, split across the ranks of a group
  std::chrono::milliseconds collective_timeout{};
  SyntheticSpec spec;                // the keyed batch: --tokens, --real-vocab, --dtype, key
  std::vector<VocabLayout> layouts;  // one per TP degree of --tp (run_layout)
  // max(--real-vocab, every layout's padded vocabulary): one buffer wide enough for them all.
  int64_t widest_padded = 0;
};

// The TP degrees (in_process_tps), then --collective-timeout, --dtype and --threads; UsageError
// as those checks say. Call after check_run_options.
RunScenario in_process_scenario(const RunOptions& options);
// The same for the given TP degrees (`run --comm mpi`: the one degree of its topology).
RunScenario run_scenario(const RunOptions& options, std::span<const int64_t> tps);

// What every rank of `layout`'s TP group is asked: the scenario's batch with entropy, and
// backward with all three upstream gradients of `rows`.
ScoreRequest run_request(const RunOptions& options, const RunScenario& scenario,
                         const VocabLayout& layout, const SyntheticRows& rows);

}  // namespace detlogp::cli
