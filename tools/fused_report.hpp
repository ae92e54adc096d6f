#pragma once
// The verdict and report of `detlogp run --fused`: per TP degree the timings and digests of
// logp, lse, entropy and both gradients, and four bitwise verdicts (raw bits): the fused
// outputs against linear_logits + the registry's operator at TP=1, and every output against
// TP=1 on every rank of every degree. Printed as a table or as one JSON object.

#include <cstdint>
#include <string>
#include <vector>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "scoring.hpp"

namespace detlogp::cli {

// One TP degree: every rank's score and hidden-state gradient ([tokens, H] in the run's
// dtype), and the weight gradient ([padded, H], the ranks' shards joined).
struct FusedTpRun {
  int64_t tp = 1;
  int64_t padded_vocab = 0;
  std::vector<FusedRankScore> ranks;
  std::vector<std::vector<uint8_t>> grad_hidden;
  std::vector<uint8_t> grad_weight;
};

// linear_logits at TP=1 + the registry's operator on those fp32 logits.
struct FusedReference {
  LogprobResult result;
  std::string backend;
  double seconds = 0;
};

struct FusedReport {
  RunOptions options;
  DType dtype = DType::bf16;  // of the hidden states, the weight and their gradients
  int threads = 1;
  FusedReference reference;
  std::vector<FusedTpRun> runs;
  bool equals_reference = false;  // TP=1's logp, lse, entropy == the reference's
  bool outputs_across = false;    // logp, lse, entropy: every rank of every degree == TP=1's
  bool hidden_across = false;     // grad_hidden: every rank of every degree == TP=1's
  bool weight_across = false;     // grad_weight's real rows: every degree == TP=1's
  bool passed() const {
    return equals_reference && outputs_across && hidden_across && weight_across;
  }
};

// Fills the four verdicts of `report` from its reference and runs.
void judge_fused_run(FusedReport& report);

// Prints the report (--json: one JSON object, else the table) and returns the exit code.
int print_fused_report(const FusedReport& report);

}  // namespace detlogp::cli
