#pragma once
// Where every rank's work lies in the vocabulary, computed by every rank from the contract
// alone (so no rank needs a collective to know another's payload layout): the tile geometry,
// each rank's tile range and canonical cover, and which rank owns each row's target.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "detlogp/contract.hpp"
#include "detlogp/numerics.hpp"

namespace detlogp::op {

inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }  // no overflow

// The contract's tile geometry: its real vocabulary and tile width.
TileGeometry tile_geometry(const LogprobContract& c);

// The tiles [first, end) a shard owns, i.e. completes: those whose first column it holds,
// [ceil(start / W), ceil(end / W)). For any contiguous partition of the vocabulary these ranges
// partition the tiles contiguously in rank order; for a tile-aligned shard they are its tiles.
std::pair<int64_t, int64_t> tile_range(const VocabRange& bounds, int64_t tile_width);

// How a shard's columns [start, end) fall on the tiles (docs/numerics.md "Distribution").
struct ShardTiles {
  // Owned tiles whose real columns all lie in the shard: computed from the shard itself.
  int64_t full_begin = 0;
  int64_t full_end = 0;
  // The owned tile whose real columns run past the shard's end, completed by this shard from
  // the later shards' head fragments; -1 when none.
  int64_t split_tile = -1;
  // The tile whose real columns [start, head_end) the shard holds without owning it (its first
  // column is on an earlier shard): sent to that tile's owner; -1 when none.
  int64_t head_tile = -1;
  int64_t head_end = 0;

  int64_t head_cols(const VocabRange& bounds) const {
    return head_tile < 0 ? 0 : head_end - bounds.start;
  }
};
ShardTiles shard_tiles(const VocabRange& bounds, const TileGeometry& geometry);

// Every rank's canonical node set, in rank order: the canonical cover of its full tiles, then
// its split tile as a level-0 node. Together they cover the real tiles [0, T) exactly once.
struct Covers {
  std::vector<std::vector<TreeNode>> of_rank;
  std::size_t widest() const;         // the largest cover: node partials per row on the wire
  std::vector<TreeNode> all() const;  // every rank's nodes, concatenated in rank order
};
Covers covers_of_all_ranks(const LogprobContract& c);

// Who owns each row's target. Rows that are inactive, or whose target lies outside the real
// vocabulary (only possible with validate off), have no owner.
struct TargetOwners {
  std::vector<uint8_t> active;        // 1 per active row
  std::vector<int64_t> owner;         // the owning rank, or -1
  std::vector<int64_t> target_local;  // the target's local column on this rank when it owns it,
                                      // else -1
};
TargetOwners target_owners(const LogprobContract& c, std::span<const int64_t> targets);

// Each row's target column relative to `begin` when the row is active and its target is a real
// column in [begin, end), whichever rank holds it; else -1 (the targets of a split tile, for the
// rank that completes it).
std::vector<int64_t> targets_in_columns(const LogprobContract& c, std::span<const int64_t> targets,
                                        int64_t begin, int64_t end);

}  // namespace detlogp::op
