#pragma once
// The operators' checks of a call, written once: each rule throws ContractError with its code,
// the field it is about and a message that names the bad value and the fix. The logits
// operator and the fused operator call them in their own order (docs/operator.md, "What
// forward does"; docs/fused.md).

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "op/saved_forward.hpp"

namespace detlogp::op {

// A 2-D row-major matrix with data (when not empty) and row_stride >= cols. `prefix` starts the
// message (e.g. "linear_logits: ").
void check_matrix(const LogitsView& m, std::string_view field, std::string_view prefix = {});

// The shard's vocabulary width: `cols` (what `field` has, said as `what`: "vocab columns")
// must be the contract's local shard size.
void check_local_vocab(int64_t cols, std::string_view field, std::string_view what,
                       const LogprobContract& c);

// `rows` rows of `field` against the contract's num_tokens.
void check_num_tokens(int64_t rows, std::string_view field, const LogprobContract& c);

// One target per row (`rows_of`: whose rows, e.g. "logits").
void check_one_target_per_row(std::span<const int64_t> targets, int64_t rows,
                              std::string_view rows_of);

// Per-row temperatures (empty: none): one per row, the contract's temperature 1, each finite and
// > 0 (field "temperature"; the message names the first bad row and its value).
void check_row_temperature(std::span<const float> row_temperature, int64_t rows,
                           const LogprobContract& c);

// `field`'s dtype against the contract's.
void check_dtype(DType dtype, std::string_view field, const LogprobContract& c);

// The last checks of every call, in this order: the communicator is the contract's TP group
// (size, then rank); with `validate`, the active targets lie in the real vocabulary.
void check_transport_and_targets(const Communicator& comm, std::span<const int64_t> targets,
                                 const LogprobContract& c, bool validate);

// The saved state of `fwd`, which the operator `backend_id` (of kind `producer`) must have made:
// backward only accepts its own op's results.
const SavedForward& saved_state_of(const LogprobResult& fwd, SavedForward::Producer producer,
                                   std::string_view backend_id);

// The logits gradient `grad`: the logits' shape and dtype, with data.
void check_logits_grad(const MutableLogitsView& grad, const LogitsView& logits);

// Backward's incoming gradients: one entry per token each (or none), and no grad_entropy when
// forward computed no entropy.
void check_grads(const LogprobGrads& grads, int64_t rows, bool has_entropy);

// grad_logp with the inactive rows' entries set to +0 (they get no logp gradient); empty when
// not supplied.
std::vector<float> active_grad_logp(std::span<const float> grad_logp,
                                    std::span<const uint8_t> active);

// With validate: every active row's LSE must be finite (checked after the roots, on every rank
// alike). `field`: the input blamed.
void check_finite_lse(const std::vector<bool>& active, std::span<const float> lse,
                      std::string_view field);

}  // namespace detlogp::op
