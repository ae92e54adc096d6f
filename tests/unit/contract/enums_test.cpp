#include <gtest/gtest.h>

#include <string>

#include "contract_fixtures.hpp"
#include "detlogp/enums.hpp"

namespace detlogp {
namespace {

template <ContractEnum E>
void expect_round_trip(std::string_view field) {
  const auto values = enum_values<E>();
  ASSERT_FALSE(values.empty());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const E e = static_cast<E>(i);
    EXPECT_EQ(to_string(e), values[i]);
    EXPECT_EQ(parse_enum<E>(values[i], field), e) << values[i];
  }
}

TEST(Enums, EveryValueRoundTrips) {
  expect_round_trip<Role>("role");
  expect_round_trip<DType>("dtype");
  expect_round_trip<Merge>("merge");
  expect_round_trip<MergeAxis>("merge_axis");
  expect_round_trip<ReductionOrder>("order");
  expect_round_trip<Transport>("transport");
  expect_round_trip<DowncastPoint>("downcast_at");
  expect_round_trip<Engine>("engine");
  expect_round_trip<TPPlacement>("tp_placement");
  expect_round_trip<DeterminismScope>("determinism_scope");
  expect_round_trip<MaskMode>("mask_mode");
  expect_round_trip<ImplementationKind>("implementation_kind");
}

TEST(Enums, ValueStringsAreTheCompatibleOnesPlusOurs) {
  EXPECT_EQ(to_string(Role::infer), "infer");
  EXPECT_EQ(to_string(DType::bf16), "bf16");
  EXPECT_EQ(to_string(DType::fp16), "fp16");
  EXPECT_EQ(to_string(ReductionOrder::global_vocab_shard_index), "global_vocab_shard_index");
  EXPECT_EQ(to_string(ReductionOrder::canonical_tile_tree), "canonical_tile_tree");
  EXPECT_EQ(to_string(DeterminismScope::cross_tp_bitwise), "cross_tp_bitwise");
  EXPECT_EQ(to_string(MaskMode::explicit_active_mask), "explicit_active_mask");
  EXPECT_EQ(to_string(ImplementationKind::reference), "reference");
}

TEST(Enums, NamedParsersUseTheirFieldNames) {
  EXPECT_EQ(parse_role("infer"), Role::infer);
  EXPECT_EQ(parse_dtype("fp32"), DType::fp32);
  EXPECT_EQ(parse_determinism_scope("fixed_topology"), DeterminismScope::fixed_topology);
  EXPECT_EQ(parse_reduction_order("canonical_tile_tree"), ReductionOrder::canonical_tile_tree);
  EXPECT_EQ(parse_mask_mode("ignore_index"), MaskMode::ignore_index);
  EXPECT_EQ(parse_implementation_kind("production"), ImplementationKind::production);
  EXPECT_CONTRACT_ERROR(parse_merge("lse_average"), "merge must be one of");
  EXPECT_CONTRACT_ERROR(parse_transport("all_reduce"), "transport must be one of");
}

TEST(Enums, BadStringListsTheAllowedValues) {
  try {
    parse_enum<Merge>("lse_average", "merge");
    FAIL() << "no throw";
  } catch (const ContractError& e) {
    EXPECT_STREQ(e.what(), "merge must be one of: max_sumexp; got 'lse_average'");
  }
  try {
    parse_role("Train", "role");  // case-sensitive
    FAIL() << "no throw";
  } catch (const ContractError& e) {
    EXPECT_STREQ(e.what(), "role must be one of: train, infer; got 'Train'");
  }
  EXPECT_CONTRACT_ERROR(parse_dtype("float32", "acc_dtype"),
                        "acc_dtype must be one of: bf16, fp16, fp32; got 'float32'");
  EXPECT_CONTRACT_ERROR(parse_dtype("", "dtype"), "got ''");
  EXPECT_CONTRACT_ERROR(parse_determinism_scope(" cross_tp_bitwise"), "determinism_scope");
}

TEST(Enums, OutOfRangeValuesAreRejected) {
  const auto bad = static_cast<Role>(7);
  EXPECT_FALSE(is_valid_enum(bad));
  EXPECT_TRUE(is_valid_enum(Role::infer));
  EXPECT_EQ(to_string(bad), "<invalid>");
  EXPECT_CONTRACT_ERROR(check_enum(bad, "role"), "role must be one of: train, infer; got");
  EXPECT_NO_THROW(check_enum(Role::train, "role"));
}

}  // namespace
}  // namespace detlogp
