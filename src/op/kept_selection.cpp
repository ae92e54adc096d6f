#include "op/kept_selection.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detlogp/errors.hpp"
#include "numerics/canon.hpp"
#include "op/kept_sets.hpp"
#include "op/preflight.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp::op {

namespace {

using kernels::Candidate;

int32_t top_k_of(const KeptSelectionParams& p, std::size_t r) {
  return p.top_k.empty() ? 0 : p.top_k[r];
}
float top_p_of(const KeptSelectionParams& p, std::size_t r) {
  return p.top_p.empty() ? 1.0f : p.top_p[r];
}

// Top-p over `ranked` (the top-k set, or the first 1024 of the row, in the canonical ranking)
// with L the LSE its probabilities are relative to: how many of the first are kept. Token j is
// kept iff the mass strictly before it, D_j = sum_{i<j} det_exp(z_i - L) accumulated in float64
// in ranking order, is < top_p; the first token always is (D_0 = 0 < top_p).
std::size_t top_p_count(std::span<const Candidate> ranked, float lse, float top_p, double* mass) {
  double d = 0.0;
  std::size_t kept = 0;
  for (const Candidate& c : ranked) {
    if (!(d < static_cast<double>(top_p))) break;
    ++kept;
    d += static_cast<double>(canon::det_exp(c.z - lse));
  }
  *mass = d;
  return kept;
}

// Row r's kept ids, ascending, from every rank's candidates `pool`: top-k is the first `count`
// of them in the ranking (each rank sent its own first `count`, so these are the row's first
// `count` columns whatever the layout), then top-p over them.
std::vector<int64_t> kept_ids_of_row(const ShardKernels& kernels, std::vector<Candidate>& pool,
                                     std::size_t count, int32_t top_k, float top_p, float full_lse,
                                     int64_t real_vocab, int64_t row) {
  kernels::keep_first(pool, count);
  std::size_t n = pool.size();
  if (top_p < 1.0f) {
    float lse = full_lse;
    if (top_k > 0) {  // relative to the top-k set: its canonical LSE in ascending id order
      std::vector<Candidate> ascending = pool;
      std::sort(ascending.begin(), ascending.end(),
                [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
      std::vector<float> z;
      for (const Candidate& c : ascending) z.push_back(c.z);
      lse = kept_scores_lse(kernels, z);
    }
    double mass = 0.0;
    n = top_p_count(pool, lse, top_p, &mass);
    if (top_k == 0 && n == pool.size() && real_vocab > static_cast<int64_t>(pool.size()) &&
        mass < static_cast<double>(top_p)) {
      throw ContractError(
          ErrorCode::out_of_range, "top_p",
          fmt::format("top_p of row {} is {}: its kept set needs more than {} ids (the {} most "
                      "likely tokens hold probability {:.9g}, less than top_p); pass top_k <= "
                      "{} with it to cap the set",
                      row, top_p, kMaxKeptIds, kMaxKeptIds, mass, kMaxKeptIds));
    }
  }
  std::vector<int64_t> ids;
  for (std::size_t j = 0; j < n; ++j) ids.push_back(pool[j].id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

void check_kept_selection(const KeptSelectionParams& params, int64_t rows) {
  const auto n = static_cast<std::size_t>(rows);
  if (!params.top_k.empty() && params.top_k.size() != n) {
    throw ContractError(ErrorCode::wrong_shape, "top_k",
                        fmt::format("top_k has {} entries but there are {} rows; pass one top_k "
                                    "per row, or none",
                                    params.top_k.size(), rows));
  }
  if (!params.top_p.empty() && params.top_p.size() != n) {
    throw ContractError(ErrorCode::wrong_shape, "top_p",
                        fmt::format("top_p has {} entries but there are {} rows; pass one top_p "
                                    "per row, or none",
                                    params.top_p.size(), rows));
  }
  for (std::size_t r = 0; r < params.top_k.size(); ++r) {
    const int32_t k = params.top_k[r];
    if (k < 0 || k > kMaxKeptIds) {
      throw ContractError(ErrorCode::out_of_range, "top_k",
                          fmt::format("top_k of row {} is {}; top_k must be 0 (off) or 1 to {} "
                                      "(a kept set holds at most {} ids)",
                                      r, k, kMaxKeptIds, kMaxKeptIds));
    }
  }
  for (std::size_t r = 0; r < params.top_p.size(); ++r) {
    const float p = params.top_p[r];
    if (!(p > 0.0f && p <= 1.0f)) {
      throw ContractError(ErrorCode::out_of_range, "top_p",
                          fmt::format("top_p of row {} is {}; top_p must be a number in (0, 1] "
                                      "(1: off)",
                                      r, p));
    }
  }
}

void check_recomputed_kept(const KeptSetOptions& kept, int64_t rows) {
  if (!kept.recomputed()) return;
  if (kept.given()) {
    throw ContractError(ErrorCode::conflicting_fields, "kept_ids",
                        "kept_ids and top_k/top_p were both given: pass either kept_ids or "
                        "top_k/top_p");
  }
  check_kept_selection(selection_params(kept), rows);
}

bool restricts_rows(const KeptSelectionParams& params, int64_t rows) {
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    if (top_k_of(params, r) > 0 || top_p_of(params, r) < 1.0f) return true;
  }
  return false;
}

void check_targets_selected(std::span<const uint8_t> outside, std::span<const int64_t> targets,
                            OutsideKept policy) {
  if (policy != OutsideKept::error) return;
  for (std::size_t i = 0; i < outside.size(); ++i) {
    if (!outside[i]) continue;
    throw ContractError(
        ErrorCode::conflicting_fields, "targets",
        fmt::format("target id {} of row {} is not in the row's kept set selected by its "
                    "top_k/top_p; the sampled token must be kept (check the sampler's top_k and "
                    "top_p, or pass outside_kept=neg_inf to score it -inf instead)",
                    targets[i], i));
  }
}

std::vector<int64_t> candidate_counts(const KeptSelectionParams& params, int64_t rows,
                                      int64_t real_vocab) {
  std::vector<int64_t> counts(static_cast<std::size_t>(rows), 0);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const int32_t k = top_k_of(params, r);
    if (k > 0) {
      counts[r] = std::min<int64_t>(k, real_vocab);
    } else if (top_p_of(params, r) < 1.0f) {
      counts[r] = std::min<int64_t>(kMaxKeptIds, real_vocab);
    }
  }
  return counts;
}

bool needs_full_lse(const KeptSelectionParams& params, int64_t rows) {
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    if (top_k_of(params, r) == 0 && top_p_of(params, r) < 1.0f) return true;
  }
  return false;
}

float kept_scores_lse(const ShardKernels& kernels, std::span<const float> z) {
  if (z.empty()) return -canon::kInf;
  const auto n = static_cast<int64_t>(z.size());
  const TileGeometry geometry{.real_vocab = n, .tile_width = kKeptTileWidth};
  const ShardSpec spec{.vocab_start = 0, .geometry = geometry};
  const LogitsView row{
      .data = z.data(), .dtype = DType::fp32, .rows = 1, .cols = n, .row_stride = n};
  const std::vector<TreeNode> nodes = canonical_cover(geometry, 0, geometry.num_real_tiles());
  std::vector<NodePartial> partials(nodes.size());
  const ExecOptions one_thread{.threads = 1};  // at most 1024 columns: not worth a thread
  kernels.node_partials(row, spec, nodes, /*with_entropy=*/false, partials, one_thread);
  float lse = 0.0f;
  kernels.merge_roots(geometry, nodes, partials, 1, RootsOut{.lse = {&lse, 1}}, one_thread);
  return lse;
}

std::vector<Candidate> all_gather_candidates(Communicator& comm, std::span<const Candidate> local,
                                             std::string_view step) {
  std::vector<Candidate> gathered(local.begin(), local.end());
  if (comm.size() > 1) {
    gathered.resize(local.size() * static_cast<std::size_t>(comm.size()));
    collective_step(step, [&] { all_gather(comm, local, std::span<Candidate>(gathered)); });
  }
  return gathered;
}

void pool_of_row(std::span<const Candidate> gathered, int ranks, int64_t rows, int64_t width,
                 int64_t r, std::vector<Candidate>& pool) {
  // Each rank's first candidates of the row, then its padding.
  pool.clear();
  for (int rank = 0; rank < ranks; ++rank) {
    const Candidate* block = gathered.data() + (static_cast<int64_t>(rank) * rows + r) * width;
    for (int64_t j = 0; j < width && block[j].id >= 0; ++j) pool.push_back(block[j]);
  }
}

KeptSelection select_kept_sets(Communicator& comm, const ShardKernels& kernels,
                               const KeptSelectionParams& params, int64_t rows,
                               std::span<const Candidate> local, int64_t width, int64_t real_vocab,
                               std::span<const float> full_lse) {
  const std::vector<int64_t> counts = candidate_counts(params, rows, real_vocab);
  if (static_cast<int64_t>(local.size()) != rows * width ||
      (needs_full_lse(params, rows) && static_cast<int64_t>(full_lse.size()) != rows)) {
    throw ContractError(ErrorCode::wrong_shape, "",
                        fmt::format("select_kept_sets: {} candidates for {} rows of width {} and "
                                    "{} LSE values; expected rows * width candidates and one "
                                    "LSE per row when a row has top-p without top-k",
                                    local.size(), rows, width, full_lse.size()));
  }
  KeptSelection out;
  if (width == 0) return out;
  const std::vector<Candidate> gathered =
      all_gather_candidates(comm, local, "kept-set candidates all-gather");

  std::vector<std::vector<int64_t>> kept(static_cast<std::size_t>(rows));
  std::vector<Candidate> pool;
  for (int64_t r = 0; r < rows; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    if (counts[ri] == 0) continue;
    pool_of_row(gathered, comm.size(), rows, width, r, pool);
    kept[ri] = kept_ids_of_row(kernels, pool, static_cast<std::size_t>(counts[ri]),
                               top_k_of(params, ri), top_p_of(params, ri),
                               full_lse.empty() ? 0.0f : full_lse[ri], real_vocab, r);
    out.width = std::max(out.width, static_cast<int64_t>(kept[ri].size()));
  }
  out.ids.assign(static_cast<std::size_t>(rows * out.width), -1);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t>& ids = kept[static_cast<std::size_t>(r)];
    std::copy(ids.begin(), ids.end(), out.ids.begin() + r * out.width);
  }
  return out;
}

KeptSelection select_kept_sets_of_logits(Communicator& comm, const ShardKernels& kernels,
                                         const LogprobContract& c, const LogitsView& shard,
                                         std::span<const float> row_temperature,
                                         const KeptSelectionParams& params,
                                         std::span<const float> full_lse, const ExecOptions& exec) {
  const ShardSpec spec{.vocab_start = c.sharding().local_vocab_start(),
                       .geometry = tile_geometry(c),
                       .temperature = c.temperature(),
                       .softcap = c.softcap().value_or(0.0f),
                       .row_temperature = row_temperature};
  const std::vector<int64_t> counts =
      candidate_counts(params, shard.rows, c.sharding().real_vocab_size());
  const int64_t width = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  std::vector<Candidate> local(static_cast<std::size_t>(shard.rows * width));
  kernels::shard_top_candidates(shard, spec, counts, width, local, exec);
  return select_kept_sets(comm, kernels, params, shard.rows, local, width,
                          c.sharding().real_vocab_size(), full_lse);
}

KeptSelection select_kept_sets_of_fused(Communicator& comm, const FusedKernels& kernels,
                                        const FusedShard& shard, const KeptSelectionParams& params,
                                        std::span<const float> full_lse, const ExecOptions& exec) {
  const int64_t rows = shard.hidden.rows;
  const std::vector<int64_t> counts = candidate_counts(params, rows, shard.geometry.real_vocab);
  const int64_t width = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  std::vector<Candidate> local(static_cast<std::size_t>(rows * width));
  kernels::fused_top_candidates(kernels, shard, counts, width, local, exec);
  return select_kept_sets(comm, kernels.shard_kernels(), params, rows, local, width,
                          shard.geometry.real_vocab, full_lse);
}

}  // namespace detlogp::op
