#pragma once
// Argument checks of the shard-local kernels (include/detlogp/kernels.hpp), shared by every
// backend (CPU and CUDA) so that they reject the same inputs with the same messages. Each throws
// detlogp::ContractError naming the kernel, the field, the bad value and the rule.

#include <cstdint>
#include <span>

#include "detlogp/kernels.hpp"

namespace detlogp::kernels {

// The global column range [begin, end) of tile `tile`'s real columns (empty at or beyond T).
struct ColumnRange {
  int64_t begin;
  int64_t end;
};
ColumnRange tile_real_columns(const TileGeometry& geometry, int64_t tile);

// geometry: tile_width > 0, real_vocab >= 0.
void validate_geometry(const TileGeometry& geometry, const char* kernel);

// The shard view and where it sits: rows, cols >= 0, row_stride >= cols, data present,
// vocab_start >= 0 and, unless `tiles` is any_bounds, a multiple of W with the shard's end a
// multiple of W or at/after R (the last shard may stop inside the last tile when nothing real
// follows), temperature finite and > 0, row_temperature empty or one finite value > 0 per row.
// The element-wise kernels (backward, read_target_logits) of the CPU backends accept any bounds;
// node_partials always needs whole tiles.
enum class ShardBounds { tile_aligned, any_bounds };
void validate_shard(const LogitsView& shard, const ShardSpec& spec, const char* kernel,
                    ShardBounds tiles = ShardBounds::tile_aligned);

// A node of the tree of `geometry`: 0 <= level <= K and 0 <= index < 2^(K - level).
void validate_tree_node(const TileGeometry& geometry, const TreeNode& node, const char* kernel);

// Everything node_partials needs: the shard, each node a tree node whose real columns all lie
// inside the shard, and out.size() == rows * nodes.size().
void validate_node_partials(const LogitsView& shard, const ShardSpec& spec,
                            std::span<const TreeNode> nodes, std::span<const NodePartial> out);

// Everything merge_roots needs, except the exact cover (checked where the root is rebuilt):
// rows >= 0, partials.size() == rows * nodes.size(), lse.size() == rows, entropy empty or rows,
// every node a tree node holding at least one real tile.
void validate_merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                          std::span<const NodePartial> partials, int64_t rows,
                          const RootsOut& roots);

// Checks that `nodes` cover the real tiles [0, T) exactly once; throws naming the first tile
// covered zero or several times.
void validate_exact_cover(const TileGeometry& geometry, std::span<const TreeNode> nodes);

// Everything backward needs: the shard, the gradient view (same dtype and shape), the per-row
// spans (sizes rows, entropy present when grad_entropy is), each target_local -1 or a real
// column of the shard.
void validate_backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                       const MutableLogitsView& grad,
                       ShardBounds tiles = ShardBounds::tile_aligned);

// read_target_logits: the shard, target_local and out of size rows, each target -1 or a real
// column of the shard.
void validate_targets(const LogitsView& shard, const ShardSpec& spec,
                      std::span<const int64_t> target_local, const char* kernel);

}  // namespace detlogp::kernels
