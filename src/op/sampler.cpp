// detlogp::sample: the trainer's forward and kept sets, one draw per row, the trainer's logp.
// The draw's arithmetic lives in kernels/common/gumbel_scan and numerics/philox.hpp; this file
// checks the call, decides who computes what and moves bytes.

#include "op/sampler.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "detlogp/kept_set.hpp"
#include "kernels/common/top_candidates.hpp"
#include "numerics/canon.hpp"
#include "op/call_checks.hpp"
#include "op/full_vocabulary_rows.hpp"
#include "op/kept_selection.hpp"
#include "op/kept_sets.hpp"
#include "op/preflight.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp {

namespace op {

namespace {

void check_per_row_length(std::size_t n, int64_t rows, const char* field, const char* what) {
  if (static_cast<int64_t>(n) != rows) {
    throw ContractError(ErrorCode::wrong_shape, field,
                        fmt::format("{} has {} entries but there are {} rows; pass one {} per row",
                                    field, n, rows, what));
  }
}

}  // namespace

void check_sample_options(const SampleOptions& o, int64_t rows, const LogprobContract& c) {
  check_per_row_length(o.seeds.size(), rows, "seeds", "seed (the request's)");
  check_per_row_length(o.positions.size(), rows, "positions",
                       "position (the token's index in its request's output)");
  for (std::size_t r = 0; r < o.positions.size(); ++r) {
    if (o.positions[r] < 0) {
      throw ContractError(ErrorCode::out_of_range, "positions",
                          fmt::format("position of row {} is {}; positions must be >= 0 (the "
                                      "token's index in its request's output)",
                                      r, o.positions[r]));
    }
  }
  if (!o.temperature.empty()) {
    check_per_row_length(o.temperature.size(), rows, "temperature", "temperature (or none)");
    for (std::size_t r = 0; r < o.temperature.size(); ++r) {
      const float t = o.temperature[r];
      if (!std::isfinite(t) || !(t >= 0.0f)) {
        throw ContractError(ErrorCode::out_of_range, "temperature",
                            fmt::format("temperature of row {} is {}; every row's temperature "
                                        "must be a finite number >= 0 (0: greedy)",
                                        r, t));
      }
    }
    check_row_temperature(scoring_temperatures(o.temperature), rows, c);
  }
  check_kept_selection({.top_k = o.top_k, .top_p = o.top_p}, rows);
  const int64_t most = std::min<int64_t>(kMaxKeptIds, c.sharding().real_vocab_size());
  if (o.num_logprobs < 0 || o.num_logprobs > most) {
    throw ContractError(
        ErrorCode::out_of_range, "num_logprobs",
        fmt::format("num_logprobs is {}; pass 0 (none) to {} (at most {} and the "
                    "real vocabulary of {} ids)",
                    o.num_logprobs, most, kMaxKeptIds, c.sharding().real_vocab_size()));
  }
}

std::vector<float> scoring_temperatures(std::span<const float> temperature) {
  std::vector<float> out(temperature.begin(), temperature.end());
  for (float& t : out) {
    if (t == 0.0f) t = 1.0f;
  }
  return out;
}

std::vector<kernels::Draw> merge_draws(Communicator& comm, std::span<const kernels::Draw> local) {
  if (comm.size() <= 1) return {local.begin(), local.end()};
  std::vector<kernels::Draw> all(local.size() * static_cast<std::size_t>(comm.size()));
  collective_step("sampler all-gather of the draws",
                  [&] { all_gather(comm, local, std::span<kernels::Draw>(all)); });
  std::vector<kernels::Draw> best(local.size());  // id -1: every rank's draw beats it
  for (int rank = 0; rank < comm.size(); ++rank) {
    for (std::size_t r = 0; r < best.size(); ++r) {
      const kernels::Draw& d = all[static_cast<std::size_t>(rank) * local.size() + r];
      if (kernels::draw_beats(d, best[r])) best[r] = d;
    }
  }
  return best;
}

}  // namespace op

SampleResult sample(const LogprobOp& op, const LogitsView& logits, const LogprobContract& c,
                    Communicator& comm, const SampleOptions& o) {
  const ShardingSpec& sh = c.sharding();
  const int64_t rows = logits.rows;
  const ShardKernels* kernels = op.shard_kernels();
  const std::vector<int64_t> zeros(static_cast<std::size_t>(std::max<int64_t>(rows, 0)), 0);
  std::vector<float> tau;  // the rows' scoring temperatures (none: the contract's)

  // 1. Local checks, then the preflight of the sampler's inputs (every rank fails together).
  op::PreflightFacts facts = op::call_facts(op::kSamplePhase, c, op.backend_id(), false, rows);
  facts.contract = &c;
  facts.row_temperature = o.temperature;
  facts.top_k = o.top_k;
  facts.top_p = o.top_p;
  facts.seeds = o.seeds;
  facts.positions = o.positions;
  facts.num_logprobs = o.num_logprobs;
  op::check_then_preflight(comm, sh.tp_world_size(), std::move(facts), [&] {
    if (kernels == nullptr || !kernels->supports_kept_sets()) {
      throw ContractError(ErrorCode::not_supported, "op",
                          fmt::format("{} ({}) cannot sample: the sampler scans the shard in host "
                                      "memory with the canon's kernels; use a CPU backend",
                                      op.backend_id(), op.kernel_name()));
    }
    check_forward_inputs(logits, zeros, c);
    op::check_sample_options(o, rows, c);
    op::check_transport_and_targets(comm, {}, c, /*validate=*/false);
    tau = op::scoring_temperatures(o.temperature);
  });

  // 2. The full forward: every row's LSE (the targets do not change it).
  ForwardOptions forward{.exec = o.exec, .row_temperature = tau};
  const LogprobResult full = op.forward(logits, zeros, c, comm, forward);

  // 3. Kept sets of the restricted rows, exactly as the trainer recomputes them.
  const op::KeptSelectionParams params{.top_k = o.top_k, .top_p = o.top_p};
  op::KeptSelection kept;
  if (op::restricts_rows(params, rows)) {
    kept = op::select_kept_sets_of_logits(comm, *kernels, c, logits, tau, params, full.lse, o.exec);
  }

  // 4. The draw: each rank's best key per row, one all-gather, the same maximum on every rank.
  const ShardSpec spec{.vocab_start = sh.local_vocab_start(),
                       .geometry = op::tile_geometry(c),
                       .temperature = c.temperature(),
                       .softcap = c.softcap().value_or(0.0f),
                       .row_temperature = tau};
  std::vector<uint8_t> greedy(static_cast<std::size_t>(rows), 0);
  for (std::size_t r = 0; r < o.temperature.size(); ++r) greedy[r] = o.temperature[r] == 0.0f;
  std::vector<kernels::Draw> local(static_cast<std::size_t>(rows));
  kernels::shard_draws(logits, spec,
                       {.seeds = o.seeds,
                        .positions = o.positions,
                        .greedy = greedy,
                        .kept = kept.ids,
                        .kept_width = kept.width},
                       local, o.exec);
  const std::vector<kernels::Draw> drawn = op::merge_draws(comm, local);

  SampleResult out;
  out.tokens.resize(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < drawn.size(); ++r) out.tokens[r] = drawn[r].id;

  // 5. The full logp: the operator's formula with its LSE and the token's z.
  const std::vector<bool>& active = c.mask().active_mask();
  out.full_logp.assign(static_cast<std::size_t>(rows), 0.0f);
  for (std::size_t r = 0; r < drawn.size(); ++r) {
    if (active[r]) out.full_logp[r] = canon::selected_logp(drawn[r].z, full.lse[r]);
  }

  // 6. The kept logp of restricted rows: the operator's kept forward over the selected sets,
  //    the full logp on unrestricted rows (the operators' rule for mixed batches).
  out.logp = out.full_logp;
  if (kept.width > 0) {
    std::vector<uint8_t> active_rows(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < active_rows.size(); ++r) active_rows[r] = active[r] ? 1 : 0;
    op::KeptOutputs k =
        op::kept_forward(comm, sh, *kernels, kept.ids, kept.width, out.tokens, active_rows,
                         /*entropy=*/false, op::read_scores_of(logits, spec), o.exec);
    op::take_full_rows(op::full_vocabulary_rows(kept.ids, rows, kept.width), out.full_logp, {}, {},
                       k);
    out.logp = std::move(k.logp);
  }
  out.kept_ids = std::move(kept.ids);
  out.kept_width = kept.width;

  // 7. The ranking's first N ids and their full logp.
  const int64_t n = o.num_logprobs;
  out.num_logprobs = n;
  if (n > 0) {
    const std::vector<int64_t> counts(static_cast<std::size_t>(rows), n);
    std::vector<kernels::Candidate> first(static_cast<std::size_t>(rows * n));
    kernels::shard_top_candidates(logits, spec, counts, n, first, o.exec);
    const std::vector<kernels::Candidate> gathered =
        op::all_gather_candidates(comm, first, "sampler all-gather of the top candidates");
    out.top_ids.assign(static_cast<std::size_t>(rows * n), -1);
    out.top_logp.assign(static_cast<std::size_t>(rows * n), 0.0f);
    std::vector<kernels::Candidate> pool;
    for (int64_t r = 0; r < rows; ++r) {
      op::pool_of_row(gathered, comm.size(), rows, n, r, pool);
      kernels::keep_first(pool, static_cast<std::size_t>(n));
      const auto ri = static_cast<std::size_t>(r);
      for (std::size_t j = 0; j < pool.size(); ++j) {
        out.top_ids[ri * static_cast<std::size_t>(n) + j] = pool[j].id;
        if (active[ri]) {
          out.top_logp[ri * static_cast<std::size_t>(n) + j] =
              canon::selected_logp(pool[j].z, full.lse[ri]);
        }
      }
    }
  }
  return out;
}

}  // namespace detlogp
