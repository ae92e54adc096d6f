#pragma once
// Recomputed kept sets (docs/numerics.md "Recomputed kept sets (top-k, top-p)"): each row's
// kept set S from its top_k and top_p, applied to the scored logits z, the same ids at every
// TP degree, batch composition, row order, thread count and SIMD target. Each rank scans its
// shard for its first candidates in the canonical ranking (kernels/common/top_candidates), one
// all-gather moves every rank's candidates ([rows, width] (id, z) pairs, bytes O(rows x
// width) per rank), and every rank merges the same candidates into the same S.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kept_set.hpp"
#include "detlogp/kernels.hpp"
#include "kernels/common/top_candidates.hpp"

namespace detlogp::op {

// Per-row sampling parameters; an empty span is "off" for every row.
struct KeptSelectionParams {
  std::span<const int32_t> top_k = {};  // [rows]: 0 = off, else 1 .. kMaxKeptIds
  std::span<const float> top_p = {};    // [rows]: in (0, 1]; 1 = off
};

// The parameters' checks (ContractError, fields "top_k" and "top_p"; the message names the first
// bad row, its value and the fix): one value per row or none; top_k in [0, 1024]; top_p in
// (0, 1] (NaN rejected).
void check_kept_selection(const KeptSelectionParams& params, int64_t rows);

// The parameters of recomputed kept sets in KeptSetOptions (its top_k and top_p).
inline KeptSelectionParams selection_params(const KeptSetOptions& kept) {
  return {.top_k = kept.top_k, .top_p = kept.top_p};
}

// The operators' local checks of recomputed kept sets (ContractError): not together with kept
// ids (conflicting_fields, "pass either kept_ids or top_k/top_p"), then check_kept_selection.
// Rows may mix restricted and unrestricted (op/full_vocabulary_rows.hpp).
void check_recomputed_kept(const KeptSetOptions& kept, int64_t rows);

// Whether some row is restricted (top_k > 0 or top_p < 1); else the call is the
// full-vocabulary one.
bool restricts_rows(const KeptSelectionParams& params, int64_t rows);

// After the kept forward over selected sets, with OutsideKept::error: ContractError (field
// "targets", naming the first active row whose target is outside its selected set). The sets are
// the same on every rank, so every rank throws alike.
void check_targets_selected(std::span<const uint8_t> outside, std::span<const int64_t> targets,
                            OutsideKept policy);

// Candidates row r needs from every shard (and keeps after the merge): min(top_k, R) with
// top-k, else min(1024, R) when top_p < 1, else 0 (an unrestricted row).
std::vector<int64_t> candidate_counts(const KeptSelectionParams& params, int64_t rows,
                                      int64_t real_vocab);

// Whether some row applies top-p without top-k: its probabilities need the full canonical LSE
// of the row (the forward's roots).
bool needs_full_lse(const KeptSelectionParams& params, int64_t rows);

// The kept sets of a call.
struct KeptSelection {
  std::vector<int64_t> ids;  // [rows, width]: row r's kept ids ascending, -1 padded; an
                             // unrestricted row (top_k 0, top_p 1) is all -1
  int64_t width = 0;         // the largest kept set (0: no row restricted)
};

// The candidates' exchange: every rank's [rows, width] candidates (`local` on each) by one
// all-gather named `step` (a copy of `local` at one rank), [ranks][rows][width].
std::vector<kernels::Candidate> all_gather_candidates(Communicator& comm,
                                                      std::span<const kernels::Candidate> local,
                                                      std::string_view step);

// Row r's candidates from every rank's block of `gathered` (each rank's, up to its padding),
// into `pool` (cleared first).
void pool_of_row(std::span<const kernels::Candidate> gathered, int ranks, int64_t rows,
                 int64_t width, int64_t r, std::vector<kernels::Candidate>& pool);

// The exchange and the merge, on every rank: `local` is this rank's [rows, width] candidates
// (kernels::shard_top_candidates or fused_top_candidates with candidate_counts; width = the
// largest count), one all-gather, then per row: the first count candidates of every rank's in
// the canonical ranking (top-k), then top-p over them (a top-k set's LSE from `kernels`, any
// CPU kernels: they give the same bits). `full_lse` [rows] is the canonical LSE
// of each row, needed where needs_full_lse (may be empty otherwise). The ranks must already
// agree on the parameters (the preflight compares their digests). A top-p set that needs more
// than 1024 ids throws ContractError (field "top_p") on every rank alike.
KeptSelection select_kept_sets(Communicator& comm, const ShardKernels& kernels,
                               const KeptSelectionParams& params, int64_t rows,
                               std::span<const kernels::Candidate> local, int64_t width,
                               int64_t real_vocab, std::span<const float> full_lse);

// The canonical LSE of kept scores listed in ascending id order, as if they were a vocabulary
// of z.size() real columns (tiles of kKeptTileWidth, the canonical tree, the root), as
// kept_forward reduces a kept row, by `kernels` (host memory); -inf for none.
float kept_scores_lse(const ShardKernels& kernels, std::span<const float> z);

// The whole selection for the logits operator's shard on this rank: the scan (z as
// read_target_logits computes it: the contract's softcap and temperature, or the per-row
// temperatures; rows spread over exec.threads), then select_kept_sets.
KeptSelection select_kept_sets_of_logits(Communicator& comm, const ShardKernels& kernels,
                                         const LogprobContract& c, const LogitsView& shard,
                                         std::span<const float> row_temperature,
                                         const KeptSelectionParams& params,
                                         std::span<const float> full_lse,
                                         const ExecOptions& exec = {});

// The same for the fused lm_head's shard (candidates from blocks of canonical logits).
KeptSelection select_kept_sets_of_fused(Communicator& comm, const FusedKernels& kernels,
                                        const FusedShard& shard, const KeptSelectionParams& params,
                                        std::span<const float> full_lse,
                                        const ExecOptions& exec = {});

}  // namespace detlogp::op
