#pragma once
// Deterministic sampling on the rollout side (docs/sampler.md; the canon: docs/numerics.md
// "Sampling"). Each TP rank passes its shard of the logits [rows, local_vocab]; every rank gets
// the same tokens, drawn by Gumbel-max with a counter-based generator keyed by each row's seed
// and position, so a row's token is a function of its scored logits, seed and position only:
// the same at every TP degree, shard layout, batch composition, row order and thread count. The
// logprobs are bitwise those the trainer's operator computes for the sampled tokens.
//
//   std::vector<int64_t> seeds = {7, 7}, positions = {0, 1};
//   std::vector<float> temperature = {1.0f, 0.0f};  // row 1 greedy
//   SampleResult s = sample(op, logits, contract, comm,
//                           {.seeds = seeds, .positions = positions, .temperature = temperature});

#include <cstdint>
#include <span>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"

namespace detlogp {

struct SampleOptions {
  // [rows] each row's request seed (any 64-bit value; its bits key the generator).
  std::span<const int64_t> seeds = {};
  // [rows] each row's position in its request's output (>= 0; the generator's counter).
  std::span<const int64_t> positions = {};
  // [rows] per-row temperatures (finite, >= 0; 0: greedy, scored at temperature 1), or empty:
  // every row uses the contract's temperature. With per-row values the contract's must be 1.
  std::span<const float> temperature = {};
  // [rows] the sampler's top_k (0: off, else 1 .. kMaxKeptIds) and top_p (in (0, 1]; 1: off),
  // or empty (off for every row); restricted and unrestricted rows may mix. Each restricted
  // row's kept set is recomputed exactly as the trainer's (detlogp/kept_set.hpp).
  std::span<const int32_t> top_k = {};
  std::span<const float> top_p = {};
  // N: also return each row's first N ids of the ranking (z descending, then id ascending) over
  // the real vocabulary with their full-vocabulary logprobs; 0 .. min(kMaxKeptIds, real vocab).
  int64_t num_logprobs = 0;
  ExecOptions exec = {};
};

// Replicated bitwise on every TP rank.
struct SampleResult {
  std::vector<int64_t> tokens;  // [rows]
  // [rows] the operator's logp of the token with the row's kept set (the full one on
  // unrestricted rows): forward(targets = tokens, row temperatures, kept sets), bitwise.
  std::vector<float> logp;
  // [rows] the operator's full-vocabulary logp of the token: forward(targets = tokens, row
  // temperatures), bitwise.
  std::vector<float> full_logp;
  // [rows, kept_width] each row's kept set ascending, -1 padded (an unrestricted row all -1);
  // empty with width 0 when no row is restricted. What ForwardOptions::kept takes as ids.
  std::vector<int64_t> kept_ids;
  int64_t kept_width = 0;
  // [rows, num_logprobs] the ranking's first ids and their full-vocabulary logp.
  std::vector<int64_t> top_ids;
  std::vector<float> top_logp;
  int64_t num_logprobs = 0;
};

// Samples one token per row of `local_logits` (this rank's shard, as LogprobOp::forward takes
// it) with `op`, which must run the canon over host-memory kernels (LogprobOp::shard_kernels()
// with kept sets; else ContractError not_supported). Inputs are checked on every rank
// (ContractError naming the field, the row and the value) and compared across ranks by the
// preflight (ranks_disagree, field seeds / positions / temperature / top_k / top_p /
// num_logprobs); ranks fail together, never hang. Collectives: a preflight, the operator's
// forward, then one all-gather of 16 bytes per row (plus the kept sets' candidates when rows are
// restricted and the top-N candidates when num_logprobs > 0).
SampleResult sample(const LogprobOp& op, const LogitsView& local_logits,
                    const LogprobContract& contract, Communicator& comm,
                    const SampleOptions& options = {});

}  // namespace detlogp
