// The shard-bound helpers near INT64_MAX: every result is exact or a ContractError naming the
// field and the value; no signed overflow (the ASan+UBSan build runs this too).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "detlogp/contract.hpp"
#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void expect_overflow_error(const std::function<void()>& call, const std::string& field,
                           const std::string& value) {
  try {
    call();
    ADD_FAILURE() << "no ContractError";
  } catch (const ContractError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_NE(what.find(value), std::string::npos) << what;
    EXPECT_NE(what.find("overflows"), std::string::npos) << what;
  }
}

// Bounds that partition [0, padded) in rank order, each non-empty.
void expect_partition(const std::vector<VocabRange>& bounds, int64_t padded, int64_t tp) {
  ASSERT_EQ(static_cast<int64_t>(bounds.size()), tp);
  int64_t start = 0;
  for (const VocabRange& b : bounds) {
    EXPECT_EQ(b.start, start);
    EXPECT_GT(b.end, b.start);
    start = b.end;
  }
  EXPECT_EQ(start, padded);
}

TEST(BoundHelpers, MegatronPaddedVocabOverflowIsAContractError) {
  expect_overflow_error([] { megatron_padded_vocab(kMax, 1); }, "real_vocab_size",
                        std::to_string(kMax));
  expect_overflow_error([] { megatron_padded_vocab(kMax - 5, 2); }, "real_vocab_size",
                        std::to_string(kMax - 5));
  expect_overflow_error([] { megatron_padded_vocab(1, kMax / 2, 128); }, "multiple * tp_world_size",
                        std::to_string(kMax / 2));
  expect_overflow_error([] { megatron_bounds(kMax, 2); }, "real_vocab_size", std::to_string(kMax));
  // Exact near the top: the largest multiple of 128 fits.
  const int64_t top = kMax / 128 * 128;
  EXPECT_EQ(megatron_padded_vocab(top, 1), top);
  const VocabLayout layout = megatron_bounds(top, 1);
  expect_partition(layout.vocab_shard_bounds, top, 1);
}

TEST(BoundHelpers, EvenTileAlignedBoundsNearInt64Max) {
  // A tile width near INT64_MAX is one (partial) tile, never "0 tiles".
  const auto one = even_tile_aligned_bounds(151936, 1, kMax);
  expect_partition(one, 151936, 1);
  try {
    even_tile_aligned_bounds(151936, 2, kMax);
    ADD_FAILURE() << "no ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("has 1 tiles"), std::string::npos) << e.what();
  }
  // A padded size near INT64_MAX: the tile count and the bounds stay exact.
  for (int64_t tp : {1, 2, 3, 7}) {
    expect_partition(even_tile_aligned_bounds(kMax, tp, 128), kMax, tp);
  }
  // Five tiles of width kMax / 4, the last partial: at TP 1 (five tiles on one rank) or 2 (three
  // on rank 0) count * width passes INT64_MAX and must be clamped to the padded size.
  for (int64_t tp : {1, 2, 3, 5}) {
    expect_partition(even_tile_aligned_bounds(kMax - 1, tp, kMax / 4), kMax - 1, tp);
  }
}

TEST(BoundHelpers, EvenBoundsNearInt64Max) {
  for (int64_t tp : {1, 2, 3, 1000}) expect_partition(even_bounds(kMax, tp), kMax, tp);
}

}  // namespace
}  // namespace detlogp
