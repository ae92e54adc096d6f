#include "op/kept_sets.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"
#include "op/forward_exchange.hpp"

namespace detlogp::op {

namespace {

[[noreturn]] void fail_kept(ErrorCode code, const std::string& message) {
  throw ContractError(code, "kept_ids", message);
}

std::size_t at(int64_t row, int64_t width, int64_t j) {
  return static_cast<std::size_t>(row * width + j);
}

}  // namespace

void check_kept_ids(const KeptSetOptions& kept, int64_t rows, std::span<const int64_t> targets,
                    const LogprobContract& c) {
  const int64_t width = kept.width;
  if (width < 0 || width > kMaxKeptIds || (width == 0 && !kept.ids.empty())) {
    fail_kept(ErrorCode::out_of_range,
              fmt::format("kept_ids width={} must be in [1, {}] (ids per row, -1 padded); pass at "
                          "most {} ids per row, or no kept_ids for the full vocabulary",
                          width, kMaxKeptIds, kMaxKeptIds));
  }
  if (static_cast<int64_t>(kept.ids.size()) != rows * width) {
    fail_kept(
        ErrorCode::wrong_shape,
        fmt::format("kept_ids has {} ids but must be [rows={}, width={}] = {} ids (row-major, "
                    "-1 padded)",
                    kept.ids.size(), rows, width, rows * width));
  }
  const int64_t real = c.sharding().real_vocab_size();
  const auto& active = c.mask().active_mask();
  // One bit per real id: a row's ids are marked as they are seen (a repeat is a duplicate) and
  // unmarked after the row, so the checks cost O(width) per row, no sort.
  std::vector<uint64_t> seen(static_cast<std::size_t>((real + 63) / 64), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const std::span<const int64_t> row =
        kept.ids.subspan(at(i, width, 0), static_cast<std::size_t>(width));
    for (const int64_t id : row) {
      if (id < -1 || id >= real) {
        fail_kept(ErrorCode::token_out_of_vocab,
                  fmt::format("kept_ids row {} holds id {}: kept ids must lie in the real "
                              "vocabulary [0, {}), or be -1 (padding)",
                              i, id, real));
      }
    }
    const int64_t t = targets[static_cast<std::size_t>(i)];
    int64_t n = 0;
    bool holds_target = false;
    for (const int64_t id : row) {
      if (id < 0) continue;
      uint64_t& word = seen[static_cast<std::size_t>(id / 64)];
      const uint64_t bit = uint64_t{1} << (id % 64);
      if (word & bit) {
        fail_kept(ErrorCode::duplicate,
                  fmt::format("kept_ids row {} holds id {} twice: list each kept id once per row",
                              i, id));
      }
      word |= bit;
      ++n;
      holds_target = holds_target || id == t;
    }
    for (const int64_t id : row) {
      if (id >= 0) seen[static_cast<std::size_t>(id / 64)] = 0;
    }
    if (!active[static_cast<std::size_t>(i)]) continue;
    if (n == 0 && kept.empty_rows == EmptyKeptRow::full_vocabulary) continue;
    if (n == 0) {
      fail_kept(ErrorCode::empty,
                fmt::format("kept_ids row {} is an active row with no kept id (only -1): give "
                            "every active row at least its target, mask the row out, or pass "
                            "empty_kept=full (CLI: --empty-kept full) to score rows of only -1 "
                            "over the full vocabulary",
                            i));
    }
    if (kept.outside == OutsideKept::error && !holds_target) {
      fail_kept(ErrorCode::conflicting_fields,
                fmt::format("kept_ids row {}: target id {} is not in the row's kept set; the "
                            "sampled token must be kept (pass outside_kept=neg_inf to score it "
                            "-inf instead)",
                            i, t));
    }
  }
}

std::vector<int64_t> resolve_kept_ids(std::span<const int64_t> ids, int64_t rows, int64_t width) {
  std::vector<int64_t> out(ids.size());
  // Sorted as 32-bit keys (ids are below 2^31; -1 becomes the largest key, so padding goes last):
  // a plain integer sort, the row's order ascending.
  std::vector<uint32_t> keys(static_cast<std::size_t>(width));
  for (int64_t i = 0; i < rows; ++i) {
    const std::size_t first = at(i, width, 0);
    for (std::size_t j = 0; j < keys.size(); ++j) keys[j] = static_cast<uint32_t>(ids[first + j]);
    std::sort(keys.begin(), keys.end());
    for (std::size_t j = 0; j < keys.size(); ++j) {
      out[first + j] = keys[j] == UINT32_MAX ? -1 : static_cast<int64_t>(keys[j]);
    }
  }
  return out;
}

namespace {

// Every rank's scores of the ids it owns, one all-gather, each slot from its owner: [rows,
// width], +0 at padding slots.
std::vector<float> gather_scores(Communicator& comm, const ShardingSpec& sh,
                                 std::span<const int64_t> kept, int64_t rows, int64_t width,
                                 const ReadScores& read) {
  const std::size_t n = static_cast<std::size_t>(rows * width);
  std::vector<int64_t> local(n);
  const int64_t begin = sh.local_vocab_start();
  const int64_t end = std::min(sh.local_vocab_end(), sh.real_vocab_size());
  for (std::size_t k = 0; k < n; ++k) {
    const int64_t id = kept[k];
    local[k] = id >= begin && id < end ? id - begin : -1;
  }
  std::vector<float> block(n, 0.0f);
  read(local, width, block);
  const std::vector<float> gathered =
      all_gather_blocks(comm, std::move(block), "forward all-gather of the kept scores");
  if (comm.size() <= 1) return gathered;
  std::vector<float> scores(n, 0.0f);
  for (std::size_t k = 0; k < n; ++k) {
    if (kept[k] < 0) continue;
    scores[k] = gathered[static_cast<std::size_t>(sh.owner_rank(kept[k])) * n + k];
  }
  return scores;
}

// LSE_S and H_S of every row: rows with the same |S| together, as [g, |S|] fp32 logits of a
// vocabulary of |S| real columns.
void kept_roots(const ShardKernels& kernels, std::span<const float> scores,
                std::span<const int64_t> kept, int64_t rows, int64_t width, bool entropy,
                KeptOutputs& out, const ExecOptions& exec) {
  std::map<int64_t, std::vector<int64_t>> by_count;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t n = 0;
    while (n < width && kept[at(i, width, n)] >= 0) ++n;
    by_count[n].push_back(i);
  }
  for (const auto& [n, members] : by_count) {
    const auto g = static_cast<int64_t>(members.size());
    if (n == 0) {  // an inactive row with an empty set: the empty vocabulary's identity root
      const canon::RootValues root = canon::finish_root(canon::identity_partial());
      for (int64_t i : members) {
        out.lse[static_cast<std::size_t>(i)] = root.lse;
        if (entropy) out.entropy[static_cast<std::size_t>(i)] = root.entropy;
      }
      continue;
    }
    std::vector<float> z(static_cast<std::size_t>(g * n));
    for (int64_t r = 0; r < g; ++r) {
      std::copy_n(scores.begin() + static_cast<std::ptrdiff_t>(at(members[r], width, 0)), n,
                  z.begin() + r * n);
    }
    const TileGeometry geometry{.real_vocab = n, .tile_width = kKeptTileWidth};
    const ShardSpec spec{.vocab_start = 0, .geometry = geometry};  // temperature 1, no softcap
    const std::vector<TreeNode> nodes = canonical_cover(geometry, 0, geometry.num_real_tiles());
    std::vector<NodePartial> partials(static_cast<std::size_t>(g) * nodes.size());
    const LogitsView view{
        .data = z.data(), .dtype = DType::fp32, .rows = g, .cols = n, .row_stride = n};
    kernels.node_partials(view, spec, nodes, entropy, partials, exec);
    std::vector<float> lse(static_cast<std::size_t>(g));
    std::vector<float> ent(entropy ? static_cast<std::size_t>(g) : 0);
    kernels.merge_roots(geometry, nodes, partials, g, RootsOut{.lse = lse, .entropy = ent}, exec);
    for (int64_t r = 0; r < g; ++r) {
      out.lse[static_cast<std::size_t>(members[r])] = lse[r];
      if (entropy) out.entropy[static_cast<std::size_t>(members[r])] = ent[r];
    }
  }
}

}  // namespace

ReadScores read_scores_of(const LogitsView& shard, const ShardSpec& spec) {
  return [&shard, &spec](std::span<const int64_t> cols, int64_t width, std::span<float> out) {
    for (int64_t i = 0; i < shard.rows; ++i) {
      const int64_t base = i * shard.row_stride;
      const std::size_t first = at(i, width, 0);
      // The loads first (independent: they overlap), then the scoring of the row's slots.
      for (std::size_t k = first; k < first + static_cast<std::size_t>(width); ++k) {
        out[k] =
            cols[k] >= 0 ? numerics::load_as_float(shard.data, shard.dtype, base + cols[k]) : 0.0f;
      }
      const float tau = spec.temperature_of(i);
      for (std::size_t k = first; k < first + static_cast<std::size_t>(width); ++k) {
        if (cols[k] >= 0)
          out[k] = canon::canonicalize(canon::scored_logit(out[k], spec.softcap, tau));
      }
    }
  };
}

ReadScores read_scores_of(const FusedKernels& kernels, const FusedShard& shard) {
  return [&kernels, &shard](std::span<const int64_t> cols, int64_t width, std::span<float> out) {
    const int64_t rows = shard.hidden.rows;
    std::vector<int64_t> slot(static_cast<std::size_t>(rows));
    std::vector<float> z(static_cast<std::size_t>(rows));
    for (int64_t j = 0; j < width; ++j) {
      bool any = false;
      for (int64_t i = 0; i < rows; ++i) {
        slot[static_cast<std::size_t>(i)] = cols[at(i, width, j)];
        any = any || slot[static_cast<std::size_t>(i)] >= 0;
      }
      if (!any) continue;
      kernels.read_target_logits(shard, slot, z);
      for (int64_t i = 0; i < rows; ++i) out[at(i, width, j)] = z[static_cast<std::size_t>(i)];
    }
  };
}

void drop_outside_grad_logp(std::span<float> grad_logp, std::span<const uint8_t> outside) {
  for (std::size_t i = 0; i < outside.size() && i < grad_logp.size(); ++i) {
    if (outside[i]) grad_logp[i] = 0.0f;
  }
}

KeptOutputs kept_forward(Communicator& comm, const ShardingSpec& sharding,
                         const ShardKernels& kernels, std::span<const int64_t> kept, int64_t width,
                         std::span<const int64_t> targets, std::span<const uint8_t> active,
                         bool entropy, const ReadScores& read, const ExecOptions& exec) {
  const auto rows = static_cast<int64_t>(targets.size());
  const std::vector<float> scores = gather_scores(comm, sharding, kept, rows, width, read);
  KeptOutputs out;
  out.lse.resize(static_cast<std::size_t>(rows));
  if (entropy) out.entropy.resize(static_cast<std::size_t>(rows));
  kept_roots(kernels, scores, kept, rows, width, entropy, out, exec);
  out.logp.assign(static_cast<std::size_t>(rows), 0.0f);
  out.outside.assign(static_cast<std::size_t>(rows), 0);
  for (int64_t i = 0; i < rows; ++i) {
    if (!active[static_cast<std::size_t>(i)]) continue;
    const int64_t t = targets[static_cast<std::size_t>(i)];
    int64_t slot = -1;
    for (int64_t j = 0; j < width && kept[at(i, width, j)] >= 0; ++j) {
      if (kept[at(i, width, j)] == t) slot = j;
    }
    if (slot < 0) {
      out.outside[static_cast<std::size_t>(i)] = 1;
      out.logp[static_cast<std::size_t>(i)] = -canon::kInf;
      continue;
    }
    out.logp[static_cast<std::size_t>(i)] =
        canon::selected_logp(scores[at(i, width, slot)], out.lse[static_cast<std::size_t>(i)]);
  }
  return out;
}

void kept_backward(const LogitsView& logits, const ShardSpec& spec, std::span<const int64_t> kept,
                   int64_t width, int64_t global_begin, int64_t real_vocab,
                   const BackwardInputs& in, const MutableLogitsView& grad,
                   std::span<const uint8_t> skip_rows) {
  const std::size_t elem = dtype_size(grad.dtype);
  auto* base = static_cast<unsigned char*>(grad.data);
  const auto skipped = [&](int64_t i) {
    return !skip_rows.empty() && skip_rows[static_cast<std::size_t>(i)] != 0;
  };
  for (int64_t i = 0; i < grad.rows; ++i) {  // +0 in every dtype is all-zero bits
    if (skipped(i)) continue;
    std::memset(base + static_cast<std::size_t>(i * grad.row_stride) * elem, 0,
                static_cast<std::size_t>(grad.cols) * elem);
  }
  const canon::GradCoefficients base_g{.has_logp = !in.grad_logp.empty(),
                                       .has_lse = !in.grad_lse.empty(),
                                       .has_entropy = !in.grad_entropy.empty(),
                                       .g_logp = 0.0f,
                                       .g_lse = 0.0f,
                                       .g_entropy = 0.0f};
  const int64_t begin = global_begin;
  const int64_t end = std::min(begin + logits.cols, real_vocab);
  std::vector<int64_t> cols(static_cast<std::size_t>(width));
  std::vector<float> xs(static_cast<std::size_t>(width));
  for (int64_t i = 0; i < logits.rows; ++i) {
    if (skipped(i)) continue;
    const auto r = static_cast<std::size_t>(i);
    canon::GradCoefficients g = base_g;
    if (g.has_logp) g.g_logp = in.grad_logp[r];
    if (g.has_lse) g.g_lse = in.grad_lse[r];
    if (g.has_entropy) g.g_entropy = in.grad_entropy[r];
    const float entropy = in.entropy.empty() ? 0.0f : in.entropy[r];
    // The row's kept logits loaded first (independent loads of scattered columns overlap),
    // then their gradients.
    std::size_t n = 0;
    for (int64_t j = 0; j < width; ++j) {
      const int64_t id = kept[at(i, width, j)];
      if (id < begin || id >= end) continue;
      cols[n] = id - begin;
      xs[n] = numerics::load_as_float(logits.data, logits.dtype, i * logits.row_stride + cols[n]);
      ++n;
    }
    for (std::size_t k = 0; k < n; ++k) {
      const int64_t col = cols[k];
      const float x = xs[k];
      const float v = canon::grad_of_logit(x, col == in.target_local[r], in.lse[r], entropy, g,
                                           spec.temperature_of(i), spec.softcap);
      numerics::store_from_float(grad.data, grad.dtype, i * grad.row_stride + col, v);
    }
  }
}

}  // namespace detlogp::op
