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

// The tiles [first, end) of a tile-aligned shard.
std::pair<int64_t, int64_t> tile_range(const VocabRange& bounds, int64_t tile_width);

// Every rank's canonical cover, in rank order.
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

}  // namespace detlogp::op
