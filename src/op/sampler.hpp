#pragma once
// The sampler's pieces in the op layer (detlogp/sampler.hpp; the canon: docs/numerics.md
// "Sampling"): its input checks, the temperatures rows are scored at, and the exchange of the
// ranks' draws.

#include <cstdint>
#include <span>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/sampler.hpp"
#include "kernels/common/gumbel_scan.hpp"

namespace detlogp::op {

// The sampler's own inputs (ContractError naming the field, the first bad row and its value, and
// the fix), in this order: seeds and positions one per row, positions >= 0; temperatures one per
// row (or none), each finite and >= 0, the contract's temperature 1 with them; top_k / top_p
// (check_kept_selection: mixed restricted and unrestricted rows are fine); num_logprobs in
// [0, min(kMaxKeptIds, real vocabulary)].
void check_sample_options(const SampleOptions& options, int64_t rows, const LogprobContract& c);

// The per-row temperatures the rows are scored at: a greedy row's (0) is 1; empty for none.
std::vector<float> scoring_temperatures(std::span<const float> temperature);

// Every rank's draws [rows] by one all-gather (none at one rank); each row's winner, the same on
// every rank (kernels::draw_beats: a maximum under a total order, so the rank order does not
// matter).
std::vector<kernels::Draw> merge_draws(Communicator& comm, std::span<const kernels::Draw> local);

}  // namespace detlogp::op
