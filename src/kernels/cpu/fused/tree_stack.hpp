#pragma once
// The canonical tree over vocabulary tiles, evaluated from a left-to-right sequence of its
// nodes: the blocks of a partition of the real tiles (leaves of one node, or every rank's cover
// concatenated in rank order). Pushing a node merges it with its left sibling whenever that
// sibling is on top of the stack (post-order evaluation); finish() folds what remains right to
// left, which is the tree with its absent right subtrees (tiles at or beyond T) passed through.
// Each merge is merge(left, right) of two complete subtrees, so the result is the canonical
// tree whatever the partition: the TP layout or the work split only decide which nodes arrive.

#include <utility>
#include <vector>

#include "detlogp/numerics.hpp"

namespace detlogp::fused {

// Merge: void(Value& left, Value&& right) leaving merge(left, right) in `left`.
template <class Value, class Merge>
class TreeStack {
 public:
  explicit TreeStack(Merge merge) : merge_(std::move(merge)) {}

  void push(TreeNode node, Value value) {
    while (!stack_.empty() && stack_.back().node.level == node.level && node.index % 2 == 1 &&
           stack_.back().node.index == node.index - 1) {
      Entry left = std::move(stack_.back());
      stack_.pop_back();
      merge_(left.value, std::move(value));
      value = std::move(left.value);
      node = TreeNode{node.level + 1, node.index / 2};
    }
    stack_.push_back(Entry{node, std::move(value)});
  }

  bool empty() const { return stack_.empty(); }

  // The value of the subtree the pushed nodes make up. Requires !empty().
  Value finish() {
    Value acc = std::move(stack_.back().value);
    for (std::size_t i = stack_.size() - 1; i-- > 0;) {
      merge_(stack_[i].value, std::move(acc));
      acc = std::move(stack_[i].value);
    }
    stack_.clear();
    return acc;
  }

 private:
  struct Entry {
    TreeNode node;
    Value value;
  };
  Merge merge_;
  std::vector<Entry> stack_;
};

}  // namespace detlogp::fused
