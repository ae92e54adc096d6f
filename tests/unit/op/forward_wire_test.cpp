// The forward all-gather's wire format (op/forward_wire.hpp): where each partial and each target
// logit lies in a rank's block, identity padding, the entropy term only when requested, and the
// blocks of a gathered buffer in rank order.
#include "op/forward_wire.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace detlogp {
namespace {

TEST(ForwardWire, BlockLayoutWithEntropy) {
  const op::ForwardWire wire(/*rows=*/2, /*width=*/3, /*entropy=*/true);
  EXPECT_EQ(wire.block_floats(), 2u * (3u * 3u + 1u));
  EXPECT_EQ(wire.block_bytes(), static_cast<int64_t>(wire.block_floats() * sizeof(float)));
  std::vector<float> block(wire.block_floats(), -7.0f);
  wire.put_partial(block, 1, 2, NodePartial{1.5f, 2.5f, 3.5f});
  wire.put_target(block, 1, 9.25f);
  // Row 1, partial 2: floats (1 * 3 + 2) * 3 ..; the targets follow the 2 x 3 partials.
  EXPECT_EQ(block[15], 1.5f);
  EXPECT_EQ(block[16], 2.5f);
  EXPECT_EQ(block[17], 3.5f);
  EXPECT_EQ(block[2 * 3 * 3 + 1], 9.25f);
  const NodePartial p = wire.partial(block, 1, 2);
  EXPECT_EQ(p.m, 1.5f);
  EXPECT_EQ(p.s, 2.5f);
  EXPECT_EQ(p.u, 3.5f);
  EXPECT_EQ(wire.target(block, 1), 9.25f);
}

TEST(ForwardWire, WithoutEntropyTwoFloatsAndUIsZero) {
  const op::ForwardWire wire(/*rows=*/3, /*width=*/2, /*entropy=*/false);
  EXPECT_EQ(wire.block_floats(), 3u * (2u * 2u + 1u));
  std::vector<float> block(wire.block_floats(), 0.0f);
  wire.put_partial(block, 2, 1, NodePartial{4.0f, 5.0f, 6.0f});
  EXPECT_EQ(block[(2 * 2 + 1) * 2], 4.0f);
  EXPECT_EQ(block[(2 * 2 + 1) * 2 + 1], 5.0f);
  EXPECT_EQ(block[3 * 2 * 2 + 0], 0.0f);  // the targets start right after: u was not sent
  const NodePartial p = wire.partial(block, 2, 1);
  EXPECT_EQ(p.u, 0.0f);
}

TEST(ForwardWire, PaddingIsTheIdentityAndBlocksAreInRankOrder) {
  const op::ForwardWire wire(/*rows=*/1, /*width=*/3, /*entropy=*/true);
  std::vector<float> gathered(2 * wire.block_floats(), 1.0f);
  std::span<float> rank1(gathered.data() + wire.block_floats(), wire.block_floats());
  wire.put_partial(rank1, 0, 0, NodePartial{2.0f, 1.0f, 0.5f});
  wire.pad_partials(rank1, 0, 1);
  wire.put_target(rank1, 0, -3.0f);
  const std::span<const float> block = wire.block_of(gathered, 1);
  EXPECT_EQ(block.data(), gathered.data() + wire.block_floats());
  for (std::size_t j = 1; j < 3; ++j) {
    const NodePartial id = wire.partial(block, 0, j);
    EXPECT_EQ(id.m, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(id.s, 0.0f);
    EXPECT_FALSE(std::signbit(id.s));
    EXPECT_EQ(id.u, 0.0f);
  }
  EXPECT_EQ(wire.partial(block, 0, 0).m, 2.0f);
  EXPECT_EQ(wire.target(block, 0), -3.0f);
  EXPECT_EQ(wire.target(wire.block_of(gathered, 0), 0), 1.0f);  // rank 0's block untouched
}

}  // namespace
}  // namespace detlogp
