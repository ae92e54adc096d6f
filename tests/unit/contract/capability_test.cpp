// BackendCapability: validation, incompatibilities in order, JSON (docs/contract.md, "Backend
// capabilities").

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "contract_fixtures.hpp"
#include "detlogp/capability.hpp"

namespace detlogp {
namespace {

using namespace testing;  // the Qwen3-8B example fixtures (contract_fixtures.hpp)

using Reasons = std::vector<std::string>;

// A single-shard capability: TP=1 only, no padding, ignore_index-only masks, no LSE export,
// fixed_topology only.
CapabilityParams single_shard_params() {
  return {.backend_id = "test-single-shard-batch-invariant",
          .roles = {Role::train, Role::infer},
          .dtypes = {DType::bf16, DType::fp16, DType::fp32},
          .tp_world_sizes = std::vector<int64_t>{1},
          .supports_vocab_padding = false,
          .mask_modes = {MaskMode::ignore_index},
          .exports_vocab_lse = false,
          .determinism_scopes = {DeterminismScope::fixed_topology},
          .implementation_kind = ImplementationKind::reference};
}

// A capability that serves every contract of the Qwen3-8B example family.
CapabilityParams full_params() {
  return {
      .backend_id = "test-deterministic-tp-logprob",
      .roles = {Role::train, Role::infer},
      .dtypes = {DType::bf16, DType::fp16, DType::fp32},
      .supports_vocab_padding = true,
      .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
      .exports_vocab_lse = true,
      .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
      .implementation_kind = ImplementationKind::reference,
      .supports_temperature = true};
}

LogprobContract tp1_contract(int64_t padded, MaskSpec mask = MaskSpec::all_active(4),
                             DeterminismScope scope = DeterminismScope::cross_tp_bitwise) {
  return LogprobContract({.role = Role::train,
                          .dtype = DType::bf16,
                          .mask = std::move(mask),
                          .sharding = ShardingSpec({.tp_rank = 0,
                                                    .tp_world_size = 1,
                                                    .vocab_shard_bounds = {{0, padded}},
                                                    .real_vocab_size = kQwen3Real,
                                                    .padded_vocab_size = padded}),
                          .reduction = ReductionSpec({.determinism_scope = scope})});
}

// ----- Validation -----------------------------------------------------------------------------

TEST(BackendCapability, BackendIdIsStrippedAndNonEmpty) {
  auto p = full_params();
  p.backend_id = "  padded-id  ";
  EXPECT_EQ(BackendCapability(p).backend_id(), "padded-id");
  p.backend_id = "";
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "backend_id must be a non-empty string");
  p.backend_id = " \t\n ";
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "backend_id must be a non-empty string");
}

TEST(BackendCapability, ReservedPolicyWordsAreRejectedCaseInsensitively) {
  auto p = full_params();
  p.backend_id = "Deterministic";
  EXPECT_CONTRACT_ERROR(BackendCapability(p),
                        "backend_id='Deterministic' shadows a reserved dispatch policy keyword");
  for (const char* word : {"auto", " AUTO ", "Production", "reference", "REFERENCE"}) {
    p.backend_id = word;
    EXPECT_CONTRACT_ERROR(BackendCapability(p), "reserved dispatch policy keyword");
  }
  p.backend_id = "Test-Deterministic-TP-Logprob";  // contains a policy word: still an id
  EXPECT_EQ(BackendCapability(p).backend_id(), "Test-Deterministic-TP-Logprob");
  EXPECT_TRUE(is_reserved_dispatch_policy("REFERENCE"));
  EXPECT_TRUE(is_reserved_dispatch_policy(" deterministic "));
  EXPECT_FALSE(is_reserved_dispatch_policy("reference-cpu"));
  EXPECT_EQ(kReservedDispatchPolicies.size(), 4u);
}

TEST(BackendCapability, RolesAndDtypesMustNotBeEmpty) {
  auto p = full_params();
  p.roles = {};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "backend roles and dtypes must not be empty");
  p = full_params();
  p.dtypes = {};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "backend roles and dtypes must not be empty");
  p.dtypes = {static_cast<DType>(5)};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "dtypes must be one of: bf16, fp16, fp32");
}

TEST(BackendCapability, SizeLists) {
  for (const char* field : {"tp_world_sizes", "cp_world_sizes", "tile_widths"}) {
    auto with = [&](std::vector<int64_t> list) {
      auto p = full_params();
      if (std::string(field) == "tp_world_sizes") p.tp_world_sizes = list;
      if (std::string(field) == "cp_world_sizes") p.cp_world_sizes = list;
      if (std::string(field) == "tile_widths") p.tile_widths = list;
      return BackendCapability(p);
    };
    EXPECT_CONTRACT_ERROR(with({}), std::string(field) + " must not be empty; use std::nullopt");
    EXPECT_CONTRACT_ERROR(with({1, 0}),
                          std::string(field) + "[1] must be a positive integer; got 0");
    EXPECT_CONTRACT_ERROR(with({-2}), "must be a positive integer; got -2");
    EXPECT_CONTRACT_ERROR(with({2, 4, 2}),
                          std::string(field) + " must not contain duplicates; got 2 twice");
    EXPECT_NO_THROW(with({4, 1, 2}));
  }
}

TEST(BackendCapability, EnumSetsAndKind) {
  auto p = full_params();
  p.implementation_kind = static_cast<ImplementationKind>(2);
  EXPECT_CONTRACT_ERROR(BackendCapability(p),
                        "implementation_kind must be one of: production, reference");
  p = full_params();
  p.mask_modes = {static_cast<MaskMode>(4)};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "mask_modes must be one of");
  p = full_params();
  p.reduction_orders = {};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "reduction_orders must not be empty");
}

TEST(BackendCapability, ValidationOrder) {
  // Reserved id (before roles) before empty roles before world sizes before kind.
  CapabilityParams p{.backend_id = "auto",
                     .roles = {},
                     .dtypes = {},
                     .tp_world_sizes = std::vector<int64_t>{},
                     .implementation_kind = static_cast<ImplementationKind>(9),
                     .tile_widths = std::vector<int64_t>{}};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "reserved dispatch policy keyword");
  p.backend_id = "x";
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "roles and dtypes must not be empty");
  p.roles = {Role::train};
  p.dtypes = {DType::fp32};
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "tp_world_sizes must not be empty");
  p.tp_world_sizes = std::nullopt;
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "implementation_kind");
  p.implementation_kind = ImplementationKind::production;
  EXPECT_CONTRACT_ERROR(BackendCapability(p), "tile_widths must not be empty");
  p.tile_widths = std::nullopt;
  EXPECT_NO_THROW(BackendCapability{p});
}

TEST(BackendCapability, Defaults) {
  const BackendCapability c(
      {.backend_id = "minimal", .roles = {Role::train}, .dtypes = {DType::fp32}});
  EXPECT_EQ(c.tp_world_sizes(), std::nullopt);
  EXPECT_EQ(c.cp_world_sizes(), std::nullopt);
  EXPECT_FALSE(c.supports_vocab_padding());
  EXPECT_TRUE(c.mask_modes().empty());
  EXPECT_FALSE(c.exports_vocab_lse());
  EXPECT_TRUE(c.determinism_scopes().empty());
  EXPECT_EQ(c.implementation_kind(), ImplementationKind::production);
  EXPECT_EQ(c.tile_widths(), std::nullopt);
  EXPECT_FALSE(c.supports_temperature());
  EXPECT_EQ(c.reduction_orders(), std::set<ReductionOrder>{ReductionOrder::canonical_tile_tree});
}

// ----- Incompatibilities ----------------------------------------------------------------------

TEST(Incompatibilities, SingleShardCapabilityAgainstTheQwen3TP2Contract) {
  const LogprobBackendCapability single_shard(single_shard_params());
  EXPECT_EQ(single_shard.incompatibilities(qwen3_contract()),
            (Reasons{"TP=2 is unsupported", "padded-vs-real vocab masking is unsupported",
                     "explicit active-token masking is unsupported",
                     "vocab-domain LSE export is unsupported",
                     "determinism_scope=cross_tp_bitwise is unsupported"}));
  EXPECT_FALSE(single_shard.supports(qwen3_contract()));
}

TEST(Incompatibilities, TP1PaddedContractWithSingleShardHasOnlyThePaddingReasonOfTheShape) {
  auto p = single_shard_params();
  p.exports_vocab_lse = true;
  p.determinism_scopes = {DeterminismScope::cross_tp_bitwise};
  const BackendCapability single_shard(p);
  const Reasons reasons = single_shard.incompatibilities(tp1_contract(kQwen3PaddedTP2));
  EXPECT_EQ(reasons, (Reasons{"padded-vs-real vocab masking is unsupported"}));
  EXPECT_TRUE(single_shard.supports(tp1_contract(kQwen3Real)));
}

TEST(Incompatibilities, EveryReasonInOrder) {
  const BackendCapability nothing({.backend_id = "serves-nothing",
                                   .roles = {Role::infer},
                                   .dtypes = {DType::fp32},
                                   .tp_world_sizes = std::vector<int64_t>{1},
                                   .cp_world_sizes = std::vector<int64_t>{1},
                                   .tile_widths = std::vector<int64_t>{64, 256},
                                   .reduction_orders = {ReductionOrder::global_vocab_shard_index}});
  const LogprobContract c({.role = Role::train,
                           .dtype = DType::bf16,
                           .mask = qwen3_mask(),
                           .sharding = qwen3_sharding(),
                           .temperature = 0.7f});
  EXPECT_EQ(
      nothing.incompatibilities(c),
      (Reasons{"role=train is unsupported", "dtype=bf16 is unsupported", "TP=2 is unsupported",
               "CP=2 is unsupported", "padded-vs-real vocab masking is unsupported",
               "explicit active-token masking is unsupported",
               "vocab-domain LSE export is unsupported",
               "determinism_scope=cross_tp_bitwise is unsupported",
               "order=canonical_tile_tree is unsupported", "tile_width=128 is unsupported",
               "temperature=0.7 is unsupported"}));
}

TEST(Incompatibilities, FullCapabilityServesTheQwen3Family) {
  const BackendCapability full(full_params());
  EXPECT_EQ(full.incompatibilities(qwen3_contract()), Reasons{});
  EXPECT_TRUE(full.supports(qwen3_contract(1, 1)));
}

TEST(Incompatibilities, ContextParallelism) {
  auto p = full_params();
  EXPECT_TRUE(BackendCapability(p).supports(qwen3_contract()));  // CP-agnostic accepts CP=2
  p.cp_world_sizes = std::vector<int64_t>{1};
  EXPECT_EQ(BackendCapability(p).incompatibilities(qwen3_contract()),
            (Reasons{"CP=2 is unsupported"}));
  p.cp_world_sizes = std::vector<int64_t>{1, 2};
  EXPECT_TRUE(BackendCapability(p).supports(qwen3_contract()));
}

TEST(Incompatibilities, IgnoreIndexOnlyMaskModeCannotServeInactiveTokens) {
  auto p = full_params();
  p.mask_modes = {MaskMode::ignore_index};
  const BackendCapability cap(p);
  EXPECT_EQ(cap.incompatibilities(qwen3_contract()),
            (Reasons{"explicit active-token masking is unsupported"}));
  EXPECT_TRUE(cap.supports(tp1_contract(kQwen3PaddedTP2, MaskSpec::all_active(8))));
  // No mask mode at all still serves fully active contracts.
  p.mask_modes = {};
  EXPECT_TRUE(BackendCapability(p).supports(tp1_contract(kQwen3PaddedTP2)));
}

TEST(Incompatibilities, DeterminismScope) {
  auto p = full_params();
  p.determinism_scopes = {DeterminismScope::fixed_topology};
  const BackendCapability fixed(p);
  EXPECT_EQ(fixed.incompatibilities(tp1_contract(kQwen3PaddedTP2)),
            (Reasons{"determinism_scope=cross_tp_bitwise is unsupported"}));
  EXPECT_TRUE(fixed.supports(
      tp1_contract(kQwen3PaddedTP2, MaskSpec::all_active(4), DeterminismScope::fixed_topology)));
}

TEST(Incompatibilities, ReductionOrder) {
  ContractParams params = qwen3_params();
  params.reduction = ReductionSpec({.order = ReductionOrder::global_vocab_shard_index});
  const LogprobContract shard_index_order(params);
  auto p = full_params();
  EXPECT_EQ(BackendCapability(p).incompatibilities(shard_index_order),
            (Reasons{"order=global_vocab_shard_index is unsupported"}));
  p.reduction_orders = {ReductionOrder::global_vocab_shard_index,
                        ReductionOrder::canonical_tile_tree};
  EXPECT_TRUE(BackendCapability(p).supports(shard_index_order));
  EXPECT_TRUE(BackendCapability(p).supports(qwen3_contract()));
}

TEST(Incompatibilities, TileWidths) {
  auto p = full_params();
  p.tile_widths = std::vector<int64_t>{128};
  const BackendCapability only128(p);
  EXPECT_TRUE(only128.supports(qwen3_contract()));
  const LogprobContract tile_count_form({.role = Role::train,
                                         .dtype = DType::bf16,
                                         .mask = qwen3_mask(),
                                         .sharding = qwen3_sharding(),
                                         .num_vocab_tiles = 64});
  EXPECT_EQ(only128.incompatibilities(tile_count_form),
            (Reasons{"tile_width=2376 is unsupported"}));
  EXPECT_TRUE(BackendCapability(full_params()).supports(tile_count_form));  // nullopt: any width
}

TEST(Incompatibilities, TemperatureOnlyWhenNotOne) {
  auto p = full_params();
  p.supports_temperature = false;
  const BackendCapability no_temp(p);
  EXPECT_TRUE(no_temp.supports(qwen3_contract()));  // temperature 1 needs no support
  const LogprobContract hot({.role = Role::train,
                             .dtype = DType::bf16,
                             .mask = qwen3_mask(),
                             .sharding = qwen3_sharding(),
                             .temperature = 1.25f});
  EXPECT_EQ(no_temp.incompatibilities(hot), (Reasons{"temperature=1.25 is unsupported"}));
  EXPECT_TRUE(BackendCapability(full_params()).supports(hot));
}

// ----- JSON -----------------------------------------------------------------------------------

TEST(CapabilityJson, SortedValueListsAndNulls) {
  auto p = full_params();
  p.backend_id = " cpu-canonical ";
  p.tp_world_sizes = std::vector<int64_t>{4, 1, 2};
  p.reduction_orders = {ReductionOrder::global_vocab_shard_index,
                        ReductionOrder::canonical_tile_tree};
  EXPECT_EQ(BackendCapability(p).to_json(),
            R"({"backend_id":"cpu-canonical","cp_world_sizes":null,"determinism_scopes":)"
            R"(["cross_tp_bitwise","fixed_topology"],"dtypes":["bf16","fp16","fp32"],)"
            R"("exports_vocab_lse":true,"implementation_kind":"reference","mask_modes":)"
            R"(["explicit_active_mask","ignore_index"],"reduction_orders":)"
            R"(["canonical_tile_tree","global_vocab_shard_index"],"roles":["infer","train"],)"
            R"("supports_kept_sets":false,"supports_softcap":false,"supports_temperature":true,)"
            R"("supports_unaligned_bounds":false,"supports_vocab_padding":true,)"
            R"("tile_widths":null,)"
            R"("tp_world_sizes":[4,1,2]})");
  const BackendCapability single_shard(single_shard_params());
  EXPECT_NE(single_shard.to_json().find(R"("tp_world_sizes":[1])"), std::string::npos);
  EXPECT_NE(single_shard.to_json().find(R"("mask_modes":["ignore_index"])"), std::string::npos);
  EXPECT_NE(single_shard.to_json().find(R"("reduction_orders":["canonical_tile_tree"])"),
            std::string::npos);
}

}  // namespace
}  // namespace detlogp
