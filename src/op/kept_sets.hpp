#pragma once
// Kept sets (docs/numerics.md "Kept sets"), written once for both operators: the checks of the
// caller's ids, their resolution (each row ascending, -1 padded), the exchange of the kept
// scores (each rank reads the ids it owns, one all-gather, each slot taken from its owner), the
// canon's LSE / entropy of each row's kept scores, logp, and the logits operator's backward.
//
// resolve_kept_ids + kept_forward is the entry point for any producer of kept sets: given the
// resolved [rows, width] ids and a way to read the scores of local columns, it returns the
// outputs over the sets.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kept_set.hpp"
#include "detlogp/kernels.hpp"

namespace detlogp::op {

// The caller's kept ids against the call (ContractError, field "kept_ids", naming the row, the
// id and the fix): width in [1, kMaxKeptIds] (or no ids at all with width 0), rows * width ids,
// each in [-1, real vocabulary), no id twice in a row, every row holds at least one id unless
// it is inactive or kept.empty_rows is EmptyKeptRow::full_vocabulary (then a row of only -1 is
// a full-vocabulary row), and with OutsideKept::error every active row's target is in its set
// (rows of only -1 aside). Every
// row's list is checked, inactive rows' too (it is the caller's data); only the targets of
// inactive rows are not looked at.
void check_kept_ids(const KeptSetOptions& kept, int64_t rows, std::span<const int64_t> targets,
                    const LogprobContract& c);

// Each row's ids in ascending order, then the -1 padding: [rows, width].
std::vector<int64_t> resolve_kept_ids(std::span<const int64_t> ids, int64_t rows, int64_t width);

// Reads the scored values z (the bits of the kernels' read_target_logits) of the local columns
// [rows, width] (out[k] for local_cols[k] >= 0; slots with -1 get +0).
using ReadScores =
    std::function<void(std::span<const int64_t> local_cols, int64_t width, std::span<float> out)>;

// The logits operator's ReadScores: the shard's own logits in host memory (kernels whose
// supports_kept_sets() is true), each row's slots loaded together before they are scored, so
// that the loads of scattered columns overlap. The fused lm_head's: one canonical dot per slot
// (FusedKernels::read_target_logits). They keep references: the arguments must outlive the
// call.
ReadScores read_scores_of(const LogitsView& shard, const ShardSpec& spec);
ReadScores read_scores_of(const FusedKernels& kernels, const FusedShard& shard);

// The logp gradient backward uses over kept sets: +0 on rows whose target is outside their set
// (OutsideKept::neg_inf: logp is -inf, a constant), `outside` as KeptOutputs::outside.
void drop_outside_grad_logp(std::span<float> grad_logp, std::span<const uint8_t> outside);

// The outputs over the kept sets, replicated bitwise on every rank.
struct KeptOutputs {
  std::vector<float> logp;       // [rows]; +0 on inactive rows, -inf where the target is outside
  std::vector<float> lse;        // [rows] LSE_S
  std::vector<float> entropy;    // [rows] H_S when asked for
  std::vector<uint8_t> outside;  // 1 on active rows whose target is not in the set
};

// The forward over resolved kept ids (resolve_kept_ids): every rank reads the scores of the
// ids it owns through `read`, one all-gather of [rows, width] floats, then each row's kept
// scores in ascending id order are reduced by `kernels`' node_partials and merge_roots as a
// vocabulary of |S_row| columns (tile width kKeptTileWidth, temperature 1, no softcap).
// `active` is 1 per active row; `targets` are the global target ids.
KeptOutputs kept_forward(Communicator& comm, const ShardingSpec& sharding,
                         const ShardKernels& kernels, std::span<const int64_t> kept, int64_t width,
                         std::span<const int64_t> targets, std::span<const uint8_t> active,
                         bool entropy, const ReadScores& read, const ExecOptions& exec);

// The tile width of the kept rows' canonical tree (fixed: it is part of the canon).
inline constexpr int64_t kKeptTileWidth = 128;

// The logits operator's backward with kept sets: `grad` zero-filled, then each kept column this
// shard holds (global ids [global_begin, min(global_begin + cols, real_vocab)), local column
// id - global_begin) gets the canon's gradient (canon::grad_of_logit with the row's LSE_S and H_S,
// p = 0 outside S). in.grad_logp must already be +0 on inactive rows and on rows whose target is
// outside their set. Rows marked 1 in `skip_rows` (the full-vocabulary rows of a mixed batch,
// op/full_vocabulary_rows.hpp; empty: none) are left untouched.
void kept_backward(const LogitsView& logits, const ShardSpec& spec, std::span<const int64_t> kept,
                   int64_t width, int64_t global_begin, int64_t real_vocab,
                   const BackwardInputs& in, const MutableLogitsView& grad,
                   std::span<const uint8_t> skip_rows = {});

}  // namespace detlogp::op
