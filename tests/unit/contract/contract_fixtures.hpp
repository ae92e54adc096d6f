#pragma once
// Shared test helpers: the Qwen3-8B example contracts of docs/contract.md and expectations
// for ContractError messages and codes.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "detlogp/contract.hpp"

namespace detlogp::testing {

inline constexpr int64_t kQwen3Real = 151936;
inline constexpr int64_t kQwen3PaddedTP2 = 152064;

// (F,F,T,T,T,T,T,F): 2 prompt tokens, 5 active, 1 trailing pad.
inline MaskSpec qwen3_mask() {
  return MaskSpec({.num_tokens = 8,
                   .active_mask = {false, false, true, true, true, true, true, false},
                   .ignore_index = -100});
}

inline ShardingSpec qwen3_sharding(int64_t tp_rank = 0, int64_t cp_rank = 0) {
  return ShardingSpec({.tp_rank = tp_rank,
                       .tp_world_size = 2,
                       .vocab_shard_bounds = {{0, 76032}, {76032, 152064}},
                       .real_vocab_size = kQwen3Real,
                       .padded_vocab_size = kQwen3PaddedTP2,
                       .cp_rank = cp_rank,
                       .cp_world_size = 2});
}

// The Qwen3-8B example contract: TP=2, CP=2, bf16, train, detlogp defaults.
inline ContractParams qwen3_params(int64_t tp_rank = 0, int64_t cp_rank = 0) {
  return {.role = Role::train,
          .dtype = DType::bf16,
          .mask = qwen3_mask(),
          .sharding = qwen3_sharding(tp_rank, cp_rank)};
}

inline LogprobContract qwen3_contract(int64_t tp_rank = 0, int64_t cp_rank = 0) {
  return LogprobContract(qwen3_params(tp_rank, cp_rank));
}

// Runs `fn` and expects a ContractError whose message contains `phrase`.
template <typename Fn>
::testing::AssertionResult throws_contract_error(Fn&& fn, const std::string& phrase) {
  try {
    fn();
  } catch (const ContractError& e) {
    const std::string what = e.what();
    if (what.find(phrase) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "ContractError message \"" << what << "\" lacks \"" << phrase << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-ContractError: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected \"" << phrase << "\")";
}

#define EXPECT_CONTRACT_ERROR(statement, phrase) \
  EXPECT_TRUE(::detlogp::testing::throws_contract_error([&] { (void)(statement); }, phrase))

// "<code>:<field>" of the ContractError `fn` throws, e.g. "out_of_range:temperature" (readable
// in a failed EXPECT_EQ); "no ContractError" when it throws none.
template <typename Fn>
std::string contract_error_code(Fn&& fn) {
  try {
    fn();
  } catch (const ContractError& e) {
    return std::string(to_string(e.code())) + ":" + e.field();
  } catch (const std::exception&) {
  }
  return "no ContractError";
}

#define EXPECT_CONTRACT_ERROR_CODE(statement, code_and_field) \
  EXPECT_EQ(::detlogp::testing::contract_error_code([&] { (void)(statement); }), code_and_field)

}  // namespace detlogp::testing
