#pragma once
// Runs the shard-local kernels the way a TP group would, inside one process: a [rows, padded]
// logits buffer is cut into vocab shards at tile boundaries (views with row_stride > cols),
// each shard computes node partials of its canonical cover, the nodes of all shards are
// concatenated (as an all-gather would) and every row's root is rebuilt by merge_roots; the
// target logit is read from its owner; backward runs per shard into one gradient buffer. The
// kernels may be any ShardKernels, the CPU ones on host buffers or the GPU ones on device copies.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "detlogp/kernels.hpp"
#include "testing/logits_gen.hpp"

namespace detlogp::testing {

// Tile cut points 0 = c_0 < c_1 < ... < c_tp = ceil(padded / W) (shards may be empty only if
// there are fewer tiles than shards). Even: as equal as possible; otherwise random.
inline std::vector<int64_t> make_cuts(int64_t padded, int64_t tile_width, int tp, bool even,
                                      std::mt19937_64& rng) {
  const int64_t tiles = (padded + tile_width - 1) / tile_width;
  std::vector<int64_t> cuts(static_cast<size_t>(tp) + 1, 0);
  cuts.back() = tiles;
  if (even) {
    for (int i = 1; i < tp; ++i) cuts[static_cast<size_t>(i)] = tiles * i / tp;
  } else {
    std::uniform_int_distribution<int64_t> pick(0, tiles);
    for (int i = 1; i < tp; ++i) cuts[static_cast<size_t>(i)] = pick(rng);
    std::sort(cuts.begin(), cuts.end());
  }
  return cuts;
}

struct ShardRange {
  int64_t col_begin;  // global (== vocab_start)
  int64_t cols;
  int64_t tile_begin;
  int64_t tile_end;
};

inline std::vector<ShardRange> shard_ranges(int64_t padded, int64_t tile_width,
                                            std::span<const int64_t> cuts) {
  std::vector<ShardRange> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    // A trailing shard may start at or after `padded` (then it is empty); its vocab_start
    // stays tile-aligned.
    const int64_t b = cuts[i] * tile_width;
    const int64_t e = cuts[i + 1] * tile_width < padded ? cuts[i + 1] * tile_width : padded;
    out.push_back(ShardRange{b, e > b ? e - b : 0, cuts[i], cuts[i + 1]});
  }
  return out;
}

struct ForwardResult {
  std::vector<float> lse;
  std::vector<float> entropy;         // empty unless with_entropy
  std::vector<float> target_z;        // z[target] (+0 for inactive rows)
  std::vector<float> logp;            // target_z - lse for active rows, exactly 0 otherwise
  std::vector<TreeNode> nodes;        // all shards' nodes, concatenated
  std::vector<NodePartial> partials;  // [rows, nodes.size()]
};

// Where the kernels read (and write) a shard's columns: by default the host buffers themselves;
// the GPU tests (tests/unit/cuda) pass views of device copies with the same layout.
using ShardViews = std::function<LogitsView(int64_t col_begin, int64_t cols)>;
using MutableShardViews = std::function<MutableLogitsView(int64_t col_begin, int64_t cols)>;

// Each row's target as a column of shard `s`: -1 where another shard owns it or the row is
// inactive (targets[r] == -1).
inline std::vector<int64_t> local_targets(std::span<const int64_t> targets, const ShardRange& s) {
  std::vector<int64_t> local(targets.size(), -1);
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] >= s.col_begin && targets[r] < s.col_begin + s.cols) {
      local[r] = targets[r] - s.col_begin;
    }
  }
  return local;
}

// targets[r]: global target column or -1 (inactive row). The target logit is read from its
// owner through kernels.read_target_logits.
inline ForwardResult forward_sharded(const ShardKernels& kernels, const Logits& x,
                                     const TileGeometry& geometry, std::span<const int64_t> cuts,
                                     float temperature, bool with_entropy,
                                     std::span<const int64_t> targets,
                                     const ShardViews& views = {}) {
  const int64_t rows = x.rows;
  ForwardResult res;
  std::vector<std::vector<TreeNode>> shard_nodes;
  std::vector<std::vector<NodePartial>> shard_partials;
  res.target_z.assign(static_cast<size_t>(rows), 0.0f);
  for (const ShardRange& s : shard_ranges(x.cols, geometry.tile_width, cuts)) {
    const ShardSpec spec{s.col_begin, geometry, temperature};
    const LogitsView view = views ? views(s.col_begin, s.cols) : x.view_cols(s.col_begin, s.cols);
    std::vector<TreeNode> cover = canonical_cover(geometry, s.tile_begin, s.tile_end);
    std::vector<NodePartial> partials(static_cast<size_t>(rows) * cover.size());
    kernels.node_partials(view, spec, cover, with_entropy, partials);
    const std::vector<int64_t> local = local_targets(targets.first(static_cast<size_t>(rows)), s);
    std::vector<float> tz(static_cast<size_t>(rows));
    kernels.read_target_logits(view, spec, local, tz);
    for (int64_t r = 0; r < rows; ++r) {
      if (local[static_cast<size_t>(r)] >= 0)
        res.target_z[static_cast<size_t>(r)] = tz[static_cast<size_t>(r)];
    }
    shard_nodes.push_back(std::move(cover));
    shard_partials.push_back(std::move(partials));
  }
  for (const auto& n : shard_nodes) res.nodes.insert(res.nodes.end(), n.begin(), n.end());
  const size_t total = res.nodes.size();
  res.partials.resize(static_cast<size_t>(rows) * total);
  for (int64_t r = 0; r < rows; ++r) {
    size_t j = 0;
    for (size_t s = 0; s < shard_nodes.size(); ++s) {
      const size_t n = shard_nodes[s].size();
      for (size_t k = 0; k < n; ++k) {
        res.partials[static_cast<size_t>(r) * total + j++] =
            shard_partials[s][static_cast<size_t>(r) * n + k];
      }
    }
  }
  res.lse.assign(static_cast<size_t>(rows), 0.0f);
  if (with_entropy) res.entropy.assign(static_cast<size_t>(rows), 0.0f);
  if (rows > 0) {  // no rows, no roots (a device kernel cannot launch an empty grid)
    kernels.merge_roots(geometry, res.nodes, res.partials, rows, RootsOut{res.lse, res.entropy});
  }
  res.logp.assign(static_cast<size_t>(rows), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const auto ri = static_cast<size_t>(r);
    if (targets[ri] >= 0) res.logp[ri] = canon::selected_logp(res.target_z[ri], res.lse[ri]);
  }
  return res;
}

struct GradInputs {
  std::vector<float> grad_logp;  // empty: not supplied
  std::vector<float> grad_lse;
  std::vector<float> grad_entropy;
};

// A [rows, cols] buffer (stride `stride`, -1: cols) whose every element, padding included, holds
// a poison pattern: a gradient element the kernels fail to write shows.
inline Logits poisoned_logits(DType dtype, int64_t rows, int64_t cols, int64_t stride = -1) {
  Logits out(dtype, rows, cols, stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < out.row_stride; ++c) out.set_raw(r, c, 0x5a5au);
  }
  return out;
}

// Backward of every shard of x: each reads its columns through views(col_begin, cols) and writes
// its columns of the gradient through grad_views(col_begin, cols).
inline void backward_shards(const ShardKernels& kernels, const Logits& x, const ShardViews& views,
                            const MutableShardViews& grad_views, const TileGeometry& geometry,
                            std::span<const int64_t> cuts, float temperature,
                            std::span<const int64_t> targets, const ForwardResult& fwd,
                            const GradInputs& g) {
  const int64_t rows = x.rows;
  for (const ShardRange& s : shard_ranges(x.cols, geometry.tile_width, cuts)) {
    const ShardSpec spec{s.col_begin, geometry, temperature};
    const std::vector<int64_t> local = local_targets(targets.first(static_cast<size_t>(rows)), s);
    BackwardInputs in;
    in.lse = fwd.lse;
    in.entropy = fwd.entropy;
    in.target_local = local;
    in.grad_logp = g.grad_logp;
    in.grad_lse = g.grad_lse;
    in.grad_entropy = g.grad_entropy;
    kernels.backward(views(s.col_begin, s.cols), spec, in, grad_views(s.col_begin, s.cols));
  }
}

// Backward of every shard into one [rows, x.cols] gradient buffer of x's dtype (stride
// grad_stride, default x.cols). grad_logp must already be zero on inactive rows.
inline Logits backward_sharded(const ShardKernels& kernels, const Logits& x,
                               const TileGeometry& geometry, std::span<const int64_t> cuts,
                               float temperature, std::span<const int64_t> targets,
                               const ForwardResult& fwd, const GradInputs& g,
                               int64_t grad_stride = -1) {
  Logits grad = poisoned_logits(x.dtype, x.rows, x.cols, grad_stride);
  backward_shards(
      kernels, x, [&](int64_t begin, int64_t cols) { return x.view_cols(begin, cols); },
      [&](int64_t begin, int64_t cols) { return grad.mutable_view_cols(begin, cols); }, geometry,
      cuts, temperature, targets, fwd, g);
  return grad;
}

}  // namespace detlogp::testing
