// ShardingSpec, MaskSpec, ReductionSpec, OutputSpec, LogprobContract and the shard-bound helpers
// (the fields, defaults and validation order of docs/contract.md).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "contract_fixtures.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/version.hpp"

namespace detlogp {
namespace {

using namespace testing;  // the Qwen3-8B example fixtures (contract_fixtures.hpp)

ShardingParams qwen3_tp2_params() {
  return {.tp_rank = 0,
          .tp_world_size = 2,
          .vocab_shard_bounds = {{0, 76032}, {76032, 152064}},
          .real_vocab_size = kQwen3Real,
          .padded_vocab_size = kQwen3PaddedTP2};
}

ShardingSpec sharding_with_bounds(std::vector<VocabRange> bounds) {
  ShardingParams p = qwen3_tp2_params();
  p.vocab_shard_bounds = std::move(bounds);
  return ShardingSpec(p);
}

// ----- ShardingSpec ---------------------------------------------------------------------------

TEST(ShardingSpec, Qwen3TP2CP2Builds) {
  const ShardingSpec s = qwen3_sharding(0, 0);
  EXPECT_EQ(s.tp_rank(), 0);
  EXPECT_EQ(s.tp_world_size(), 2);
  EXPECT_EQ(s.cp_rank(), 0);
  EXPECT_EQ(s.cp_world_size(), 2);
  EXPECT_EQ(s.real_vocab_size(), 151936);
  EXPECT_EQ(s.padded_vocab_size(), 152064);
  EXPECT_EQ(s.local_vocab_start(), 0);
  EXPECT_EQ(s.local_vocab_end(), 76032);
  EXPECT_EQ(s.local_vocab_size(), 76032);
  const ShardingSpec s1 = qwen3_sharding(1, 1);
  EXPECT_EQ(s1.local_vocab_start(), 76032);
  EXPECT_EQ(s1.local_vocab_end(), 152064);
  EXPECT_EQ(s1.vocab_shard_bounds(), s.vocab_shard_bounds());  // the full table on every rank
}

TEST(ShardingSpec, TPSweepOfEvenBounds) {
  for (int64_t tp : {1, 2, 4}) {
    const auto bounds = even_bounds(kQwen3PaddedTP2, tp);
    ASSERT_EQ(static_cast<int64_t>(bounds.size()), tp);
    EXPECT_EQ(bounds.back().end, kQwen3PaddedTP2);
    for (int64_t r = 0; r < tp; ++r) {
      const ShardingSpec s({.tp_rank = r,
                            .tp_world_size = tp,
                            .vocab_shard_bounds = bounds,
                            .real_vocab_size = kQwen3Real,
                            .padded_vocab_size = kQwen3PaddedTP2});
      EXPECT_EQ(s.owner_rank(kQwen3Real - 1), tp - 1);
      EXPECT_EQ(s.owner_rank(0), 0);
      EXPECT_EQ(s.local_vocab_start(), bounds[r].start);
    }
  }
  EXPECT_EQ(even_bounds(kQwen3PaddedTP2, 4)[1], (VocabRange{38016, 76032}));
}

TEST(ShardingSpec, RankRanges) {
  ShardingParams p = qwen3_tp2_params();
  p.tp_rank = 2;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "tp_rank=2 must be smaller than tp_world_size=2");
  p = qwen3_tp2_params();
  p.tp_rank = -1;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "tp_rank must be a non-negative integer; got -1");
  p = qwen3_tp2_params();
  p.tp_world_size = 0;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "tp_world_size must be a positive integer; got 0");
  p = qwen3_tp2_params();
  p.cp_world_size = 2;
  p.cp_rank = 2;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "cp_rank=2 must be smaller than cp_world_size=2");
  p.cp_rank = -3;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "cp_rank must be a non-negative integer; got -3");
  p.cp_world_size = -1;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "cp_world_size must be a positive integer; got -1");
}

TEST(ShardingSpec, VocabSizes) {
  ShardingParams p = qwen3_tp2_params();
  p.real_vocab_size = 0;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "real_vocab_size must be a positive integer; got 0");
  p = qwen3_tp2_params();
  p.padded_vocab_size = -5;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "padded_vocab_size must be a positive integer; got -5");
  p = qwen3_tp2_params();
  p.padded_vocab_size = kQwen3Real - 1;
  p.vocab_shard_bounds = {{0, 76032}, {76032, kQwen3Real - 1}};
  EXPECT_CONTRACT_ERROR(ShardingSpec(p),
                        "padded_vocab_size=151935 must not be smaller than real_vocab_size=151936");
  p.padded_vocab_size = kQwen3Real;  // padded == real is fine
  p.vocab_shard_bounds = {{0, 76032}, {76032, kQwen3Real}};
  EXPECT_NO_THROW(ShardingSpec{p});
}

TEST(ShardingSpec, BoundsCount) {
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({}),
                        "exactly one (start, end) pair per TP rank; got 0 pairs for "
                        "tp_world_size=2");
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 152064}}),
                        "one (start, end) pair per TP rank; got 1 pairs for tp_world_size=2");
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 50000}, {50000, 100000}, {100000, 152064}}),
                        "got 3 pairs");
}

TEST(ShardingSpec, EmptyShardIsLegalAndBackwardsBoundsAreNot) {
  ShardingParams p = qwen3_tp2_params();
  p.vocab_shard_bounds = {{0, 76032}, {76032, 76032}};
  p.padded_vocab_size = 76032;
  p.real_vocab_size = 76032;
  const ShardingSpec empty_last(p);
  EXPECT_EQ(empty_last.owner_rank(76031), 0);
  const ShardingSpec empty_first = sharding_with_bounds({{0, 0}, {0, 152064}});
  EXPECT_EQ(empty_first.owner_rank(0), 1);
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 76032}, {76032, 76000}}),
                        "vocab_shard_bounds[1] must satisfy end >= start; got [76032, 76000)");
}

TEST(ShardingSpec, GapAndOverlapAreNotContiguous) {
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 76000}, {76032, 152064}}),
                        "must form a contiguous [0, padded_vocab_size) partition in TP-rank "
                        "order; rank 1 starts at 76032, expected 76000");
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 76064}, {76032, 152064}}),
                        "contiguous [0, padded_vocab_size) partition in TP-rank order; rank 1 "
                        "starts at 76032, expected 76064");
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{1, 76032}, {76032, 152064}}),
                        "rank 0 starts at 1, expected 0");
  // Out of rank order: rank 0 holds the upper half.
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{76032, 152064}, {0, 76032}}), "contiguous");
}

TEST(ShardingSpec, ShortAndLongCover) {
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 76032}, {76032, 152000}}),
                        "must cover padded_vocab_size exactly; covered 152000, declared 152064");
  EXPECT_CONTRACT_ERROR(sharding_with_bounds({{0, 76032}, {76032, 152192}}),
                        "covered 152192, declared 152064");
}

TEST(ShardingSpec, ValidationOrderReportsTheEarliestRule) {
  // Every rule broken at once: the rank check (rule 1) speaks first.
  ShardingParams p{.tp_rank = 5,
                   .tp_world_size = 2,
                   .vocab_shard_bounds = {{3, 1}},
                   .real_vocab_size = 0,
                   .padded_vocab_size = -1,
                   .cp_rank = 9,
                   .cp_world_size = 1};
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "tp_rank=5");
  p.tp_rank = 0;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "cp_rank=9");
  p.cp_rank = 0;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "real_vocab_size must be a positive integer");
  p.real_vocab_size = 10;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "padded_vocab_size must be a positive integer");
  p.padded_vocab_size = 16;
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "one (start, end) pair per TP rank");
  p.vocab_shard_bounds = {{3, 1}, {1, 16}};
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "end >= start");
  p.vocab_shard_bounds = {{3, 8}, {8, 12}};
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "contiguous");
  p.vocab_shard_bounds = {{0, 8}, {8, 12}};
  EXPECT_CONTRACT_ERROR(ShardingSpec(p), "cover padded_vocab_size exactly");
  p.vocab_shard_bounds = {{0, 8}, {8, 16}};
  EXPECT_NO_THROW(ShardingSpec{p});
}

TEST(ShardingSpec, OwnerRankAtShardEdges) {
  const ShardingSpec s = qwen3_sharding();
  EXPECT_EQ(s.owner_rank(0), 0);
  EXPECT_EQ(s.owner_rank(76031), 0);
  EXPECT_EQ(s.owner_rank(76032), 1);
  EXPECT_EQ(s.owner_rank(kQwen3Real - 1), 1);
  EXPECT_CONTRACT_ERROR(s.owner_rank(-1),
                        "token_id=-1 is outside the real vocabulary [0, 151936); mask it as "
                        "inactive instead");
  EXPECT_CONTRACT_ERROR(s.owner_rank(kQwen3Real), "token_id=151936 is outside the real vocabulary");
  EXPECT_CONTRACT_ERROR(s.owner_rank(152063), "outside the real vocabulary");  // padding column
}

TEST(ShardingSpec, OwnerRankIsUniqueEverywhereOnUnevenBounds) {
  const ShardingSpec s({.tp_rank = 0,
                        .tp_world_size = 4,
                        .vocab_shard_bounds = {{0, 4}, {4, 16}, {16, 24}, {24, 32}},
                        .real_vocab_size = 27,
                        .padded_vocab_size = 32});
  for (int64_t t = 0; t < 27; ++t) {
    int owners = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const VocabRange b = s.vocab_shard_bounds()[r];
      if (b.start <= t && t < b.end) {
        ++owners;
        EXPECT_EQ(s.owner_rank(t), r) << t;
      }
    }
    EXPECT_EQ(owners, 1);
  }
}

TEST(ShardingSpec, PaddingOnlyShardIsLegal) {
  const ShardingSpec s({.tp_rank = 1,
                        .tp_world_size = 2,
                        .vocab_shard_bounds = {{0, 151936}, {151936, 152064}},
                        .real_vocab_size = kQwen3Real,
                        .padded_vocab_size = kQwen3PaddedTP2});
  EXPECT_EQ(s.owner_rank(kQwen3Real - 1), 0);
  EXPECT_EQ(s.local_vocab_size(), 128);
}

// ----- MaskSpec -------------------------------------------------------------------------------

TEST(MaskSpec, Qwen3MaskCountAndGoldenDigest) {
  const MaskSpec m = qwen3_mask();
  EXPECT_EQ(m.num_tokens(), 8);
  EXPECT_EQ(m.active_token_count(), 5);
  EXPECT_EQ(m.ignore_index(), -100);
  EXPECT_EQ(m.active_mask_sha256(),
            "540fcad9a073311f536f7b0edf84c397681c9b90bb2ebb9e4a5793f06c3ed3d7");
}

TEST(MaskSpec, SecondGoldenDigestAndPositionSensitivity) {
  const MaskSpec m(
      {.num_tokens = 8, .active_mask = {true, true, true, true, true, false, false, false}});
  EXPECT_EQ(m.active_mask_sha256(),
            "c7fb710baec0c5f2d119354c8d4d0c8b732eb85d63649bfa97be0f3b728d826b");
  // Same count, different positions: different digest.
  EXPECT_EQ(m.active_token_count(), qwen3_mask().active_token_count());
  EXPECT_NE(m.active_mask_sha256(), qwen3_mask().active_mask_sha256());
  EXPECT_EQ(m.active_mask_sha256().size(), 64u);
}

TEST(MaskSpec, AllActiveAndAllInactive) {
  const MaskSpec a = MaskSpec::all_active(5);
  EXPECT_EQ(a.active_token_count(), 5);
  EXPECT_EQ(a.ignore_index(), -100);
  EXPECT_EQ(a, MaskSpec({.num_tokens = 5, .active_mask = std::vector<bool>(5, true)}));
  const MaskSpec none({.num_tokens = 3, .active_mask = {false, false, false}});
  EXPECT_EQ(none.active_token_count(), 0);
  EXPECT_NE(none.active_mask_sha256(), MaskSpec::all_active(3).active_mask_sha256());
  EXPECT_EQ(MaskSpec::all_active(4, -1).ignore_index(), -1);
}

TEST(MaskSpec, Validation) {
  EXPECT_CONTRACT_ERROR(MaskSpec({.num_tokens = 0, .active_mask = {}}),
                        "num_tokens must be a positive integer; got 0");
  EXPECT_CONTRACT_ERROR(MaskSpec::all_active(0), "num_tokens must be a positive integer; got 0");
  EXPECT_CONTRACT_ERROR(MaskSpec({.num_tokens = 4, .active_mask = {true, false, true}}),
                        "active_mask must contain exactly one entry per token; got 3 entries for "
                        "num_tokens=4");
}

// ----- ReductionSpec, OutputSpec --------------------------------------------------------------

TEST(ReductionSpec, Defaults) {
  const ReductionSpec r;
  EXPECT_EQ(r.merge(), Merge::max_sumexp);
  EXPECT_EQ(r.merge_axis(), MergeAxis::tp_vocab);
  EXPECT_EQ(r.acc_dtype(), DType::fp32);
  EXPECT_EQ(r.order(), ReductionOrder::canonical_tile_tree);
  EXPECT_EQ(r.transport(), Transport::all_gather);
  EXPECT_EQ(r.downcast_at(), DowncastPoint::final_write);
  EXPECT_EQ(r.engine(), Engine::in_op_reference);
  EXPECT_EQ(r.determinism_scope(), DeterminismScope::cross_tp_bitwise);
  EXPECT_FALSE(ReductionSpec::cp_is_merge_axis());
  EXPECT_EQ(ReductionSpec({.order = ReductionOrder::global_vocab_shard_index}).order(),
            ReductionOrder::global_vocab_shard_index);
}

TEST(ReductionSpec, AccumulationMustBeFp32) {
  EXPECT_CONTRACT_ERROR(ReductionSpec({.acc_dtype = DType::bf16}),
                        "TP logprob accumulation must be fp32; got bf16");
  EXPECT_CONTRACT_ERROR(ReductionSpec({.acc_dtype = DType::fp16}), "must be fp32; got fp16");
  EXPECT_CONTRACT_ERROR(ReductionSpec({.merge = static_cast<Merge>(1)}),
                        "merge must be one of: max_sumexp");
  EXPECT_CONTRACT_ERROR(ReductionSpec({.transport = static_cast<Transport>(2)}),
                        "transport must be one of: all_gather");
}

TEST(OutputSpec, Fp32OnlyAndReplicated) {
  const LogprobOutputSpec o;
  EXPECT_EQ(o.selected_logp_dtype(), DType::fp32);
  EXPECT_EQ(o.lse_dtype(), DType::fp32);
  EXPECT_EQ(o.tp_placement(), TPPlacement::replicated);
  EXPECT_CONTRACT_ERROR(OutputSpec({.selected_logp_dtype = DType::bf16}),
                        "selected logprob output must be fp32; got bf16");
  EXPECT_CONTRACT_ERROR(OutputSpec({.lse_dtype = DType::bf16}),
                        "vocab LSE output must be fp32; got bf16");
  EXPECT_CONTRACT_ERROR(OutputSpec({.tp_placement = static_cast<TPPlacement>(3)}),
                        "tp_placement must be one of: replicated");
}

// ----- LogprobContract ------------------------------------------------------------------------

TEST(LogprobContract, Qwen3ExampleBuilds) {
  const LogprobContract c = qwen3_contract();
  EXPECT_EQ(c.role(), Role::train);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_EQ(c.mask().active_token_count(), 5);
  EXPECT_EQ(c.sharding().local_vocab_start(), 0);
  EXPECT_EQ(c.sharding().local_vocab_end(), 76032);
  EXPECT_EQ(c.reduction().acc_dtype(), DType::fp32);
  EXPECT_EQ(c.output(), OutputSpec());
  EXPECT_TRUE(c.export_lse());
  EXPECT_EQ(c.temperature(), 1.0f);
  EXPECT_EQ(c.tile_width(), 128);
  EXPECT_EQ(c.numerics_version(), kNumericsVersion);
  EXPECT_NO_THROW(c.check_tile_alignment());
}

TEST(LogprobContract, ExportLseMustBeTrue) {
  EXPECT_CONTRACT_ERROR(LogprobContract({.role = Role::train,
                                         .dtype = DType::bf16,
                                         .mask = qwen3_mask(),
                                         .sharding = qwen3_sharding(),
                                         .export_lse = false}),
                        "export_lse must be True");
}

TEST(LogprobContract, IgnoreIndexMustNotCollideWithTheRealVocabulary) {
  auto with_ignore = [](int64_t ignore_index) {
    return LogprobContract({.role = Role::infer,
                            .dtype = DType::fp32,
                            .mask = MaskSpec::all_active(4, ignore_index),
                            .sharding = qwen3_sharding()});
  };
  EXPECT_CONTRACT_ERROR(with_ignore(5),
                        "ignore_index=5 must not collide with the real vocabulary [0, 151936)");
  EXPECT_CONTRACT_ERROR(with_ignore(0), "ignore_index=0 must not collide");
  EXPECT_CONTRACT_ERROR(with_ignore(kQwen3Real - 1), "must not collide");
  EXPECT_NO_THROW(with_ignore(kQwen3Real));      // a padding column
  EXPECT_NO_THROW(with_ignore(kQwen3Real + 1));  // a padding column
  EXPECT_NO_THROW(with_ignore(-1));
  EXPECT_NO_THROW(with_ignore(-100));
}

TEST(LogprobContract, InvalidRoleOrDtypeValue) {
  EXPECT_CONTRACT_ERROR(LogprobContract({.role = static_cast<Role>(9),
                                         .dtype = DType::bf16,
                                         .mask = qwen3_mask(),
                                         .sharding = qwen3_sharding()}),
                        "role must be one of: train, infer");
  EXPECT_CONTRACT_ERROR(LogprobContract({.role = Role::train,
                                         .dtype = static_cast<DType>(3),
                                         .mask = qwen3_mask(),
                                         .sharding = qwen3_sharding()}),
                        "dtype must be one of: bf16, fp16, fp32");
}

LogprobContract with_tiles(std::optional<int64_t> tile_width,
                           std::optional<int64_t> num_vocab_tiles) {
  return LogprobContract({.role = Role::train,
                          .dtype = DType::bf16,
                          .mask = qwen3_mask(),
                          .sharding = qwen3_sharding(),
                          .tile_width = tile_width,
                          .num_vocab_tiles = num_vocab_tiles});
}

TEST(LogprobContract, TileWidthResolution) {
  EXPECT_EQ(with_tiles(std::nullopt, std::nullopt).tile_width(), 128);
  EXPECT_EQ(with_tiles(256, std::nullopt).tile_width(), 256);
  EXPECT_EQ(with_tiles(std::nullopt, 64).tile_width(), 2376);  // the tile-count form: 152064/64
  EXPECT_EQ(with_tiles(std::nullopt, 1188).tile_width(), 128);
  EXPECT_EQ(with_tiles(2376, 64).tile_width(), 2376);  // both given and agreeing
  EXPECT_EQ(with_tiles(std::nullopt, 1188), with_tiles(128, std::nullopt));
}

TEST(LogprobContract, TileWidthValidation) {
  EXPECT_CONTRACT_ERROR(with_tiles(0, std::nullopt),
                        "tile_width must be a positive integer; got 0");
  EXPECT_CONTRACT_ERROR(with_tiles(-128, std::nullopt), "tile_width must be a positive integer");
  EXPECT_CONTRACT_ERROR(with_tiles(int64_t{1} << 40, std::nullopt), "tile_width must be at most");
  EXPECT_CONTRACT_ERROR(with_tiles(std::nullopt, 0),
                        "num_vocab_tiles must be a positive integer; got 0");
  EXPECT_CONTRACT_ERROR(with_tiles(std::nullopt, 7),
                        "num_vocab_tiles=7 must divide padded_vocab_size=152064 exactly");
  EXPECT_CONTRACT_ERROR(with_tiles(128, 64), "tile_width=128 disagrees with num_vocab_tiles=64");
}

TEST(LogprobContract, Temperature) {
  auto with_temperature = [](float t) {
    return LogprobContract({.role = Role::train,
                            .dtype = DType::bf16,
                            .mask = qwen3_mask(),
                            .sharding = qwen3_sharding(),
                            .temperature = t});
  };
  EXPECT_EQ(with_temperature(0.7f).temperature(), 0.7f);
  EXPECT_CONTRACT_ERROR(with_temperature(0.0f), "temperature must be a finite number > 0; got 0");
  EXPECT_CONTRACT_ERROR(with_temperature(-0.0f), "temperature must be a finite number > 0");
  EXPECT_CONTRACT_ERROR(with_temperature(-1.5f),
                        "temperature must be a finite number > 0; got -1.5");
  EXPECT_CONTRACT_ERROR(with_temperature(std::numeric_limits<float>::quiet_NaN()),
                        "temperature must be a finite number > 0; got nan");
  EXPECT_CONTRACT_ERROR(with_temperature(std::numeric_limits<float>::infinity()),
                        "temperature must be a finite number > 0; got inf");
  EXPECT_NO_THROW(with_temperature(std::numeric_limits<float>::denorm_min()));
}

TEST(LogprobContract, ValidationOrder) {
  // export_lse before ignore_index before tiles before temperature.
  ContractParams p{.role = Role::train,
                   .dtype = DType::bf16,
                   .mask = MaskSpec::all_active(2, 3),
                   .sharding = qwen3_sharding(),
                   .export_lse = false,
                   .temperature = -1.0f,
                   .num_vocab_tiles = 7};
  EXPECT_CONTRACT_ERROR(LogprobContract(p), "export_lse");
  p.export_lse = true;
  EXPECT_CONTRACT_ERROR(LogprobContract(p), "ignore_index=3");
  p.mask = MaskSpec::all_active(2);
  EXPECT_CONTRACT_ERROR(LogprobContract(p), "num_vocab_tiles=7");
  p.num_vocab_tiles = std::nullopt;
  EXPECT_CONTRACT_ERROR(LogprobContract(p), "temperature");
  p.temperature = 2.0f;
  EXPECT_NO_THROW(LogprobContract{p});
}

TEST(LogprobContract, DoesNotCrossCheckTokensAgainstAnything) {
  // num_tokens is checked against the logits by the operator, not here.
  EXPECT_NO_THROW(LogprobContract({.role = Role::infer,
                                   .dtype = DType::fp16,
                                   .mask = MaskSpec::all_active(1),
                                   .sharding = qwen3_sharding()}));
}

// ----- Tile alignment (checked by the operator, provided here) -----------------------------------

TEST(TileAlignment, Qwen3LayoutsAtWidth128) {
  EXPECT_EQ(tile_alignment_problem(qwen3_contract()), std::nullopt);
  const LogprobContract padding_only(
      {.role = Role::train,
       .dtype = DType::bf16,
       .mask = qwen3_mask(),
       .sharding = ShardingSpec({.tp_rank = 0,
                                 .tp_world_size = 2,
                                 .vocab_shard_bounds = {{0, 151936}, {151936, 152064}},
                                 .real_vocab_size = kQwen3Real,
                                 .padded_vocab_size = kQwen3PaddedTP2})});
  EXPECT_NO_THROW(padding_only.check_tile_alignment());  // 151936 = 1187 * 128
}

TEST(TileAlignment, TileCountFormMisalignsThePaddingOnlyLayout) {
  // 64 tiles of 2376 align the even TP2 bounds (76032 = 32 * 2376) but not 151936.
  EXPECT_NO_THROW(with_tiles(std::nullopt, 64).check_tile_alignment());
  const LogprobContract c(
      {.role = Role::train,
       .dtype = DType::bf16,
       .mask = qwen3_mask(),
       .sharding = ShardingSpec({.tp_rank = 1,
                                 .tp_world_size = 2,
                                 .vocab_shard_bounds = {{0, 151936}, {151936, 152064}},
                                 .real_vocab_size = kQwen3Real,
                                 .padded_vocab_size = kQwen3PaddedTP2}),
       .num_vocab_tiles = 64});
  EXPECT_CONTRACT_ERROR(c.check_tile_alignment(),
                        "vocab_shard_bounds[0]=[0, 151936) is not aligned to the vocab tile size "
                        "2376 (tile_width); the CUDA kernels need tile-aligned shard bounds "
                        "(the logits op and the fused lm_head on the CPU kernels accept any)");
}

TEST(TileAlignment, MisalignedFirstBoundAndPartialLastTile) {
  const auto contract = [](std::vector<VocabRange> bounds, int64_t padded, int64_t w) {
    const int64_t tp = static_cast<int64_t>(bounds.size());
    return LogprobContract({.role = Role::train,
                            .dtype = DType::fp32,
                            .mask = MaskSpec::all_active(6),
                            .sharding = ShardingSpec({.tp_rank = 0,
                                                      .tp_world_size = tp,
                                                      .vocab_shard_bounds = bounds,
                                                      .real_vocab_size = 27,
                                                      .padded_vocab_size = padded}),
                            .tile_width = w});
  };
  const auto problem = tile_alignment_problem(contract({{0, 6}, {6, 32}}, 32, 4));
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("vocab_shard_bounds[0]=[0, 6) is not aligned to the vocab tile size 4"),
            std::string::npos)
      << *problem;
  EXPECT_CONTRACT_ERROR(contract({{0, 8}, {8, 30}, {30, 32}}, 32, 4).check_tile_alignment(),
                        "vocab_shard_bounds[1]=[8, 30)");
  // padded = 30 is not a multiple of 4: the last tile is partial and the last end may be 30.
  EXPECT_NO_THROW(contract({{0, 16}, {16, 30}}, 30, 4).check_tile_alignment());
  EXPECT_NO_THROW(contract({{0, 4}, {4, 16}, {16, 24}, {24, 32}}, 32, 4).check_tile_alignment());
}

// ----- Shard-bound helpers --------------------------------------------------------------------

TEST(BoundHelpers, EvenBoundsGiveTheRemainderToTheLastRank) {
  EXPECT_EQ(even_bounds(152064, 2), (std::vector<VocabRange>{{0, 76032}, {76032, 152064}}));
  EXPECT_EQ(even_bounds(10, 3), (std::vector<VocabRange>{{0, 3}, {3, 6}, {6, 10}}));
  EXPECT_EQ(even_bounds(7, 1), (std::vector<VocabRange>{{0, 7}}));
  EXPECT_CONTRACT_ERROR(even_bounds(3, 4), "padded_vocab_size=3 is smaller than tp_world_size=4");
  EXPECT_CONTRACT_ERROR(even_bounds(0, 1), "padded_vocab_size must be a positive integer");
  EXPECT_CONTRACT_ERROR(even_bounds(8, 0), "tp_world_size must be a positive integer");
}

TEST(BoundHelpers, EvenTileAlignedBounds) {
  EXPECT_EQ(even_tile_aligned_bounds(152064, 2, 128), even_bounds(152064, 2));
  // 32 tiles over 3 ranks: 11, 11, 10.
  EXPECT_EQ(even_tile_aligned_bounds(1024, 3, 32),
            (std::vector<VocabRange>{{0, 352}, {352, 704}, {704, 1024}}));
  // 1000 = 7 full tiles of 128 + one partial tile of 104: 8 tiles -> 3, 3, 2.
  EXPECT_EQ(even_tile_aligned_bounds(1000, 3, 128),
            (std::vector<VocabRange>{{0, 384}, {384, 768}, {768, 1000}}));
  // A small drift layout: 32 tiles of 32 over 4 ranks.
  EXPECT_EQ(even_tile_aligned_bounds(1024, 4, 32),
            (std::vector<VocabRange>{{0, 256}, {256, 512}, {512, 768}, {768, 1024}}));
  EXPECT_CONTRACT_ERROR(even_tile_aligned_bounds(256, 3, 128),
                        "has 2 tiles of width 128, fewer than tp_world_size=3");
  EXPECT_CONTRACT_ERROR(even_tile_aligned_bounds(256, 1, 0), "tile_width must be a positive");
}

TEST(BoundHelpers, EvenTileAlignedBoundsAreValidAndAligned) {
  for (int64_t padded : {27, 32, 1000, 1024, 151936, 152064, 152576}) {
    for (int64_t tp : {1, 2, 3, 4, 5, 8}) {
      for (int64_t w : {4, 32, 128}) {
        if ((padded + w - 1) / w < tp) continue;
        const auto bounds = even_tile_aligned_bounds(padded, tp, w);
        const LogprobContract c({.role = Role::train,
                                 .dtype = DType::bf16,
                                 .mask = MaskSpec::all_active(1),
                                 .sharding = ShardingSpec({.tp_rank = tp - 1,
                                                           .tp_world_size = tp,
                                                           .vocab_shard_bounds = bounds,
                                                           .real_vocab_size = padded,
                                                           .padded_vocab_size = padded}),
                                 .tile_width = w});
        EXPECT_EQ(tile_alignment_problem(c), std::nullopt) << padded << " " << tp << " " << w;
        // Whole tiles per rank (the last one possibly partial) differ by at most one.
        int64_t fewest = padded, most = 0;
        for (const auto& b : bounds) {
          const int64_t tiles = (b.size() + w - 1) / w;
          fewest = std::min(fewest, tiles);
          most = std::max(most, tiles);
        }
        EXPECT_GE(fewest, 1);
        EXPECT_LE(most - fewest, 1) << padded << " " << tp << " " << w;
      }
    }
  }
}

TEST(BoundHelpers, MegatronPaddedVocabForQwen3) {
  EXPECT_EQ(megatron_padded_vocab(kQwen3Real, 1), 151936);
  EXPECT_EQ(megatron_padded_vocab(kQwen3Real, 2), 152064);
  EXPECT_EQ(megatron_padded_vocab(kQwen3Real, 3), 152064);
  EXPECT_EQ(megatron_padded_vocab(kQwen3Real, 4), 152064);
  EXPECT_EQ(megatron_padded_vocab(kQwen3Real, 8), 152576);
  EXPECT_EQ(megatron_padded_vocab(1000, 2, 64), 1024);
  EXPECT_CONTRACT_ERROR(megatron_padded_vocab(0, 2), "real_vocab_size must be a positive");
}

TEST(BoundHelpers, MegatronBoundsAreEqualShardsAlignedAt128) {
  for (int64_t tp : {1, 2, 3, 4, 8}) {
    const VocabLayout layout = megatron_bounds(kQwen3Real, tp);
    EXPECT_EQ(layout.padded_vocab_size, megatron_padded_vocab(kQwen3Real, tp));
    ASSERT_EQ(static_cast<int64_t>(layout.vocab_shard_bounds.size()), tp);
    for (const VocabRange& b : layout.vocab_shard_bounds) {
      EXPECT_EQ(b.size(), layout.padded_vocab_size / tp);
    }
    const LogprobContract c(
        {.role = Role::train,
         .dtype = DType::bf16,
         .mask = qwen3_mask(),
         .sharding = ShardingSpec({.tp_rank = 0,
                                   .tp_world_size = tp,
                                   .vocab_shard_bounds = layout.vocab_shard_bounds,
                                   .real_vocab_size = kQwen3Real,
                                   .padded_vocab_size = layout.padded_vocab_size})});
    EXPECT_NO_THROW(c.check_tile_alignment()) << "TP=" << tp;
  }
  EXPECT_EQ(megatron_bounds(kQwen3Real, 8).vocab_shard_bounds[7], (VocabRange{133504, 152576}));
}

// ----- Error codes ----------------------------------------------------------------------------

TEST(ErrorCodes, MessageOnlyConstructorIsUnspecified) {
  const ContractError e("some rule");
  EXPECT_EQ(e.code(), ErrorCode::unspecified);
  EXPECT_EQ(e.field(), "");
  EXPECT_STREQ(e.what(), "some rule");
  const ContractError copy = ContractError(ErrorCode::out_of_range, "tile_width", "bad");
  EXPECT_EQ(copy.code(), ErrorCode::out_of_range);
  EXPECT_EQ(copy.field(), "tile_width");
}

TEST(ErrorCodes, ShardingRulesCarryTheirCodeAndField) {
  ShardingParams p = qwen3_tp2_params();
  p.tp_world_size = 0;
  EXPECT_CONTRACT_ERROR_CODE(ShardingSpec(p), "out_of_range:tp_world_size");
  p = qwen3_tp2_params();
  p.tp_rank = 2;
  EXPECT_CONTRACT_ERROR_CODE(ShardingSpec(p), "conflicting_fields:tp_rank");
  p = qwen3_tp2_params();
  p.padded_vocab_size = kQwen3Real - 1;
  EXPECT_CONTRACT_ERROR_CODE(ShardingSpec(p), "conflicting_fields:padded_vocab_size");
  EXPECT_CONTRACT_ERROR_CODE(sharding_with_bounds({{0, 76032}, {76064, 152064}}),
                             "bad_shard_bounds:vocab_shard_bounds");
  EXPECT_CONTRACT_ERROR_CODE(qwen3_sharding().owner_rank(kQwen3Real),
                             "token_out_of_vocab:token_id");
  EXPECT_CONTRACT_ERROR_CODE(MaskSpec({.num_tokens = 3, .active_mask = {true}}),
                             "wrong_shape:active_mask");
}

TEST(ErrorCodes, ContractRulesCarryTheirCodeAndField) {
  auto with = [](auto&& change) {
    ContractParams p{.role = Role::train,
                     .dtype = DType::bf16,
                     .mask = qwen3_mask(),
                     .sharding = qwen3_sharding()};
    change(p);
    return LogprobContract(p);
  };
  EXPECT_CONTRACT_ERROR_CODE(with([](ContractParams& p) { p.export_lse = false; }),
                             "unsupported_value:export_lse");
  EXPECT_CONTRACT_ERROR_CODE(with([](ContractParams& p) { p.temperature = 0.0f; }),
                             "out_of_range:temperature");
  EXPECT_CONTRACT_ERROR_CODE(with([](ContractParams& p) { p.tile_width = 0; }),
                             "out_of_range:tile_width");
  EXPECT_CONTRACT_ERROR_CODE(with([](ContractParams& p) { p.num_vocab_tiles = 7; }),
                             "conflicting_fields:num_vocab_tiles");
  EXPECT_CONTRACT_ERROR_CODE(with([](ContractParams& p) { p.dtype.value = static_cast<DType>(9); }),
                             "invalid_enum:dtype");
  EXPECT_CONTRACT_ERROR_CODE(ReductionSpec({.acc_dtype = DType::bf16}),
                             "unsupported_value:acc_dtype");
  EXPECT_CONTRACT_ERROR_CODE(parse_enum<Merge>("lse_average", "merge"), "invalid_enum:merge");
  // The alignment check of deterministic mode.
  const LogprobContract misaligned = with([](ContractParams& p) { p.tile_width = 1000; });
  EXPECT_CONTRACT_ERROR_CODE(misaligned.check_tile_alignment(),
                             "tile_misaligned:vocab_shard_bounds");
  // A valid contract throws nothing at all.
  EXPECT_EQ(testing::contract_error_code([] { (void)qwen3_contract(); }), "no ContractError");
}

TEST(ErrorCodes, EveryCodeHasADistinctName) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(ErrorCode::unknown_platform); ++c) {
    names.insert(to_string(static_cast<ErrorCode>(c)));
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(ErrorCode::unknown_platform) + 1);
  EXPECT_EQ(to_string(ErrorCode::out_of_range), "out_of_range");
}

}  // namespace
}  // namespace detlogp
