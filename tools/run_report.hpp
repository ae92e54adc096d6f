#pragma once
// The report of `detlogp run` (in-process or under MPI): per TP degree the timings, digests,
// bitwise verdicts and accuracy; printed as a table or as one JSON object.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "reference.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {

struct Digests {
  std::string logp, lse, entropy, grad_logits;
  friend bool operator==(const Digests&, const Digests&) = default;
};

// SHA-256 of the raw bytes of the fp32 outputs, and of columns [0, real) of every row of the
// gradient (in its dtype), row-major.
Digests compute_digests(std::span<const float> logp, std::span<const float> lse,
                        std::span<const float> entropy, const LogitsView& grad, int64_t real);

struct TpRunReport {
  int64_t tp = 1;
  int64_t cp = 1;
  int64_t padded_vocab = 0;
  std::string actual_backend, kernel, contract_fingerprint;
  nlohmann::json provenance;
  double forward_seconds = 0, backward_seconds = 0;
  bool replicated = true;         // every TP rank got the same logp/lse/entropy bits
  bool padding_grad_zero = true;  // every padding column of the gradient is exactly +0
  bool bitwise_equal = true;      // digests equal to the first TP degree's
  Digests digests;
  Accuracy accuracy;
};

struct RunReport {
  RunOptions options;
  std::string comm;            // "in-process" or "mpi"
  std::string device = "cpu";  // where the logits live: "cpu" or "cuda:0 (<name>)"
  int world_size = 1;
  int threads = 1;  // total
  int64_t active_tokens = 0;
  std::vector<TpRunReport> runs;

  bool bitwise_passed() const;
  bool accuracy_passed() const;
  bool passed() const { return bitwise_passed() && accuracy_passed(); }
};

// An empty report of a run of `options` on `comm` ("in-process" or "mpi") with `threads` in
// total, over the whole batch's `rows` (for the count of active tokens).
RunReport start_run_report(const RunOptions& options, std::string comm, int threads,
                           const SyntheticRows& rows);

// The outputs of the whole batch at one TP degree (rank 0's, or gathered from every slice).
struct RunOutputs {
  std::span<const float> logp, lse, entropy;
  LogitsView grad;  // [tokens, >= real vocab], any row stride
};

// The verdict on one TP degree: rank 0's dispatch (backend, kernel, fingerprint, provenance),
// the digests of `outputs`, and the float64 reference on sampled rows. The caller adds what its
// transport knows: timings, replicated, padding_grad_zero, bitwise_equal.
TpRunReport judge_tp_run(const RunOptions& options, const SyntheticSpec& spec,
                         const SyntheticRows& rows, const RankScore& rank0,
                         const VocabLayout& layout, const RunOutputs& outputs);

std::string format_run_report(const RunReport& report);
nlohmann::json run_report_json(const RunReport& report);
// Prints the report (--json: one JSON object, else the table); returns the exit code.
int print_run_report(const RunReport& report);

}  // namespace detlogp::cli
