// The post-order program of a row's root (numerics/root_program.hpp).
#include "numerics/root_program.hpp"

#include <algorithm>
#include <stdexcept>

namespace detlogp::numerics {
namespace {

struct Slot {
  int32_t level;
  int64_t index;
  int32_t slot;
  bool operator<(const Slot& o) const {
    return level != o.level ? level < o.level : index < o.index;
  }
};

class Builder {
 public:
  Builder(const TileGeometry& geometry, std::span<const TreeNode> nodes, std::vector<int32_t>& ops)
      : real_tiles_(geometry.num_real_tiles()), ops_(ops) {
    for (size_t j = 0; j < nodes.size(); ++j) {
      given_.push_back(Slot{nodes[j].level, nodes[j].index, static_cast<int32_t>(j)});
    }
    std::sort(given_.begin(), given_.end());
  }

  // Emits value(level, index); returns the stack depth its evaluation needs.
  int emit(int level, int64_t index) {
    const auto it = std::lower_bound(given_.begin(), given_.end(), Slot{level, index, 0});
    if (it != given_.end() && it->level == level && it->index == index) {
      ops_.push_back(it->slot);
      return 1;
    }
    if ((index << level) >= real_tiles_) {
      ops_.push_back(kPushIdentity);
      return 1;
    }
    if (level == 0) throw std::logic_error("root program: the nodes do not cover the real tiles");
    const int left = emit(level - 1, 2 * index);
    const int right = emit(level - 1, 2 * index + 1);
    ops_.push_back(kMerge);
    return std::max(left, right + 1);
  }

 private:
  int64_t real_tiles_;
  std::vector<int32_t>& ops_;
  std::vector<Slot> given_;
};

}  // namespace

RootProgram::RootProgram(const TileGeometry& geometry, std::span<const TreeNode> nodes) {
  Builder builder(geometry, nodes, ops_);
  if (builder.emit(geometry.tree_levels(), 0) > kRootStackDepth) {
    throw std::logic_error("root program: the tree is deeper than the evaluation stack");
  }
}

}  // namespace detlogp::numerics
