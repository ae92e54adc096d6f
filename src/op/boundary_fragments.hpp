#pragma once
// The boundary fragments of unaligned shard bounds (docs/numerics.md "Distribution"): a tile
// split across ranks is completed by its owner, the rank holding its first column. Before the
// node partials, one all-gather carries every rank's head fragment (the real columns it holds of
// the tile before its first owned tile), raw in the logits dtype; each owner assembles its split
// tile from its own tail columns and the later ranks' fragments. Layouts and sizes follow from the
// contract alone, so the blocks carry no header. With tile-aligned bounds nothing is exchanged.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/views.hpp"

namespace detlogp::op {

// Columns per row of the widest head fragment of any rank: 0 when no tile is split (then there is
// no exchange), at most W - 1.
int64_t fragment_width(const LogprobContract& c);

// Bytes one rank sends in the fragment all-gather: rows x fragment_width x the dtype's size.
int64_t fragment_block_bytes(const LogprobContract& c, int64_t rows);

// This rank's split tile, assembled: [rows, the tile's real columns] in the logits dtype,
// starting at global column `vocab_start` (the tile's first).
struct SplitTile {
  std::vector<std::byte> bytes;
  LogitsView view;  // cols == 0 when this rank completes no split tile
  int64_t vocab_start = 0;
};

// The fragment all-gather (call it on every rank when fragment_width(c) > 0; a transport failure
// names the step) and this rank's split tile.
SplitTile exchange_fragments(Communicator& comm, const LogprobContract& c,
                             const LogitsView& logits);

}  // namespace detlogp::op
