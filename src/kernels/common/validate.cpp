// Argument checks shared by every backend's kernels.
#include "kernels/common/validate.hpp"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "detlogp/errors.hpp"

namespace detlogp::kernels {

namespace {

[[noreturn]] void fail(const char* kernel, const std::string& what) {
  throw ContractError(fmt::format("detlogp {}: {}", kernel, what));
}

void validate_span_size(const char* kernel, const char* name, size_t size, int64_t rows,
                        bool may_be_empty) {
  if (may_be_empty && size == 0) return;
  if (static_cast<int64_t>(size) != rows) {
    fail(kernel, fmt::format("{} has {} entries, expected rows = {}{}", name, size, rows,
                             may_be_empty ? " (or 0 when not supplied)" : ""));
  }
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::fp32:
      return "fp32";
  }
  return "?";
}

}  // namespace

ColumnRange tile_real_columns(const TileGeometry& geometry, int64_t tile) {
  const int64_t w = geometry.tile_width;
  const int64_t r = geometry.real_vocab;
  const int64_t begin = tile * w;
  if (begin >= r) return ColumnRange{begin, begin};
  const int64_t end = begin + w < r ? begin + w : r;
  return ColumnRange{begin, end};
}

void validate_geometry(const TileGeometry& geometry, const char* kernel) {
  if (geometry.tile_width <= 0) {
    fail(kernel, fmt::format("geometry.tile_width = {}: the tile width W must be positive",
                             geometry.tile_width));
  }
  if (geometry.real_vocab < 0) {
    fail(kernel, fmt::format("geometry.real_vocab = {}: the real vocabulary must be >= 0",
                             geometry.real_vocab));
  }
}

void validate_shard(const LogitsView& shard, const ShardSpec& spec, const char* kernel,
                    ShardBounds tiles) {
  validate_geometry(spec.geometry, kernel);
  const int64_t w = spec.geometry.tile_width;
  if (shard.rows < 0 || shard.cols < 0) {
    fail(kernel,
         fmt::format("shard has rows = {}, cols = {}: both must be >= 0", shard.rows, shard.cols));
  }
  if (shard.rows > 0 && shard.row_stride < shard.cols) {
    fail(kernel, fmt::format("shard.row_stride = {} is smaller than shard.cols = {}",
                             shard.row_stride, shard.cols));
  }
  if (shard.rows > 0 && shard.cols > 0 && shard.data == nullptr) {
    fail(kernel, "shard.data is null for a non-empty shard");
  }
  const bool aligned = tiles == ShardBounds::tile_aligned;
  if (spec.vocab_start < 0 || (aligned && spec.vocab_start % w != 0)) {
    fail(kernel, fmt::format("spec.vocab_start = {} must be >= 0 and a multiple of the tile "
                             "width W = {}",
                             spec.vocab_start, w));
  }
  const int64_t end = spec.vocab_start + shard.cols;
  if (aligned && end % w != 0 && end < spec.geometry.real_vocab) {
    fail(kernel, fmt::format("the shard ends at global column {} (vocab_start {} + cols {}), "
                             "which is neither a multiple of the tile width W = {} nor at or "
                             "after the real vocabulary R = {}",
                             end, spec.vocab_start, shard.cols, w, spec.geometry.real_vocab));
  }
  if (!(spec.temperature > 0.0f) || !std::isfinite(spec.temperature)) {
    fail(kernel, fmt::format("spec.temperature = {} must be finite and > 0", spec.temperature));
  }
  if (!spec.row_temperature.empty()) {
    if (static_cast<int64_t>(spec.row_temperature.size()) != shard.rows) {
      fail(kernel, fmt::format("spec.row_temperature has {} entries; expected one per shard row "
                               "({}) or none",
                               spec.row_temperature.size(), shard.rows));
    }
    for (size_t r = 0; r < spec.row_temperature.size(); ++r) {
      const float t = spec.row_temperature[r];
      if (!(t > 0.0f) || !std::isfinite(t)) {
        fail(kernel, fmt::format("spec.row_temperature[{}] = {} must be finite and > 0", r, t));
      }
    }
  }
  if (spec.softcap != 0.0f && (!(spec.softcap > 0.0f) || !std::isfinite(spec.softcap))) {
    fail(kernel,
         fmt::format("spec.softcap = {} must be 0 (no cap) or finite and > 0", spec.softcap));
  }
}

void validate_tree_node(const TileGeometry& geometry, const TreeNode& node, const char* kernel) {
  const int levels = geometry.tree_levels();
  if (node.level < 0 || node.level > levels) {
    fail(kernel, fmt::format("node (level {}, index {}): level must be in [0, K = {}]", node.level,
                             node.index, levels));
  }
  const int64_t width = int64_t{1} << (levels - node.level);
  if (node.index < 0 || node.index >= width) {
    fail(kernel, fmt::format("node (level {}, index {}): index must be in [0, {}) for a tree of "
                             "2^{} leaves",
                             node.level, node.index, width, levels));
  }
}

void validate_node_partials(const LogitsView& shard, const ShardSpec& spec,
                            std::span<const TreeNode> nodes, std::span<const NodePartial> out) {
  const char* kernel = "node_partials";
  validate_shard(shard, spec, kernel);
  const int64_t shard_begin = spec.vocab_start;
  const int64_t shard_end = spec.vocab_start + shard.cols;
  const int64_t real_tiles = spec.geometry.num_real_tiles();
  for (const TreeNode& node : nodes) {
    validate_tree_node(spec.geometry, node, kernel);
    // Every real column of the node must be in the shard: check its first and last real tile.
    const int64_t first = node.first_tile();
    const int64_t last = (node.end_tile() < real_tiles ? node.end_tile() : real_tiles) - 1;
    if (first > last) continue;  // only padding tiles: an identity, needs no data
    const int64_t col_begin = tile_real_columns(spec.geometry, first).begin;
    const int64_t col_end = tile_real_columns(spec.geometry, last).end;
    if (col_begin < shard_begin || col_end > shard_end) {
      fail(kernel, fmt::format("node (level {}, index {}) has real columns [{}, {}) outside the "
                               "shard's columns [{}, {})",
                               node.level, node.index, col_begin, col_end, shard_begin, shard_end));
    }
  }
  const auto expected = static_cast<size_t>(shard.rows) * nodes.size();
  if (out.size() != expected) {
    fail(kernel, fmt::format("out has {} entries, expected rows * nodes = {} * {} = {}", out.size(),
                             shard.rows, nodes.size(), expected));
  }
}

void validate_merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                          std::span<const NodePartial> partials, int64_t rows,
                          const RootsOut& roots) {
  const char* kernel = "merge_roots";
  validate_geometry(geometry, kernel);
  if (rows < 0) fail(kernel, fmt::format("rows = {} must be >= 0", rows));
  const auto expected = static_cast<size_t>(rows) * nodes.size();
  if (partials.size() != expected) {
    fail(kernel, fmt::format("partials has {} entries, expected rows * nodes = {} * {} = {}",
                             partials.size(), rows, nodes.size(), expected));
  }
  validate_span_size(kernel, "roots.lse", roots.lse.size(), rows, false);
  validate_span_size(kernel, "roots.entropy", roots.entropy.size(), rows, true);
  const int64_t real_tiles = geometry.num_real_tiles();
  for (const TreeNode& node : nodes) {
    validate_tree_node(geometry, node, kernel);
    if (node.first_tile() >= real_tiles) {
      fail(kernel,
           fmt::format("node (level {}, index {}) covers only padding tiles [{}, {}) "
                       "(T = {}); covers never contain such nodes",
                       node.level, node.index, node.first_tile(), node.end_tile(), real_tiles));
    }
  }
  validate_exact_cover(geometry, nodes);
}

void validate_exact_cover(const TileGeometry& geometry, std::span<const TreeNode> nodes) {
  const int64_t real_tiles = geometry.num_real_tiles();
  std::vector<int> count(static_cast<size_t>(real_tiles), 0);
  for (const TreeNode& node : nodes) {
    const int64_t end = node.end_tile() < real_tiles ? node.end_tile() : real_tiles;
    for (int64_t t = node.first_tile(); t < end; ++t) ++count[static_cast<size_t>(t)];
  }
  for (int64_t t = 0; t < real_tiles; ++t) {
    if (count[static_cast<size_t>(t)] != 1) {
      fail("merge_roots",
           fmt::format("the nodes cover real tile {} {} times; together they must cover the "
                       "real tiles [0, T = {}) exactly once",
                       t, count[static_cast<size_t>(t)], real_tiles));
    }
  }
}

void validate_targets(const LogitsView& shard, const ShardSpec& spec,
                      std::span<const int64_t> target_local, const char* kernel) {
  validate_span_size(kernel, "target_local", target_local.size(), shard.rows, false);
  const int64_t real_cols_end = spec.geometry.real_vocab - spec.vocab_start;  // local
  for (size_t r = 0; r < target_local.size(); ++r) {
    const int64_t t = target_local[r];
    if (t == -1) continue;
    if (t < -1 || t >= shard.cols || t >= real_cols_end) {
      fail(kernel, fmt::format("target_local[{}] = {} must be -1 or a real local column in "
                               "[0, {})",
                               r, t, shard.cols < real_cols_end ? shard.cols : real_cols_end));
    }
  }
}

void validate_backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                       const MutableLogitsView& grad, ShardBounds tiles) {
  const char* kernel = "backward";
  validate_shard(shard, spec, kernel, tiles);
  if (grad.dtype != shard.dtype || grad.rows != shard.rows || grad.cols != shard.cols) {
    fail(kernel, fmt::format("grad is [{}, {}] of dtype {}, the shard [{}, {}] of dtype {}: "
                             "they must match",
                             grad.rows, grad.cols, dtype_name(grad.dtype), shard.rows, shard.cols,
                             dtype_name(shard.dtype)));
  }
  if (grad.rows > 0 && grad.row_stride < grad.cols) {
    fail(kernel, fmt::format("grad.row_stride = {} is smaller than grad.cols = {}", grad.row_stride,
                             grad.cols));
  }
  if (grad.rows > 0 && grad.cols > 0 && grad.data == nullptr) {
    fail(kernel, "grad.data is null for a non-empty shard");
  }
  const int64_t rows = shard.rows;
  validate_span_size(kernel, "in.lse", in.lse.size(), rows, false);
  validate_span_size(kernel, "in.grad_logp", in.grad_logp.size(), rows, true);
  validate_span_size(kernel, "in.grad_lse", in.grad_lse.size(), rows, true);
  validate_span_size(kernel, "in.grad_entropy", in.grad_entropy.size(), rows, true);
  if (!in.grad_entropy.empty()) {
    validate_span_size(kernel, "in.entropy (needed with grad_entropy)", in.entropy.size(), rows,
                       false);
  }
  validate_targets(shard, spec, in.target_local, kernel);
}

}  // namespace detlogp::kernels
