#pragma once
// The root of a row rebuilt from the partials of given tree nodes, written once for every
// backend (docs/numerics.md, distribution over ranks): value(level, index) is the given node's
// partial when that node is given, the identity when the block starts at or beyond T, and
// otherwise canon::merge(value(left child), value(right child)).
//
// RootProgram evaluates that recursion ahead of time into a post-order program over a stack:
// an op >= 0 pushes the partial of that node slot, kPushIdentity pushes the identity and
// kMerge pops right, pops left and pushes merge(left, right). run_root_program executes it for
// one row; it is host and device code (the CUDA kernel runs the same function per thread).

#include <cstdint>
#include <span>
#include <vector>

#include "detlogp/numerics.hpp"
#include "numerics/canon.hpp"

namespace detlogp::numerics {

inline constexpr int32_t kPushIdentity = -1;
inline constexpr int32_t kMerge = -2;
// Deepest stack a program may need: a tree of 2^K leaves needs K + 1 <= 64 entries.
inline constexpr int kRootStackDepth = 64;

class RootProgram {
 public:
  // `nodes` must cover the real tiles [0, T) exactly once (kernels::validate_exact_cover);
  // their partials are read as row[j] for nodes[j].
  RootProgram(const TileGeometry& geometry, std::span<const TreeNode> nodes);

  std::span<const int32_t> ops() const { return ops_; }

 private:
  std::vector<int32_t> ops_;
};

// The root partial of one row: `row[j]` is the partial of the program's node slot j.
template <bool kWithEntropy>
DETLOGP_HD canon::Partial run_root_program(const int32_t* ops, int64_t num_ops,
                                           const NodePartial* row) {
  canon::Partial stack[kRootStackDepth];
  int top = 0;
  for (int64_t i = 0; i < num_ops; ++i) {
    const int32_t op = ops[i];
    if (op >= 0) {
      stack[top++] = row[op];
    } else if (op == kPushIdentity) {
      stack[top++] = canon::identity_partial();
    } else {
      stack[top - 2] = canon::merge<kWithEntropy>(stack[top - 2], stack[top - 1]);
      --top;
    }
  }
  return stack[0];
}

}  // namespace detlogp::numerics
