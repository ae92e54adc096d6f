// Contract-aware dispatch: policies, capability reasons, fallback, provenance, legacy path,
// shared cache and blacklist, platforms, thread safety, and production == reference bitwise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "contract/contract_fixtures.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/version.hpp"
#include "op/op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::set<Role> kRoles = {Role::train, Role::infer};
const std::set<DType> kDtypes = {DType::bf16, DType::fp16, DType::fp32};

// The Qwen3-8B example at TP=2, bf16, rank 0, with the given determinism scope.
LogprobContract qwen_tp2(DeterminismScope scope = DeterminismScope::cross_tp_bitwise,
                         int64_t cp = 1) {
  ShardingSpec sh({.tp_rank = 0,
                   .tp_world_size = 2,
                   .vocab_shard_bounds = {{0, 76032}, {76032, 152064}},
                   .real_vocab_size = 151936,
                   .padded_vocab_size = 152064,
                   .cp_world_size = cp});
  MaskSpec mask(
      {.num_tokens = 8, .active_mask = {false, false, true, true, true, true, true, false}});
  return LogprobContract({.role = Role::train,
                          .dtype = DType::bf16,
                          .mask = mask,
                          .sharding = sh,
                          .reduction = ReductionSpec({.determinism_scope = scope})});
}

LogprobContract tp1(int64_t real, int64_t padded, bool all_active = true) {
  ShardingSpec sh({.tp_rank = 0,
                   .tp_world_size = 1,
                   .vocab_shard_bounds = {{0, padded}},
                   .real_vocab_size = real,
                   .padded_vocab_size = padded});
  MaskSpec mask = all_active
                      ? MaskSpec::all_active(4)
                      : MaskSpec({.num_tokens = 4, .active_mask = {true, false, true, true}});
  return LogprobContract({.role = Role::train, .dtype = DType::fp32, .mask = mask, .sharding = sh});
}

BackendCapability single_shard_cap(const std::string& id, ImplementationKind kind) {
  return BackendCapability({.backend_id = id,
                            .roles = kRoles,
                            .dtypes = kDtypes,
                            .tp_world_sizes = std::vector<int64_t>{1},
                            .mask_modes = {MaskMode::ignore_index},
                            .determinism_scopes = {DeterminismScope::fixed_topology},
                            .implementation_kind = kind});
}

BackendCapability full_cap(const std::string& id, ImplementationKind kind) {
  return BackendCapability(
      {.backend_id = id,
       .roles = kRoles,
       .dtypes = kDtypes,
       .supports_vocab_padding = true,
       .mask_modes = {MaskMode::explicit_active_mask, MaskMode::ignore_index},
       .exports_vocab_lse = true,
       .determinism_scopes = {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
       .implementation_kind = kind});
}

Backend reference_backend(const std::string& name, const std::string& id) {
  return Backend{name,
                 [id] { return std::make_shared<VocabParallelLogprob>(reference_kernels(), id); }};
}

// Registers the reference op as backend `name` with id `id` and a capability that accepts every
// contract of these tests.
void register_full_reference(Registry& r, const std::string& name, const std::string& id) {
  r.register_logprob_backend(reference_backend(name, id),
                             full_cap(id, ImplementationKind::reference));
}

std::string dispatch_error(Registry& r, const LogprobContract& c, std::string_view req = "auto") {
  try {
    r.get_logprob_op(c, req);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "dispatch unexpectedly succeeded";
  return "";
}

TEST(Registry, SingleShardOnlyRejectsTp2ContractWithEveryReason) {
  Registry r;
  r.register_logprob_backend(reference_backend("SINGLE_SHARD_A", "single-shard-a"),
                             single_shard_cap("single-shard-a", ImplementationKind::production));
  const std::string msg = dispatch_error(r, qwen_tp2());
  EXPECT_THAT(msg, HasSubstr("TP=2 is unsupported"));
  EXPECT_THAT(msg, HasSubstr("vocab-domain LSE export is unsupported"));
  EXPECT_THAT(msg, HasSubstr("determinism_scope=cross_tp_bitwise is unsupported"));
  EXPECT_THAT(msg, HasSubstr("padded-vs-real vocab masking is unsupported"));
  EXPECT_THAT(msg, HasSubstr("No logprob backend supports"));
  // A padded TP=1 contract: the padding reason, not the TP reason.
  const std::string msg1 = dispatch_error(r, tp1(27, 32));
  EXPECT_THAT(msg1, Not(HasSubstr("TP=1 is unsupported")));
  EXPECT_THAT(msg1, HasSubstr("padded-vs-real vocab masking is unsupported"));
}

TEST(Registry, ReferencePolicySkipsSingleShardWithFallbackAndReasons) {
  Registry r;
  r.register_logprob_backend(reference_backend("SINGLE_SHARD_REF", "single-shard-ref"),
                             single_shard_cap("single-shard-ref", ImplementationKind::reference));
  register_full_reference(r, "VP_REF", "vp-ref");
  const DispatchResult d = r.get_logprob_op(qwen_tp2(), "reference");
  EXPECT_EQ(d.actual_backend, "vp-ref");
  EXPECT_TRUE(d.fallback);
  ASSERT_EQ(d.prior_rejections.size(), 1u);
  EXPECT_THAT(d.prior_rejections[0], HasSubstr("vocab-domain LSE export is unsupported"));
  // Default policy auto resolves the reference-kind backend too, provenance says "auto".
  const DispatchResult a = r.get_logprob_op(qwen_tp2());
  EXPECT_EQ(a.actual_backend, "vp-ref");
  EXPECT_EQ(nlohmann::json::parse(a.provenance_json)["requested_backend"], "auto");
}

TEST(Registry, CandidateWithoutCapabilityIsRejectedAsFallback) {
  Registry r;
  r.add_contract_candidate(reference_backend("NATIVE", "native"));
  EXPECT_THAT(dispatch_error(r, qwen_tp2()),
              HasSubstr("NATIVE: no LogprobBackendCapability declared"));
  register_full_reference(r, "VP_REF", "vp-ref");
  const DispatchResult d = r.get_logprob_op(qwen_tp2(), "reference");
  EXPECT_TRUE(d.fallback);  // a missing capability always counts, even before the policy filter
}

TEST(Registry, ProvenanceOfACompatibleBackend) {
  Registry r;
  register_full_reference(r, "TEST_TP", "test-deterministic-tp-logprob");
  const DispatchResult d = r.get_logprob_op(qwen_tp2(), "reference");
  EXPECT_FALSE(d.fallback);
  const auto j = nlohmann::json::parse(d.provenance_json);
  EXPECT_EQ(j["requested_backend"], "reference");
  EXPECT_EQ(j["actual_backend"], "test-deterministic-tp-logprob");
  EXPECT_EQ(j["backend_enum"], "TEST_TP");
  EXPECT_EQ(j["platform"], "cpu");
  EXPECT_EQ(j["fallback"], false);
  EXPECT_EQ(j["contract"]["sharding"]["tp_world_size"], 2);
  EXPECT_EQ(j["contract"]["sharding"]["real_vocab_size"], 151936);
  EXPECT_EQ(j["contract"]["reduction"]["cp_is_merge_axis"], false);
  EXPECT_EQ(j["capability"]["backend_id"], "test-deterministic-tp-logprob");
  EXPECT_EQ(j["numerics_version"], std::string(kNumericsVersion));
  EXPECT_EQ(j["kernel"], "scalar-reference");
  EXPECT_TRUE(j["prior_rejections"].is_array());
  // Exact ids: case-sensitive; policies: case-insensitive.
  EXPECT_THAT(dispatch_error(r, qwen_tp2(), "another-backend"),
              HasSubstr("does not match requested_backend=another-backend"));
  EXPECT_EQ(r.get_logprob_op(qwen_tp2(), "test-deterministic-tp-logprob").actual_backend,
            "test-deterministic-tp-logprob");
  EXPECT_EQ(r.get_logprob_op(qwen_tp2(), "REFERENCE").requested_backend, "REFERENCE");
  dispatch_error(r, qwen_tp2(), "Test-Deterministic-TP-Logprob");
  EXPECT_EQ(r.get_logprob_op(qwen_tp2(), "  reference  ").requested_backend, "reference");
}

TEST(Registry, PolicySkipIsNotAFallbackButCapabilitySkipIs) {
  Registry r;
  register_full_reference(r, "OTHER", "other-id");
  register_full_reference(r, "WANTED", "wanted-id");
  const DispatchResult d = r.get_logprob_op(qwen_tp2(), "wanted-id");
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.prior_rejections.size(), 1u);

  Registry r2;
  r2.register_logprob_backend(
      reference_backend("TP1_ONLY", "tp1-only"),
      BackendCapability({.backend_id = "tp1-only",
                         .roles = kRoles,
                         .dtypes = kDtypes,
                         .tp_world_sizes = std::vector<int64_t>{1},
                         .supports_vocab_padding = true,
                         .mask_modes = {MaskMode::explicit_active_mask},
                         .exports_vocab_lse = true,
                         .determinism_scopes = {DeterminismScope::cross_tp_bitwise},
                         .implementation_kind = ImplementationKind::reference}));
  register_full_reference(r2, "ANY", "any-tp");
  const DispatchResult d2 = r2.get_logprob_op(qwen_tp2());
  EXPECT_TRUE(d2.fallback);
  ASSERT_FALSE(d2.prior_rejections.empty());
  EXPECT_THAT(d2.prior_rejections[0], HasSubstr("TP=2 is unsupported"));
}

TEST(Registry, RequestValidation) {
  Registry r;
  try {
    r.get_logprob_op(qwen_tp2(), "deterministic");
    ADD_FAILURE();
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("determinism_scope"));
  }
  EXPECT_THROW(r.get_logprob_op(qwen_tp2(), "   "), ContractError);
  EXPECT_THAT(dispatch_error(r, qwen_tp2()), HasSubstr("no candidates registered"));
}

TEST(Registry, RegistrationReplacesScopesPerPlatformAndRejectsUnknownPlatforms) {
  Registry r;
  const Backend b = reference_backend("VP", "vp");
  r.register_logprob_backend(b, single_shard_cap("vp", ImplementationKind::reference));
  r.register_logprob_backend(b, full_cap("vp", ImplementationKind::reference), "cpu", true);
  EXPECT_EQ(r.contract_candidates("cpu"), std::vector<std::string>{"VP"});
  EXPECT_TRUE(r.capability("cpu", "VP")->exports_vocab_lse());
  EXPECT_FALSE(r.capability("cuda", "VP").has_value());
  EXPECT_TRUE(r.contract_candidates("cuda").empty());
  try {
    r.register_logprob_backend(b, full_cap("vp", ImplementationKind::reference), "cuda-typo");
    ADD_FAILURE();
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unsupported platform"));
  }
  try {
    r.register_logprob_backend(b, std::nullopt);
    ADD_FAILURE();
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("capability must be"));
  }
  // Stripped ids: the capability stores "padded-id".
  r.register_logprob_backend(reference_backend("PADDED", "x"),
                             full_cap("  padded-id  ", ImplementationKind::reference));
  EXPECT_EQ(r.capability("cpu", "PADDED")->backend_id(), "padded-id");
}

TEST(Registry, FixedTopologyOnlyCapability) {
  Registry r;
  BackendCapability cap({.backend_id = "fixed",
                         .roles = kRoles,
                         .dtypes = kDtypes,
                         .supports_vocab_padding = true,
                         .mask_modes = {MaskMode::explicit_active_mask},
                         .exports_vocab_lse = true,
                         .determinism_scopes = {DeterminismScope::fixed_topology},
                         .implementation_kind = ImplementationKind::reference});
  r.register_logprob_backend(reference_backend("FIXED", "fixed"), cap);
  EXPECT_THAT(dispatch_error(r, qwen_tp2()),
              HasSubstr("determinism_scope=cross_tp_bitwise is unsupported"));
  EXPECT_EQ(r.get_logprob_op(qwen_tp2(DeterminismScope::fixed_topology)).actual_backend, "fixed");
}

TEST(Registry, LegacyListsAreDecoupledAndShareTheCacheAndBlacklist) {
  Registry r;
  std::atomic<int> broken_calls{0};
  const Backend broken{"BROKEN", [&]() -> std::shared_ptr<LogprobOp> {
                         ++broken_calls;
                         throw std::runtime_error("native library missing");
                       }};
  const Backend good = reference_backend("GOOD", "good");
  r.register_legacy_backend("logprob", broken);
  r.register_legacy_backend("logprob", good);
  EXPECT_TRUE(r.contract_candidates("cpu").empty());  // legacy never feeds the contract list
  r.register_logprob_backend(broken, full_cap("broken", ImplementationKind::production));
  r.register_logprob_backend(good, full_cap("good", ImplementationKind::reference));
  EXPECT_EQ(r.legacy_priority("logprob", "cpu"), (std::vector<std::string>{"BROKEN", "GOOD"}));
  // Contract dispatch: BROKEN fails to load, is recorded, GOOD serves with fallback.
  const DispatchResult d = r.get_logprob_op(qwen_tp2());
  EXPECT_EQ(d.actual_backend, "good");
  EXPECT_TRUE(d.fallback);
  EXPECT_THAT(d.prior_rejections[0],
              HasSubstr("BROKEN: backend could not be loaded or instantiated"));
  EXPECT_TRUE(r.failed_to_load("BROKEN"));
  // Legacy path: the blacklist is shared, the factory is never called again, the cache too.
  auto op = r.get_op("logprob");
  EXPECT_EQ(op.get(), d.op.get());
  EXPECT_EQ(broken_calls.load(), 1);
  EXPECT_THROW(r.get_op("unknown_op"), std::runtime_error);
}

TEST(Registry, BuiltinBackendsOrderAndTruthfulCapabilities) {
  auto r = Registry::with_builtin_backends();
  EXPECT_EQ(
      r->contract_candidates("cpu"),
      (std::vector<std::string>{"CPU_CANONICAL_VOCAB_PARALLEL_LOGP",
                                "CPU_REFERENCE_VOCAB_PARALLEL_LOGP", "CPU_BATCH_INVARIANT_LOGP"}));
  EXPECT_TRUE(r->contract_candidates("cuda").empty());
  // The reference never appears in a legacy list.
  EXPECT_EQ(r->legacy_priority("batch_invariant_logp", "cpu"),
            std::vector<std::string>{"CPU_BATCH_INVARIANT_LOGP"});
  const DispatchResult prod = r->get_logprob_op(qwen_tp2());
  EXPECT_EQ(prod.actual_backend, kCpuCanonicalBackendId);
  EXPECT_FALSE(prod.fallback);
  const auto j = nlohmann::json::parse(prod.provenance_json);
  EXPECT_THAT(j["kernel"].get<std::string>(), HasSubstr("highway:"));
  const DispatchResult ref = r->get_logprob_op(qwen_tp2(), "reference");
  EXPECT_EQ(ref.actual_backend, kCpuReferenceBackendId);
  EXPECT_FALSE(ref.fallback);
  EXPECT_EQ(r->get_logprob_op(qwen_tp2(), std::string(kCpuReferenceBackendId)).actual_backend,
            kCpuReferenceBackendId);
  EXPECT_EQ(
      nlohmann::json::parse(ref.provenance_json)["contract"]["reduction"]["determinism_scope"],
      "cross_tp_bitwise");
  // The single-shard batch-invariant backend serves nothing vocab-parallel: asking for it
  // lists its reasons.
  EXPECT_THAT(dispatch_error(*r, qwen_tp2(), std::string(kCpuBatchInvariantBackendId)),
              HasSubstr("vocab-domain LSE export is unsupported"));
}

// The id the single-shard backend had before its rename is still accepted for one release.
TEST(Registry, RetiredBatchInvariantIdResolvesToTheCurrentId) {
  constexpr std::string_view kRetired = "cpu-batch-invariant-logp-ws1";
  EXPECT_EQ(resolve_retired_backend_id(kRetired), kCpuBatchInvariantBackendId);
  EXPECT_EQ(resolve_retired_backend_id(kCpuCanonicalBackendId), kCpuCanonicalBackendId);
  EXPECT_EQ(resolve_retired_backend_id("another-backend"), "another-backend");

  // Built-in registry: the retired id reaches the single-shard backend (its own capability
  // reasons), not a "does not match requested_backend" for every candidate.
  auto builtin = Registry::with_builtin_backends();
  const std::string msg = dispatch_error(*builtin, qwen_tp2(), kRetired);
  EXPECT_THAT(msg, HasSubstr("CPU_BATCH_INVARIANT_LOGP: TP=2 is unsupported"));
  EXPECT_THAT(msg, Not(HasSubstr("CPU_BATCH_INVARIANT_LOGP: backend_id=")));

  // A registry where that id can serve the contract: dispatch resolves it, and the provenance
  // keeps the request as given.
  Registry r;
  r.register_logprob_backend(
      reference_backend("BATCH_INVARIANT_STANDIN", std::string(kCpuBatchInvariantBackendId)),
      full_cap(std::string(kCpuBatchInvariantBackendId), ImplementationKind::reference));
  const DispatchResult d = r.get_logprob_op(qwen_tp2(), std::string(" ") + std::string(kRetired));
  EXPECT_EQ(d.actual_backend, kCpuBatchInvariantBackendId);
  EXPECT_EQ(d.requested_backend, kRetired);
  EXPECT_FALSE(d.fallback);
}

// Rejected requests and registrations carry a code and the field, not only a message.
TEST(Registry, RejectionsCarryErrorCodes) {
  Registry r;
  EXPECT_EQ(contract_error_code([&] { r.get_logprob_op(qwen_tp2(), "  "); }),
            "empty:requested_backend");
  EXPECT_EQ(contract_error_code([&] { r.get_logprob_op(qwen_tp2(), "Deterministic"); }),
            "reserved_name:requested_backend");
  EXPECT_EQ(contract_error_code([&] { r.get_logprob_op(qwen_tp2(), "auto", "cuda-typo"); }),
            "unknown_platform:platform");
  EXPECT_EQ(contract_error_code(
                [&] { r.register_logprob_backend(reference_backend("VP", "vp"), std::nullopt); }),
            "empty:capability");
  EXPECT_EQ(
      contract_error_code([&] { (void)full_cap("Production", ImplementationKind::reference); }),
      "reserved_name:backend_id");
  // No fitting backend is not a contract violation: std::runtime_error, as before.
  EXPECT_THROW(r.get_logprob_op(qwen_tp2()), std::runtime_error);
}

// The canon promises identical bits from both CPU backends; shown through the registry.
TEST(Registry, ProductionEqualsReferenceBitwise) {
  const int64_t real = 1000, padded = 1024, rows = 9;
  auto r = Registry::with_builtin_backends();
  const Layout layout{real, padded, {{0, 384}, {384, 1024}}};
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32}) {
    auto logits = make_logits(dtype, rows, real, padded, 77);
    std::vector<int64_t> targets(rows);
    for (int64_t i = 0; i < rows; ++i) targets[i] = (i * 97) % real;
    const ContractOptions copt{.dtype = dtype,
                               .active = {true, true, false, true, true, true, true, false, true},
                               .tile_width = 64,
                               .temperature = 0.7f};
    const GradInputs g{std::vector<float>(rows, 0.5f), std::vector<float>(rows, -0.25f),
                       std::vector<float>(rows, 0.125f)};
    const LogprobContract c0 = make_contract(layout, 0, rows, copt);
    auto prod = r->get_logprob_op(c0, "production").op;
    auto ref = r->get_logprob_op(c0, "reference").op;
    const TpRun a = run_tp(*prod, logits, layout, targets, copt, {.entropy = true}, g);
    const TpRun b = run_tp(*ref, logits, layout, targets, copt, {.entropy = true}, g);
    EXPECT_EQ(bits(a.ranks[0].result.logp), bits(b.ranks[0].result.logp));
    EXPECT_EQ(bits(a.ranks[0].result.lse), bits(b.ranks[0].result.lse));
    EXPECT_EQ(bits(a.ranks[0].result.entropy), bits(b.ranks[0].result.entropy));
    EXPECT_EQ(real_grad_bytes(a.grad, padded), real_grad_bytes(b.grad, padded));
  }
}

TEST(Registry, ConcurrentDispatchAndRegistration) {
  auto r = Registry::with_builtin_backends();
  const LogprobContract c = qwen_tp2();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (t == 0 && i % 20 == 0) {
          register_full_reference(*r, "EXTRA_" + std::to_string(i), "extra");
        }
        const DispatchResult d = r->get_logprob_op(c, i % 2 ? "auto" : "reference");
        ok += d.op != nullptr;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 8 * 200);
  // One instance per backend, whatever the concurrency.
  EXPECT_EQ(r->get_logprob_op(c).op.get(), r->get_logprob_op(c).op.get());
}

}  // namespace
}  // namespace detlogp::testing
