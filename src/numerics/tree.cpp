// The canonical tree over vocabulary tiles (numerics.md "Tree over tiles" and "Distribution").
#include <string>

#include "detlogp/errors.hpp"
#include "detlogp/numerics.hpp"

namespace detlogp {

int TileGeometry::tree_levels() const {
  const int64_t tiles = num_real_tiles();
  int levels = 0;
  while ((int64_t{1} << levels) < tiles) ++levels;
  return levels;
}

std::vector<TreeNode> canonical_cover(const TileGeometry& geometry, int64_t tile_begin,
                                      int64_t tile_end) {
  if (geometry.tile_width <= 0 || geometry.real_vocab < 0) {
    throw ContractError(
        "canonical_cover: tile_width must be positive and real_vocab "
        "non-negative; got tile_width=" +
        std::to_string(geometry.tile_width) + " real_vocab=" + std::to_string(geometry.real_vocab));
  }
  if (tile_begin < 0 || tile_end < tile_begin) {
    throw ContractError("canonical_cover: the tile range must satisfy 0 <= begin <= end; got [" +
                        std::to_string(tile_begin) + ", " + std::to_string(tile_end) + ")");
  }
  const int64_t real_tiles = geometry.num_real_tiles();
  // Tiles at or beyond T are identities: clip them away.
  int64_t a = tile_begin < real_tiles ? tile_begin : real_tiles;
  const int64_t b = tile_end < real_tiles ? tile_end : real_tiles;
  const int top = geometry.tree_levels();
  std::vector<TreeNode> nodes;
  // Greedy left to right: at each step take the largest aligned block starting at `a` that
  // fits inside [a, b). This is the segment-tree decomposition: maximal dyadic blocks.
  while (a < b) {
    int level = 0;
    while (level < top && (a & ((int64_t{1} << (level + 1)) - 1)) == 0 &&
           a + (int64_t{1} << (level + 1)) <= b) {
      ++level;
    }
    nodes.push_back(TreeNode{level, a >> level});
    a += int64_t{1} << level;
  }
  return nodes;
}

}  // namespace detlogp
