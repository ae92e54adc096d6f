#pragma once
// What every command of the detlogp command line shares: exit codes, the usage error, and the
// commands' entry points (one file each; main.cpp registers their options with CLI11).

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"

namespace detlogp::cli {

// 0 success; 1 a check failed (run: bitwise or accuracy; drift: fail verdict; bench never);
// 2 bad input or usage (a one-line message on stderr naming the file and the problem).
enum ExitCode : int { kExitOk = 0, kExitCheckFailed = 1, kExitBadInput = 2 };

// A usage problem found by a command (bad option value or combination). Exit 2.
class UsageError : public std::invalid_argument {
 public:
  explicit UsageError(const std::string& what) : std::invalid_argument(what) {}
};

struct RunOptions {
  int64_t tokens = 1024;
  int64_t real_vocab = 151936;
  std::string dtype = "bf16";
  std::string tp;  // in-process: a list (empty: 1,2,4); MPI: one degree (empty: world / cp)
  int64_t cp = 1;
  int64_t tile_width = detlogp::kDefaultTileWidth;
  int threads = 0;  // 0: all hardware threads, split across the ranks of a group
  uint64_t batch_key = 2026;
  float temperature = 1.0f;
  std::optional<float> softcap;  // the logit softcap; none by default
  std::string backend = "auto";
  std::string comm = "auto";   // auto | in-process | mpi
  std::string device = "cpu";  // cpu | cuda (device.hpp)
  // Seconds a rank waits in one collective; 0: no limit.
  double collective_timeout = kDefaultCollectiveTimeoutSeconds;
  bool json = false;
  bool fused = false;     // the fused lm_head from hidden states (fused_run_command.cpp)
  int64_t hidden = 4096;  // --fused: hidden size H
};

struct LogprobOptions {
  std::string logits, targets, mask;
  std::optional<int64_t> real_vocab;
  int64_t tp = 1;
  std::optional<int64_t> tile_width;
  std::optional<int64_t> num_vocab_tiles;
  float temperature = 1.0f;
  std::string row_temperature;   // file of [tokens] F32 per-row temperatures; none by default
  std::string kept_ids;          // file of [tokens, K] I64/I32 kept ids, -1 padded; none by default
  std::optional<int32_t> top_k;  // every token's top_k of recomputed kept sets; none by default
  std::optional<float> top_p;    // every token's top_p of recomputed kept sets; none by default
  std::optional<float> softcap;  // the logit softcap; none by default
  // What a --kept-ids row of only -1 gets: "error" or "full" (the full vocabulary).
  std::string empty_kept = "error";
  std::string backend = "auto";
  std::string device = "cpu";
  bool entropy = false;
  std::string grad_logp, grad_lse, grad_entropy;
  bool deterministic = true;
  int threads = 0;
  double collective_timeout = kDefaultCollectiveTimeoutSeconds;  // (see RunOptions)
  std::string out;
  std::string provenance;
};

struct DriftOptions {
  std::string candidate, reference, mask;
  std::string dtype = "bf16";
  bool json = false;
};

// `detlogp rollout`: sampled at vLLM's layout, scored at Megatron's (rollout_command.cpp).
struct RolloutOptions {
  int64_t rows = 256;
  int64_t real_vocab = 151936;
  std::string dtype = "bf16";
  std::string pairs = "3:1,4:2";  // ROLLOUT_TP:TRAIN_TP, comma-separated
  uint64_t batch_key = 2026;
  int threads = 0;
  double collective_timeout = kDefaultCollectiveTimeoutSeconds;
  bool json = false;
};

struct BenchOptions {
  int64_t tokens = 1024;
  int64_t real_vocab = 151936;
  std::string dtype = "bf16";
  int threads = 0;
  int repeats = 5;
  uint64_t batch_key = 2026;
  std::string device = "cpu";
  bool json = false;
};

// Each returns the process exit code; bad input throws (ContractError, UsageError), which
// main() reports and turns into exit 2.
int run_command(const RunOptions& options, int* argc, char*** argv);      // logits or --fused
int fused_run_command(const RunOptions& options);                         // run --fused
int run_mpi_command(const RunOptions& options, int* argc, char*** argv);  // DETLOGP_CLI_WITH_MPI
int logprob_command(const LogprobOptions& options);
int drift_command(const DriftOptions& options);
int bench_command(const BenchOptions& options);
int rollout_command(const RolloutOptions& options);

// Total threads: `requested`, or every hardware thread when 0.
int resolve_threads(int requested);
// Rank r's share of `total` threads over `ranks` ranks (earlier ranks take the remainder; at
// least 1 each).
int rank_threads(int total, int ranks, int rank);
// --collective-timeout in seconds -> milliseconds; UsageError unless finite and in [0, 10^9].
std::chrono::milliseconds parse_collective_timeout(double seconds);
// --softcap: UsageError unless absent or finite and > 0.
void check_softcap_option(const std::optional<float>& softcap);
// UsageError unless 1 <= tp <= kMaxInProcessRanks (the in-process group's limit).
void check_in_process_tp(int64_t tp, const char* option);
// "1,2,4" -> {1, 2, 4}; UsageError for anything else (option named in the message).
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option);

}  // namespace detlogp::cli
