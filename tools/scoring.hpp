#pragma once
// Scoring one batch on one TP rank, for either op kind: build the rank's contract, dispatch it
// through the registry (the logits operator, or the fused lm_head from hidden states and a
// weight shard), run forward (and backward), time both between barriers. The in-process
// runners play every rank of a TP group on threads of this process; `run --comm mpi` calls
// score_rank on its MPI TP group.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "detlogp/detlogp.hpp"
#include "detlogp/fused_dispatch.hpp"

namespace detlogp::cli {

// What every rank of one TP group agrees on (the rank's own part is its shard of `bounds`).
struct ScoreRequest {
  DType dtype = DType::bf16;
  int64_t real_vocab = 0;
  int64_t padded_vocab = 0;
  std::vector<VocabRange> bounds = {};  // one per TP rank
  int64_t tile_width = kDefaultTileWidth;
  float temperature = 1.0f;
  // Per-token temperatures of this (CP) slice (ForwardOptions::row_temperature): empty, or one
  // per token, the contract's temperature then 1.
  std::span<const float> row_temperature = {};
  // Sampling-replay kept sets (ForwardOptions::kept): none by default.
  KeptSetOptions kept = {};
  std::optional<float> softcap = std::nullopt;
  std::string backend = "auto";
  // Registry platform: "cpu", or "cuda" (device logits and gradient, see device.hpp).
  std::string platform = "cpu";
  bool deterministic = true;  // false: determinism_scope fixed_topology, non-deterministic mode
  bool entropy = false;
  int64_t cp_rank = 0;
  int64_t cp_size = 1;
  // Per token of this (CP) slice.
  std::span<const int64_t> targets = {};
  const std::vector<bool>* active = nullptr;
  // Upstream gradients; backward runs when any is non-empty.
  LogprobGrads grads = {};
  // How long a rank of the in-process group waits in one collective (score_in_process).
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  // Called by TP rank 0 as each phase starts ("forward", "backward"); may be empty.
  std::function<void(const std::string&)> on_phase = {};
};

struct RankScore {
  LogprobResult result;
  std::string provenance_json;
  std::string actual_backend;
  std::string kernel;
  std::string contract_fingerprint;
  double forward_seconds = 0;
  double backward_seconds = 0;
};

LogprobContract make_contract(const ScoreRequest& request, int64_t tp_rank);

bool wants_backward(const LogprobGrads& grads);

// Runs on one rank of `comm` (a TP group of request.bounds.size() ranks). `shard` is this
// rank's [tokens, local_vocab] logits; `grad_shard` (when backward runs) its gradient.
// Collective: every rank of `comm` calls it.
RankScore score_rank(Communicator& comm, const ScoreRequest& request, const LogitsView& shard,
                     const MutableLogitsView& grad_shard, int threads);

// Every rank of a TP group on an in-process group. `logits` is the full [tokens, padded] matrix
// (any row_stride); `grad` (when backward runs) the full gradient, written shard by shard.
// `threads` in total, split across the ranks. Returns every rank's RankScore, by TP rank.
std::vector<RankScore> score_in_process(const ScoreRequest& request, const LogitsView& logits,
                                        const MutableLogitsView& grad, int threads);

// Columns [start, end) of a full matrix view.
LogitsView columns(const LogitsView& full, int64_t start, int64_t end);
MutableLogitsView columns(const MutableLogitsView& full, int64_t start, int64_t end);

// One rank of the fused lm_head (op from get_fused_linear_logprob_op with the best kernels),
// forward with request.entropy, then backward (when request.grads asks) into `grad_hidden`
// ([tokens, H], the full gradient) and `grad_weight_shard` (this rank's rows).
struct FusedRankScore {
  FusedLogprobResult result;
  std::string provenance_json;
  std::string kernel;
  double forward_seconds = 0;
  double backward_seconds = 0;
};

FusedRankScore score_fused_rank(Communicator& comm, const ScoreRequest& request,
                                const LogitsView& hidden, const LogitsView& weight_shard,
                                const MutableLogitsView& grad_hidden,
                                const MutableLogitsView& grad_weight_shard, int threads);

// Every rank of a TP group on an in-process group: `weight` and `grad_weight` are the full
// [padded, H] matrices (each rank reads and writes its rows); grad_hidden[r] is rank r's own
// [tokens, H] gradient. Returns every rank's score, by TP rank.
std::vector<FusedRankScore> score_fused_in_process(const ScoreRequest& request,
                                                   const LogitsView& hidden,
                                                   const LogitsView& weight,
                                                   std::span<const MutableLogitsView> grad_hidden,
                                                   const MutableLogitsView& grad_weight,
                                                   int threads);

// True when every rank's logp, lse and entropy are bitwise equal to rank 0's.
bool outputs_replicated(const std::vector<RankScore>& ranks);
bool outputs_replicated(const std::vector<FusedRankScore>& ranks);

// Whether two vectors hold the same bits.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace detlogp::cli
