#include "op/preflight.hpp"

#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "op/preflight_record.hpp"

namespace detlogp::op {

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

}  // namespace detlogp::op
