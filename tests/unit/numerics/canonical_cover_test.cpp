// The canonical tree (numerics.md "Tree over tiles", "Distribution"): tree_levels and the
// canonical cover of tile ranges.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "detlogp/kernels.hpp"

namespace detlogp {
namespace {

TEST(TreeLevels, SmallestPowerOfTwoAtLeastT) {
  struct Case {
    int64_t real_vocab, width;
    int64_t tiles;
    int levels;
  };
  for (const Case& c :
       {Case{1, 128, 1, 0}, Case{128, 128, 1, 0}, Case{129, 128, 2, 1}, Case{151936, 128, 1187, 11},
        Case{152064, 128, 1188, 11}, Case{1000, 48, 21, 5}, Case{4096, 4, 1024, 10},
        Case{4097, 4, 1025, 11}, Case{0, 128, 0, 0}}) {
    const TileGeometry g{c.real_vocab, c.width};
    EXPECT_EQ(g.num_real_tiles(), c.tiles) << c.real_vocab << "/" << c.width;
    EXPECT_EQ(g.tree_levels(), c.levels) << c.real_vocab << "/" << c.width;
  }
}

void check_cover(const TileGeometry& g, int64_t a, int64_t b) {
  const int64_t t = g.num_real_tiles();
  const int k = g.tree_levels();
  const std::vector<TreeNode> cover = canonical_cover(g, a, b);
  const int64_t lo = a < t ? a : t;
  const int64_t hi = b < t ? b : t;
  SCOPED_TRACE(::testing::Message() << "T=" << t << " [" << a << ", " << b << ")");
  if (lo >= hi) {
    EXPECT_TRUE(cover.empty());
    return;
  }
  // Disjoint, ordered, contiguous: the union is exactly [lo, hi).
  int64_t next = lo;
  for (const TreeNode& n : cover) {
    EXPECT_GE(n.level, 0);
    EXPECT_LE(n.level, k);
    EXPECT_EQ(n.first_tile(), n.index << n.level);
    EXPECT_EQ(n.first_tile(), next);
    EXPECT_LE(n.end_tile(), hi);
    next = n.end_tile();
    // Maximal: the parent block does not fit inside [lo, hi) (so no two siblings appear).
    if (n.level < k) {
      const int64_t pf = (n.index >> 1) << (n.level + 1);
      const int64_t pe = pf + (int64_t{2} << n.level);
      EXPECT_FALSE(pf >= lo && pe <= hi) << "node (" << n.level << ", " << n.index << ")";
    }
  }
  EXPECT_EQ(next, hi);
  for (size_t i = 0; i + 1 < cover.size(); ++i) {
    const TreeNode& l = cover[i];
    const TreeNode& r = cover[i + 1];
    EXPECT_FALSE(l.level == r.level && (l.index & 1) == 0 && r.index == l.index + 1)
        << "adjacent siblings at level " << l.level;
  }
  EXPECT_LE(static_cast<int64_t>(cover.size()), k == 0 ? 1 : 2 * k);
}

TEST(CanonicalCover, RandomRangesAreExactMaximalAndSmall) {
  std::mt19937_64 rng(11);
  for (const auto& [r, w] : {std::pair<int64_t, int64_t>{151936, 128},
                             {152064, 128},
                             {1000, 48},
                             {1000, 4},
                             {37, 4},
                             {1, 128},
                             {128, 128},
                             {4096, 4},
                             {4100, 4},
                             {100003, 32}}) {
    const TileGeometry g{r, w};
    const int64_t t = g.num_real_tiles();
    std::uniform_int_distribution<int64_t> pick(0, t + 8);
    for (int i = 0; i < 400; ++i) {
      int64_t a = pick(rng), b = pick(rng);
      if (a > b) std::swap(a, b);
      check_cover(g, a, b);
    }
    check_cover(g, 0, t);
    check_cover(g, 0, t + 100);
    check_cover(g, t, t + 5);      // padding only: empty
    check_cover(g, t + 3, t + 9);  // padding only: empty
    check_cover(g, 5, 5);          // empty range
  }
}

TEST(CanonicalCover, ExhaustiveSmallTrees) {
  for (int64_t t = 1; t <= 40; ++t) {
    const TileGeometry g{t * 4 - 1, 4};
    ASSERT_EQ(g.num_real_tiles(), t);
    for (int64_t a = 0; a <= t + 2; ++a) {
      for (int64_t b = a; b <= t + 2; ++b) check_cover(g, a, b);
    }
  }
}

TEST(CanonicalCover, PowerOfTwoWholeRangeIsTheRoot) {
  const TileGeometry g{1024 * 128, 128};
  const std::vector<TreeNode> cover = canonical_cover(g, 0, 1024);
  ASSERT_EQ(cover.size(), 1u);
  EXPECT_EQ(cover[0], (TreeNode{10, 0}));
}

TEST(CanonicalCover, RejectsBadRanges) {
  const TileGeometry g{1000, 128};
  EXPECT_THROW(canonical_cover(g, -1, 3), std::invalid_argument);
  EXPECT_THROW(canonical_cover(g, 4, 3), std::invalid_argument);
}

}  // namespace
}  // namespace detlogp
