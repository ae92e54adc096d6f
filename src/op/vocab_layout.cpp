#include "op/vocab_layout.hpp"

#include <algorithm>

namespace detlogp::op {

TileGeometry tile_geometry(const LogprobContract& c) {
  return TileGeometry{.real_vocab = c.sharding().real_vocab_size(), .tile_width = c.tile_width()};
}

std::pair<int64_t, int64_t> tile_range(const VocabRange& bounds, int64_t tile_width) {
  return {ceil_div(bounds.start, tile_width), ceil_div(bounds.end, tile_width)};
}

ShardTiles shard_tiles(const VocabRange& bounds, const TileGeometry& g) {
  const int64_t w = g.tile_width;
  const int64_t real_tiles = g.num_real_tiles();
  const auto [first, end] = tile_range(bounds, w);
  ShardTiles t{.full_begin = first, .full_end = end};
  // The last owned tile is split when it is real and its real columns run past the shard's end.
  if (end > first && end - 1 < real_tiles && std::min(end * w, g.real_vocab) > bounds.end) {
    t.split_tile = --t.full_end;
  }
  const int64_t head = bounds.start / w;
  if (bounds.start % w != 0 && bounds.start < g.real_vocab) {
    const int64_t head_end = std::min({bounds.end, (head + 1) * w, g.real_vocab});
    if (head_end > bounds.start) {
      t.head_tile = head;
      t.head_end = head_end;
    }
  }
  return t;
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
    const ShardTiles t = shard_tiles(b, g);
    std::vector<TreeNode> nodes = canonical_cover(g, t.full_begin, t.full_end);
    if (t.split_tile >= 0) nodes.push_back(TreeNode{.level = 0, .index = t.split_tile});
    covers.of_rank.push_back(std::move(nodes));
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

std::vector<int64_t> targets_in_columns(const LogprobContract& c, std::span<const int64_t> targets,
                                        int64_t begin, int64_t end) {
  const auto& active_mask = c.mask().active_mask();
  const int64_t stop = std::min(end, c.sharding().real_vocab_size());
  std::vector<int64_t> local(targets.size(), -1);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (active_mask[i] && targets[i] >= begin && targets[i] < stop) local[i] = targets[i] - begin;
  }
  return local;
}

}  // namespace detlogp::op
