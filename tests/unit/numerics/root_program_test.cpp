// The root of a row rebuilt from given nodes (numerics/root_program.hpp): the post-order program
// of the tree above the nodes, and its evaluation equal to the canon's nested merges, bitwise.
#include "numerics/root_program.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "detlogp/numerics.hpp"
#include "numerics/canon.hpp"

namespace detlogp {
namespace {

TEST(RootProgram, PostOrderOverTheGivenNodes) {
  // T = 3 tiles (K = 2): the cover of [0, 3) is node (1, 0) and leaf 2; tile 3 is padding.
  const TileGeometry g{.real_vocab = 300, .tile_width = 100};
  const std::vector<TreeNode> nodes = canonical_cover(g, 0, 3);
  ASSERT_EQ(nodes, (std::vector<TreeNode>{{1, 0}, {0, 2}}));
  const numerics::RootProgram program(g, nodes);
  const std::vector<int32_t> want = {0, 1, numerics::kPushIdentity, numerics::kMerge,
                                     numerics::kMerge};
  EXPECT_EQ(std::vector<int32_t>(program.ops().begin(), program.ops().end()), want);
}

TEST(RootProgram, EvaluatesToTheCanonsMerges) {
  // T = 5 (K = 3), nodes given out of order: leaf 4, then node (2, 0).
  const TileGeometry g{.real_vocab = 5 * 16, .tile_width = 16};
  const std::vector<TreeNode> nodes = {{0, 4}, {2, 0}};
  const NodePartial row[2] = {{3.0f, 1.25f, -0.5f}, {1.0f, 7.5f, -2.0f}};
  const numerics::RootProgram program(g, nodes);
  const auto n = static_cast<int64_t>(program.ops().size());
  const canon::Partial id = canon::identity_partial();
  // root = merge(node (2, 0), merge(merge(leaf 4, leaf 5), merge(leaf 6, leaf 7))).
  for (bool entropy : {false, true}) {
    const canon::Partial want = canon::merge(
        row[1],
        canon::merge(canon::merge(row[0], id, entropy), canon::merge(id, id, entropy), entropy),
        entropy);
    const canon::Partial got =
        entropy ? numerics::run_root_program<true>(program.ops().data(), n, row)
                : numerics::run_root_program<false>(program.ops().data(), n, row);
    EXPECT_EQ(canon::bits_of(got.m), canon::bits_of(want.m));
    EXPECT_EQ(canon::bits_of(got.s), canon::bits_of(want.s));
    EXPECT_EQ(canon::bits_of(got.u), canon::bits_of(want.u));
  }
}

}  // namespace
}  // namespace detlogp
