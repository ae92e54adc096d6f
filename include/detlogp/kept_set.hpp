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

struct KeptSetOptions {
  // [rows, width] row-major: each row's kept vocabulary ids, in any order, padded with -1.
  // Copied: need not outlive the call.
  std::span<const int64_t> ids = {};
  int64_t width = 0;  // 0 with empty ids: no kept sets (the full real vocabulary)
  OutsideKept outside = OutsideKept::error;

  bool given() const { return width != 0 || !ids.empty(); }
};

}  // namespace detlogp
