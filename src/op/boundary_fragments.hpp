#pragma once
// The boundary fragments of unaligned shard bounds (docs/numerics.md "Distribution"): a tile
// split across ranks is completed by its owner, the rank holding its first column. One
// all-gather carries every rank's head fragment (the real columns it holds of the tile before its
// first owned tile), raw; each owner assembles its split tile from its own tail columns and the
// later ranks' fragments. The logits op sends the fragments' logits (its dtype) before the node
// partials. The fused lm_head sends their fp32 logits (computed from its weight rows) in forward,
// and their lm_head weight rows in backward when grad_hidden is computed (the owner's chain over
// the whole tile needs them). Layouts and sizes follow from the contract alone, so the blocks
// carry no header. With tile-aligned bounds nothing is exchanged.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/numerics.hpp"
#include "detlogp/views.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp::op {

// Columns per row of the widest head fragment of any rank: 0 when no tile is split (then there is
// no exchange), at most W - 1.
int64_t fragment_width(const LogprobContract& c);

// Bytes one rank sends in the fragment all-gather: fragment_width x `column_bytes`, the bytes of
// one vocabulary column (rows x the dtype's size for logits, H x the dtype's size for a weight
// row).
int64_t fragment_block_bytes(const LogprobContract& c, int64_t column_bytes);

// This rank's split tile, assembled in the input dtype, starting at global column `vocab_start`
// (the tile's first). From logits: view [rows, the tile's real columns]. From a weight shard:
// view [the tile's real columns, H] (weight rows). view.data is null (and its vocabulary extent
// 0) when this rank completes no split tile.
struct SplitTile {
  std::vector<std::byte> bytes;
  LogitsView view;
  int64_t vocab_start = 0;
  int64_t cols = 0;  // the tile's real columns; 0 when none
};

// The fragment all-gather of logits [rows, local_vocab] (call it on every rank when
// fragment_width(c) > 0; a transport failure names the step) and this rank's split tile.
SplitTile exchange_fragments(Communicator& comm, const LogprobContract& c,
                             const LogitsView& logits);

// The same all-gather of fp32 logits that the caller computed of only its head fragment, head
// [rows, its head columns], and of its own columns of the split tile it completes, tail [rows,
// those columns] (the fused lm_head's forward, which never holds the rest).
SplitTile exchange_fragment_logits(Communicator& comm, const LogprobContract& c,
                                   const LogitsView& head, const LogitsView& tail);

// The same all-gather of lm_head weight rows [local_vocab, H] (the fused lm_head's backward).
SplitTile exchange_weight_fragments(Communicator& comm, const LogprobContract& c,
                                    const LogitsView& weight);

// The local columns [skip, skip + cols) from which a shard computes the cover of its full tiles:
// from its first full tile's first column (global column `start`) to its split tile's first
// column, or to the shard's end (padding included) when it completes no split tile. cols is 0
// when it has no full tile.
struct FullTiles {
  int64_t start = 0;
  int64_t skip = 0;
  int64_t cols = 0;
};
FullTiles full_tiles_of(const ShardTiles& tiles, const VocabRange& bounds, int64_t tile_width);

// This rank's canonical node partials [rows][nodes] (op::covers_of_all_ranks) from those of its
// full tiles' cover, [rows][full_nodes], and, when it completes a split tile (its last node),
// that tile's partials [rows] (empty otherwise).
std::vector<NodePartial> join_split_partials(std::vector<NodePartial> full, std::size_t full_nodes,
                                             std::span<const NodePartial> split, int64_t rows);

}  // namespace detlogp::op
