// Provenance JSON, canonical serialisation and the cross-rank fingerprint
// (docs/contract.md, "JSON" and "Cross-rank fingerprint").

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "contract/contract_json.hpp"
#include "contract_fixtures.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/version.hpp"

namespace detlogp {
namespace {

using namespace testing;  // the Qwen3-8B example fixtures (contract_fixtures.hpp)

// The Qwen3-8B example (TP=2, CP=2, bf16, rank tp0/cp0) with detlogp's defaults.
// Computed by this implementation and independently in Python from the documented layout
// (docs/contract.md shows the snippet). It changes when kNumericsVersion changes.
constexpr std::string_view kQwen3Json =
    R"({"dtype":"bf16","export_lse":true,"lse_domain":"vocab","mask":{"active_mask_sha256":)"
    R"("540fcad9a073311f536f7b0edf84c397681c9b90bb2ebb9e4a5793f06c3ed3d7","active_token_count":5,)"
    R"("ignore_index":-100,"num_tokens":8},"numerics_version":"detlogp-canon-v1","output":)"
    R"({"lse_dtype":"fp32","selected_logp_dtype":"fp32","tp_placement":"replicated"},)"
    R"("reduction":{"acc_dtype":"fp32","cp_is_merge_axis":false,"determinism_scope":)"
    R"("cross_tp_bitwise","downcast_at":"final_write","engine":"in_op_reference","merge":)"
    R"("max_sumexp","merge_axis":"tp_vocab","order":"canonical_tile_tree","tile_width":128,)"
    R"("transport":"all_gather"},"role":"train","semantic_operator":"selected_token_logprob",)"
    R"("sharding":{"cp_rank":0,"cp_world_size":2,"local_vocab_end":76032,"local_vocab_start":0,)"
    R"("padded_vocab_size":152064,"real_vocab_size":151936,"tp_rank":0,"tp_world_size":2,)"
    R"("vocab_shard_bounds":[[0,76032],[76032,152064]]},"temperature":1.0})";
constexpr std::string_view kQwen3Fingerprint =
    "17753223371fa09dd63041905fd59e85db8ffa88df4462aedf3f8cfb021bbef3";

// The compatible canonical string for the same example and its fingerprint (docs/contract.md,
// "Compatibility"): our JSON without detlogp's added fields, order global_vocab_shard_index.
constexpr std::string_view kCompatibleCanonical =
    R"({"dtype":"bf16","export_lse":true,"lse_domain":"vocab","mask":{"active_mask_sha256":)"
    R"("540fcad9a073311f536f7b0edf84c397681c9b90bb2ebb9e4a5793f06c3ed3d7","active_token_count":5,)"
    R"("ignore_index":-100,"num_tokens":8},"output":{"lse_dtype":"fp32","selected_logp_dtype":)"
    R"("fp32","tp_placement":"replicated"},"reduction":{"acc_dtype":"fp32","cp_is_merge_axis":)"
    R"(false,"determinism_scope":"cross_tp_bitwise","downcast_at":"final_write","engine":)"
    R"("in_op_reference","merge":"max_sumexp","merge_axis":"tp_vocab","order":)"
    R"("global_vocab_shard_index","transport":"all_gather"},"role":"train","semantic_operator":)"
    R"("selected_token_logprob","sharding":{"cp_world_size":2,"padded_vocab_size":152064,)"
    R"("real_vocab_size":151936,"tp_world_size":2,"vocab_shard_bounds":[[0,76032],[76032,152064]]}})";
constexpr std::string_view kCompatibleFingerprint =
    "163581f9e3dde7a0080c63c8659a6f7d8fbd41c699cf6b246cddccd618697c2d";

TEST(ContractJson, Qwen3ExampleIsPinned) {
  EXPECT_EQ(kNumericsVersion, "detlogp-canon-v1") << "a new numerics version changes the pins";
  EXPECT_EQ(qwen3_contract().to_json(), kQwen3Json);
  EXPECT_EQ(qwen3_contract().cross_rank_fingerprint(), kQwen3Fingerprint);
}

TEST(ContractJson, ReductionAndOutputBlocks) {
  const nlohmann::json j = contract_to_json(qwen3_contract());
  const nlohmann::json reduction = {
      {"merge", "max_sumexp"},       {"merge_axis", "tp_vocab"},
      {"acc_dtype", "fp32"},         {"order", "canonical_tile_tree"},
      {"transport", "all_gather"},   {"downcast_at", "final_write"},
      {"engine", "in_op_reference"}, {"determinism_scope", "cross_tp_bitwise"},
      {"cp_is_merge_axis", false},   {"tile_width", 128}};
  EXPECT_EQ(j.at("reduction"), reduction);
  const nlohmann::json output = {
      {"selected_logp_dtype", "fp32"}, {"lse_dtype", "fp32"}, {"tp_placement", "replicated"}};
  EXPECT_EQ(j.at("output"), output);
  EXPECT_EQ(j.at("mask").at("active_mask_sha256"), qwen3_mask().active_mask_sha256());
  EXPECT_FALSE(j.at("mask").contains("active_mask"));  // no raw mask in provenance
  EXPECT_EQ(nlohmann::json::parse(qwen3_contract().to_json()), j);
}

TEST(ContractJson, SharedPartIsByteIdenticalToTheCompatibleContract) {
  ContractParams params = qwen3_params();
  params.reduction = ReductionSpec({.order = ReductionOrder::global_vocab_shard_index});
  const LogprobContract c(params);
  nlohmann::json j = contract_to_json(c);
  for (const char* key : {"tp_rank", "cp_rank", "local_vocab_start", "local_vocab_end"}) {
    ASSERT_EQ(j["sharding"].erase(key), 1u) << key;
  }
  ASSERT_EQ(j["reduction"].erase("tile_width"), 1u);
  ASSERT_EQ(j.erase("temperature"), 1u);
  ASSERT_EQ(j.erase("numerics_version"), 1u);
  EXPECT_EQ(canonical_json(j), kCompatibleCanonical);
  EXPECT_EQ(sha256_hex(canonical_json(j)), kCompatibleFingerprint);
}

TEST(Fingerprint, EqualOnEveryRankOfOneInvocation) {
  const std::string fp = qwen3_contract(0, 0).cross_rank_fingerprint();
  EXPECT_EQ(qwen3_contract(1, 1).cross_rank_fingerprint(), fp);
  EXPECT_EQ(qwen3_contract(1, 0).cross_rank_fingerprint(), fp);
  EXPECT_EQ(qwen3_contract(0, 1).cross_rank_fingerprint(), fp);
  // The provenance itself is rank-local.
  EXPECT_NE(qwen3_contract(1, 1).to_json(), qwen3_contract(0, 0).to_json());
  EXPECT_EQ(fp.size(), 64u);
}

// The fingerprint of the Qwen3 example with one field changed.
struct Variant {
  std::string name;
  LogprobContract contract;
};

std::vector<Variant> numerics_relevant_variants() {
  const auto base = [] {
    return ContractParams{.role = Role::train,
                          .dtype = DType::bf16,
                          .mask = qwen3_mask(),
                          .sharding = qwen3_sharding()};
  };
  const auto sharding = [](std::vector<VocabRange> bounds, int64_t real, int64_t padded,
                           int64_t cp_world = 2) {
    return ShardingSpec({.tp_rank = 0,
                         .tp_world_size = static_cast<int64_t>(bounds.size()),
                         .vocab_shard_bounds = std::move(bounds),
                         .real_vocab_size = real,
                         .padded_vocab_size = padded,
                         .cp_rank = 0,
                         .cp_world_size = cp_world});
  };
  std::vector<Variant> v;
  v.push_back({"base", LogprobContract(base())});
  auto p = base();
  p.mask = MaskSpec(
      {.num_tokens = 8, .active_mask = {true, true, true, true, true, false, false, false}});
  v.push_back({"mask positions", LogprobContract(p)});
  p = base();
  p.mask = MaskSpec::all_active(8);
  v.push_back({"mask count", LogprobContract(p)});
  p = base();
  p.mask = MaskSpec::all_active(9);
  v.push_back({"num_tokens", LogprobContract(p)});
  p = base();
  p.mask = MaskSpec({.num_tokens = 8,
                     .active_mask = {false, false, true, true, true, true, true, false},
                     .ignore_index = -1});
  v.push_back({"ignore_index", LogprobContract(p)});
  p = base();
  p.sharding = sharding({{0, 76160}, {76160, 152064}}, kQwen3Real, kQwen3PaddedTP2);
  v.push_back({"bounds", LogprobContract(p)});
  p = base();
  p.sharding = sharding({{0, 76032}, {76032, 152064}}, 151935, kQwen3PaddedTP2);
  v.push_back({"real_vocab_size", LogprobContract(p)});
  p = base();
  p.sharding = sharding({{0, 76032}, {76032, 152192}}, kQwen3Real, 152192);
  v.push_back({"padded_vocab_size", LogprobContract(p)});
  p = base();
  p.sharding = sharding(even_bounds(kQwen3PaddedTP2, 4), kQwen3Real, kQwen3PaddedTP2);
  v.push_back({"tp_world_size", LogprobContract(p)});
  p = base();
  p.sharding = sharding({{0, 76032}, {76032, 152064}}, kQwen3Real, kQwen3PaddedTP2, 1);
  v.push_back({"cp_world_size", LogprobContract(p)});
  p = base();
  p.dtype = DType::fp16;
  v.push_back({"dtype", LogprobContract(p)});
  p = base();
  p.role = Role::infer;
  v.push_back({"role", LogprobContract(p)});
  p = base();
  p.reduction = ReductionSpec({.determinism_scope = DeterminismScope::fixed_topology});
  v.push_back({"determinism_scope", LogprobContract(p)});
  p = base();
  p.reduction = ReductionSpec({.order = ReductionOrder::global_vocab_shard_index});
  v.push_back({"order", LogprobContract(p)});
  p = base();
  p.tile_width = 256;
  v.push_back({"tile_width", LogprobContract(p)});
  p = base();
  p.num_vocab_tiles = 64;
  v.push_back({"num_vocab_tiles", LogprobContract(p)});
  p = base();
  p.temperature = 0.7f;
  v.push_back({"temperature", LogprobContract(p)});
  p = base();
  p.temperature = std::nextafter(1.0f, 2.0f);  // one ulp above 1
  v.push_back({"temperature ulp", LogprobContract(p)});
  return v;
}

TEST(Fingerprint, ChangesWithEveryNumericsRelevantField) {
  const auto variants = numerics_relevant_variants();
  std::set<std::string> seen;
  for (const Variant& v : variants) {
    const std::string fp = v.contract.cross_rank_fingerprint();
    EXPECT_TRUE(seen.insert(fp).second) << v.name << " collides with an earlier variant";
  }
  EXPECT_EQ(seen.size(), variants.size());
}

TEST(Fingerprint, SameContractSameFingerprint) {
  // Equal values built two ways give equal fingerprints (tile width via W or via a tile count).
  ContractParams width = qwen3_params();
  width.tile_width = 128;
  ContractParams count = qwen3_params(1, 0);
  count.num_vocab_tiles = 1188;
  const LogprobContract by_width(width), by_count(count);
  EXPECT_EQ(by_width.cross_rank_fingerprint(), kQwen3Fingerprint);
  EXPECT_EQ(by_count.cross_rank_fingerprint(), kQwen3Fingerprint);
}

TEST(ContractJson, TemperatureIsTheFloatWidenedToDouble) {
  ContractParams params = qwen3_params();
  params.temperature = 0.7f;
  const LogprobContract c(params);
  EXPECT_NE(c.to_json().find(R"("temperature":0.699999988079071})"), std::string::npos)
      << c.to_json();
  EXPECT_EQ(nlohmann::json::parse(c.to_json()).at("temperature").get<double>(),
            static_cast<double>(0.7f));
}

// ----- Canonical JSON -------------------------------------------------------------------------

TEST(CanonicalJson, FloatsPrintAsPythonRepr) {
  // Expected strings are Python 3.11's repr() of the same doubles.
  const std::vector<std::pair<double, std::string>> cases = {
      {1.0, "1.0"},
      {2.5, "2.5"},
      {100.0, "100.0"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {static_cast<double>(0.7f), "0.699999988079071"},
      {static_cast<double>(0.1f), "0.10000000149011612"},
      {static_cast<double>(1e-5f), "9.999999747378752e-06"},
      {static_cast<double>(1e15f), "999999986991104.0"},
      {static_cast<double>(1e16f), "1.0000000272564224e+16"},
      {static_cast<double>(std::numeric_limits<float>::max()), "3.4028234663852886e+38"},
      {static_cast<double>(std::numeric_limits<float>::denorm_min()), "1.401298464324817e-45"},
      {1e15, "1000000000000000.0"},
      {1.5e15, "1500000000000000.0"},
      {1e16, "1e+16"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {1.5e-7, "1.5e-07"},
      {1e100, "1e+100"},
      {1e-100, "1e-100"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {0.1 + 0.2, "0.30000000000000004"},
      {9007199254740993.0, "9007199254740992.0"},
      {-1.5, "-1.5"},
  };
  for (const auto& [value, expected] : cases) {
    EXPECT_EQ(python_float_repr(value), expected) << expected;
    EXPECT_EQ(canonical_json(nlohmann::json(value)), expected);
  }
  EXPECT_CONTRACT_ERROR(python_float_repr(std::numeric_limits<double>::quiet_NaN()), "finite");
  EXPECT_CONTRACT_ERROR(canonical_json(nlohmann::json::array({1.0, INFINITY})), "finite");
}

TEST(CanonicalJson, MatchesPythonDumpsForStructure) {
  // Python: json.dumps(v, sort_keys=True, separators=(",", ":")).
  const nlohmann::json v = nlohmann::json::parse(
      R"({"b": [1, -2, 18446744073709551615, true, null, {"z": 0, "a": []}], "a": {}, "B": "x"})");
  EXPECT_EQ(canonical_json(v),
            R"({"B":"x","a":{},"b":[1,-2,18446744073709551615,true,null,{"a":[],"z":0}]})");
}

TEST(CanonicalJson, StringsAreEscapedLikePythonEnsureAscii) {
  // Python: json.dumps("q\"b\\/\n\t\x01\x7f\u00e9\u03b2\U0001f600") ==
  //   "\"q\\\"b\\\\/\\n\\t\\u0001\\u007f\\u00e9\\u03b2\\ud83d\\ude00\""
  const std::string s = "q\"b\\/\n\t\x01\x7f\xc3\xa9\xce\xb2\xf0\x9f\x98\x80";
  EXPECT_EQ(canonical_json(nlohmann::json(s)),
            R"("q\"b\\/\n\t\u0001\u007f\u00e9\u03b2\ud83d\ude00")");
  // Keys sort by code point (UTF-8 byte order), as Python's sort_keys does.
  const nlohmann::json o = {{"\xc3\xa9", 1}, {"z", 2}, {"Z", 3}};
  EXPECT_EQ(canonical_json(o), R"({"Z":3,"z":2,"\u00e9":1})");
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace detlogp
