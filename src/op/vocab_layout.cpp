#include "op/vocab_layout.hpp"

#include <algorithm>

namespace detlogp::op {

TileGeometry tile_geometry(const LogprobContract& c) {
  return TileGeometry{.real_vocab = c.sharding().real_vocab_size(), .tile_width = c.tile_width()};
}

std::pair<int64_t, int64_t> tile_range(const VocabRange& bounds, int64_t tile_width) {
  return {bounds.start / tile_width, ceil_div(bounds.end, tile_width)};
}

std::size_t Covers::widest() const {
  std::size_t m = 0;
  for (const auto& c : of_rank) m = std::max(m, c.size());
  return m;
}

std::vector<TreeNode> Covers::all() const {
  std::vector<TreeNode> nodes;
  for (const auto& c : of_rank) nodes.insert(nodes.end(), c.begin(), c.end());
  return nodes;
}

Covers covers_of_all_ranks(const LogprobContract& c) {
  const TileGeometry g = tile_geometry(c);
  Covers covers;
  for (const VocabRange& b : c.sharding().vocab_shard_bounds()) {
    const auto [first, end] = tile_range(b, g.tile_width);
    covers.of_rank.push_back(canonical_cover(g, first, end));
  }
  return covers;
}

TargetOwners target_owners(const LogprobContract& c, std::span<const int64_t> targets) {
  const ShardingSpec& sh = c.sharding();
  const auto& active_mask = c.mask().active_mask();
  const std::size_t rows = targets.size();
  TargetOwners t;
  t.active.resize(rows);
  t.owner.assign(rows, -1);
  t.target_local.assign(rows, -1);
  for (std::size_t i = 0; i < rows; ++i) {
    t.active[i] = active_mask[i] ? 1 : 0;
    const int64_t target = targets[i];
    if (!active_mask[i] || target < 0 || target >= sh.real_vocab_size()) continue;
    t.owner[i] = sh.owner_rank(target);
    if (t.owner[i] == sh.tp_rank()) t.target_local[i] = target - sh.local_vocab_start();
  }
  return t;
}

}  // namespace detlogp::op
