#include "op/preflight.hpp"

#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "detlogp/version.hpp"
#include "op/preflight_record.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp::op {

PreflightFacts call_facts(std::string_view phase, const LogprobContract& c, std::string backend_id,
                          bool entropy, int64_t rows) {
  const ShardingSpec& sh = c.sharding();
  PreflightFacts facts;
  facts.phase = phase;
  facts.fingerprint = c.cross_rank_fingerprint();
  facts.backend_id = std::move(backend_id);
  facts.numerics_version = std::string(kNumericsVersion);
  facts.tile_width = c.tile_width();
  facts.deterministic = true;
  facts.entropy = entropy;
  std::tie(facts.local_begin, facts.local_end) =
      tile_range(sh.vocab_shard_bounds()[sh.tp_rank()], c.tile_width());
  facts.rows = rows;
  return facts;
}

int64_t preflight_record_bytes() { return static_cast<int64_t>(sizeof(PreflightRecord)); }

void run_preflight(Communicator& comm, const PreflightFacts& mine) {
  const PreflightRecord own = encode_record(mine);
  std::vector<PreflightRecord> all(static_cast<std::size_t>(comm.size()));
  const std::string step =
      mine.phase.empty() ? std::string("cross-rank preflight all-gather")
                         : fmt::format("cross-rank preflight all-gather of the {}", mine.phase);
  collective_step(step, [&] {
    all_gather(comm, std::span<const PreflightRecord>(&own, 1), std::span<PreflightRecord>(all));
  });

  // Every rank walks the same records in the same order, so every rank reaches the same
  // verdict and throws the same message (except the failing rank, which keeps its own).
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].local_ok) {
      if (static_cast<int>(r) == comm.rank()) throw ContractError(*mine.local_error);
      throw ContractError(
          ErrorCode::ranks_disagree, "",
          fmt::format("cross-rank preflight failed: rank {} failed local validation: {}", r,
                      std::string(all[r].local_error.data(),
                                  strnlen(all[r].local_error.data(), all[r].local_error.size()))));
    }
  }
  // Ranks in different calls (one in forward, one in backward) disagree on everything else
  // too: say so first, not which field happened to differ.
  if (auto why = phase_disagreement(all)) {
    throw ContractError(ErrorCode::ranks_disagree, "", "cross-rank preflight failed: " + *why);
  }
  if (auto why = layout_disagreement(all)) {
    throw ContractError(ErrorCode::ranks_disagree, "rows_layout",
                        "cross-rank preflight failed: " + *why);
  }
  if (auto why = first_disagreement(all)) {
    throw ContractError(ErrorCode::ranks_disagree, "", "cross-rank preflight failed: " + *why);
  }
  if (auto why = row_temperature_disagreement(all)) {
    throw ContractError(ErrorCode::ranks_disagree, "temperature",
                        "cross-rank preflight failed: " + *why);
  }
  if (auto why = kept_disagreement(all)) {
    throw ContractError(ErrorCode::ranks_disagree, "kept_ids",
                        "cross-rank preflight failed: " + *why);
  }
  for (const char* field : {"top_k", "top_p"}) {
    if (auto why = kept_selection_disagreement(all, field)) {
      throw ContractError(ErrorCode::ranks_disagree, field, "cross-rank preflight failed: " + *why);
    }
  }
  for (const char* field : {"seeds", "positions", "num_logprobs"}) {
    if (auto why = sample_disagreement(all, field)) {
      throw ContractError(ErrorCode::ranks_disagree, field, "cross-rank preflight failed: " + *why);
    }
  }
  // Local ranges must tile the vocabulary in rank order (the fingerprint covers the bounds;
  // this catches a rank that passed a shard other than the one its contract names).
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].local_begin != all[r - 1].local_end) {
      throw ContractError(
          ErrorCode::ranks_disagree, "vocab_shard_bounds",
          fmt::format("cross-rank preflight failed: rank {} has local range [{}, {}) but rank {} "
                      "ends at {}; ranks must hold contiguous shards in rank order",
                      r, all[r].local_begin, all[r].local_end, r - 1, all[r - 1].local_end));
    }
  }
}

void check_then_preflight(Communicator& comm, int64_t tp_world_size, PreflightFacts facts,
                          const std::function<void()>& local_checks) {
  std::exception_ptr local_exception;  // rethrown here with its code and field
  try {
    local_checks();
  } catch (const ContractError& e) {
    if (comm.size() == 1) throw;
    facts.local_error = e.what();
    local_exception = std::current_exception();
  }
  if (tp_world_size <= 1 && comm.size() <= 1) return;
  try {
    run_preflight(comm, facts);
  } catch (const ContractError& e) {
    // The preflight rethrows only this rank's message; keep the original error's code.
    if (local_exception && e.what() == *facts.local_error) std::rethrow_exception(local_exception);
    throw;
  }
}

}  // namespace detlogp::op
