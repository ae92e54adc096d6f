#pragma once
// The numerics layer's public types: the tile structure of the vocabulary, the canonical tree
// over tiles, and the partial (m, s, u) that its nodes carry. The kernels compute partials of
// tree nodes, the operator moves them between ranks, and the canon (src/numerics/canon.hpp)
// merges them: all with this one type.

#include <cstdint>
#include <vector>

namespace detlogp {

// The tile structure of the whole vocabulary. Depends only on the real vocabulary R and the
// tile width W, never on the padded size or the TP layout.
struct TileGeometry {
  int64_t real_vocab = 0;  // R: columns [R, padded) are padding and never contribute
  int64_t tile_width = 0;  // W, always the contract's (its default: kDefaultTileWidth)

  // T = ceil(R / W), written so that no intermediate overflows. Requires tile_width > 0.
  int64_t num_real_tiles() const {
    return real_vocab / tile_width + (real_vocab % tile_width != 0 ? 1 : 0);
  }
  // K: the tree has 2^K leaves, the smallest power of two >= T.
  int tree_levels() const;
};

// A node of the canonical tree: covers tiles [index << level, (index + 1) << level).
struct TreeNode {
  int32_t level = 0;
  int64_t index = 0;
  int64_t first_tile() const { return index << level; }
  int64_t end_tile() const { return (index + 1) << level; }
  friend bool operator==(const TreeNode&, const TreeNode&) = default;
};

// The canonical cover of tiles [tile_begin, tile_end): the maximal aligned dyadic blocks inside
// it, left to right (at most 2K nodes). Tiles at or beyond T are identities and are left out,
// so a shard made only of padding tiles has an empty cover.
std::vector<TreeNode> canonical_cover(const TileGeometry& geometry, int64_t tile_begin,
                                      int64_t tile_end);

// A partial of a set of columns of one row (docs/numerics.md): m = max z, s = sum exp(z - m),
// u = sum exp(z - m) (z - m) (the entropy term; +0 when entropy is not requested).
// Identity (no columns, or all -inf): (-inf, 0, 0); poisoned (a NaN or +inf logit among the
// columns): all three NaN. canon::Partial is this type.
struct NodePartial {
  float m;
  float s;
  float u;
};

}  // namespace detlogp
