#pragma once
// The CPU implementation of FusedKernels: the canon's dense kernels of one target (DotOps: the
// scalar reference or one Highway target) over host memory, on up to ExecOptions::threads
// threads, with the logits operator's shard kernels for the leaf partials and roots.
//
// Work items: the nodes asked for, split in halves (largest first) until there are four items
// per thread; an item is a dyadic block of tiles, so the split never changes the tree, only who
// computes which subtree. Forward and backward (fused_forward.cpp, fused_backward.cpp) walk an
// item per row block and per tile, with one [row_block, W] block of logits per thread.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "detlogp/kernels.hpp"
#include "kernels/cpu/fused/dot_kernels.hpp"

namespace detlogp::fused {

class CpuFusedKernels final : public FusedKernels {
 public:
  CpuFusedKernels(const DotOps& ops, const ShardKernels& shard) : ops_(ops), shard_(shard) {}

  std::string name() const override { return ops_.name; }
  const ShardKernels& shard_kernels() const override { return shard_; }
  bool supports_unaligned_bounds() const override { return true; }

  void node_partials(const FusedShard& shard, std::span<const TreeNode> nodes, bool with_entropy,
                     std::span<NodePartial> out, const ExecOptions& exec) const override;
  void read_target_logits(const FusedShard& shard, std::span<const int64_t> target_local,
                          std::span<float> out) const override;
  void backward(const FusedShard& shard, std::span<const TreeNode> nodes, const BackwardInputs& in,
                const MutableLogitsView& grad_weight, std::span<float> hidden_sums,
                const ExecOptions& exec) const override;
  void kept_backward(const FusedShard& shard, std::span<const int64_t> kept, int64_t width,
                     std::span<const TreeNode> nodes, const BackwardInputs& in,
                     const MutableLogitsView& grad_weight,
                     std::span<float> hidden_sums) const override;
  void merge_hidden_sums(std::span<const TreeNode> nodes, std::span<float* const> sums,
                         const MutableLogitsView& grad_hidden) const override;
  void linear_logits(const LogitsView& hidden, const LogitsView& weight,
                     const MutableLogitsView& out, const ExecOptions& exec) const override;

 private:
  const DotOps& ops_;
  const ShardKernels& shard_;
};

// A unit of work: a dyadic block of tiles inside node `node_index` of the nodes asked for.
struct Item {
  std::size_t node_index;
  TreeNode node;
};

// The nodes split in halves (largest first) until there are enough items for the threads and
// they share the tiles evenly. Children with no real tile are dropped. Items of one node stay
// together, left to right.
std::vector<Item> split_items(std::span<const TreeNode> nodes, int64_t real_tiles, int threads);

// The order to run items in: most real tiles first (ties in item order), so that the small
// items fill the threads' ends. The order never changes a bit: each item writes its own slot.
std::vector<int64_t> largest_first(const std::vector<Item>& items, int64_t real_tiles);

// The tiles of a node that hold real columns: [first, end).
inline std::pair<int64_t, int64_t> real_tiles_of(const TreeNode& node, int64_t real_tiles) {
  return {node.first_tile(), std::min(node.end_tile(), real_tiles)};
}

// Per-thread scratch of the tile loop.
struct Scratch {
  std::vector<float> w32;       // [W, H] the tile's weight rows in fp32 (bf16/fp16 inputs)
  std::vector<float> z;         // [row_block, W] the tile's logits
  std::vector<float> g;         // [row_block, W] their gradient
  std::vector<int64_t> target;  // [row_block] each row's target column in the tile, or -1
  // fp32 grad_weight chains for bf16 / fp16 outputs: [W, H] of one tile (a single row block)
  // or the item's rows; kept for the thread's next items (the largest runs first).
  FloatBuffer gw;
  std::vector<NodePartial> leaf;
  PackedRows rows;  // the row block's hidden rows, prepared once for every tile (pack_row_block)
  PackedValues values;  // the same rows as every tile's grad_weight chain reads them
};

// The hidden states in fp32: the caller's memory for fp32, a widened copy otherwise.
struct Hidden32 {
  std::vector<float> copy;
  const float* data = nullptr;
  int64_t stride = 0;
};
Hidden32 widen_hidden(const LogitsView& hidden);

// The fp32 weight rows [first, first + count): the caller's memory for fp32, a widened copy in
// s.w32 otherwise. *ld gets their row stride.
const float* weight_rows(const LogitsView& weight, int64_t first, int64_t count, Scratch& s,
                         int64_t* ld);

// The real columns [first, end) of tile t that the shard holds: the whole tile's real columns,
// except in a shard that starts or ends inside the tile (grad_weight only: see backward).
inline std::pair<int64_t, int64_t> tile_columns(const FusedShard& shard, int64_t t) {
  const int64_t w = shard.geometry.tile_width;
  return {std::max(t * w, shard.vocab_start), std::min({(t + 1) * w, shard.geometry.real_vocab,
                                                        shard.vocab_start + shard.weight.rows})};
}

// Prepares hidden rows [r0, r0 + m) in s.rows for tile_logits over every tile of a row block.
void pack_row_block(const DotOps& ops, const Hidden32& h, int64_t r0, int64_t m, int64_t k,
                    Scratch& s);

// The logits of tile t's columns (tile_columns) for the rows of s.rows (pack_row_block) into s.z
// ([m, W], row stride W); returns their count. *w_out / *ldw_out (when not null) get their fp32
// weight rows.
int64_t tile_logits(const DotOps& ops, const FusedShard& shard, int64_t t, Scratch& s,
                    const float** w_out = nullptr, int64_t* ldw_out = nullptr);

}  // namespace detlogp::fused
