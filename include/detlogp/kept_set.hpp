#pragma once
// Sampling-replay kept sets (docs/numerics.md "Kept sets"): per row the ids a rollout engine
// kept when it sampled (top-k / top-p), over which the rollout renormalised its logprob. With
// kept sets the operators' logp, LSE and entropy are those of softmax over the kept set S of
// each row, logp = z[target] - LSE_S, computed by the canon on the kept scores alone, so they
// are the same bits at every TP degree, whichever rank owns which id and in whichever order the
// caller lists them.
//
//   std::vector<int64_t> ids = {5, 17, 2, -1,   9, 3, -1, -1};  // 2 rows, width 4
//   auto out = op.forward(logits, targets, contract, comm, {.kept = {.ids = ids, .width = 4}});
//
// Or recomputed from the logits, by the sampler's per-row top_k / top_p:
//
//   std::vector<int32_t> k = {50, 50};
//   auto out = op.forward(logits, targets, contract, comm, {.kept = {.top_k = k}});

#include <cstdint>
#include <span>

namespace detlogp {

// The widest kept set a call may give (ids per row, padding included).
inline constexpr int64_t kMaxKeptIds = 1024;

// What a row whose target is not in its kept set gets.
enum class OutsideKept {
  error,    // ContractError (field "kept_ids", naming the row and the target)
  neg_inf,  // logp = -inf, and that row's grad_logp contributes nothing (counts as +0)
};

// What a row of given kept ids that holds no id (only -1) gets.
enum class EmptyKeptRow {
  error,            // on an active row: ContractError (field "kept_ids", naming the row)
  full_vocabulary,  // the row is scored over the full real vocabulary: the same bits as the
                    // call without kept sets (logp, LSE, entropy and gradients), as a rollout
                    // batch's unrestricted rows (the sampler's all -1 kept rows)
};

struct KeptSetOptions {
  // [rows, width] row-major: each row's kept vocabulary ids, in any order, padded with -1.
  // Copied: need not outlive the call.
  std::span<const int64_t> ids = {};
  int64_t width = 0;  // 0 with empty ids: no kept sets (the full real vocabulary)
  OutsideKept outside = OutsideKept::error;
  EmptyKeptRow empty_rows = EmptyKeptRow::error;  // given ids: rows of only -1
  // Recomputed kept sets (docs/numerics.md "Recomputed kept sets (top-k, top-p)"), instead of
  // ids: per row [rows] the sampler's top_k (0: off, else 1 .. kMaxKeptIds) and top_p (in
  // (0, 1]; 1: off); an empty span is off for every row. Rows may mix: an unrestricted row (top_k
  // 0 and top_p 1) is scored over the full vocabulary (the bits of the call without kept sets),
  // the others over their selected sets. The result's kept_ids are the selected sets, all -1 on
  // unrestricted rows. Copied: need not outlive the call.
  std::span<const int32_t> top_k = {};
  std::span<const float> top_p = {};

  bool given() const { return width != 0 || !ids.empty(); }
  bool recomputed() const { return !top_k.empty() || !top_p.empty(); }
};

}  // namespace detlogp
