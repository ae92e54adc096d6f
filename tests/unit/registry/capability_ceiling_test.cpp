// A backend over detlogp's own kernels cannot declare more than those kernels compute: the
// registry refuses the over-claim at registration instead of dispatching other numerics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "detlogp/registry.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

BackendCapability claim(const std::string& id, std::set<DeterminismScope> scopes,
                        std::optional<std::vector<int64_t>> tp = std::nullopt) {
  return BackendCapability({.backend_id = id,
                            .roles = {Role::train, Role::infer},
                            .dtypes = {DType::fp32},
                            .tp_world_sizes = std::move(tp),
                            .mask_modes = {MaskMode::ignore_index},
                            .determinism_scopes = std::move(scopes),
                            .implementation_kind = ImplementationKind::production});
}

ContractError registration_error(Registry& r, const Backend& b, const BackendCapability& cap) {
  try {
    r.register_logprob_backend(b, cap);
  } catch (const ContractError& e) {
    return e;
  }
  ADD_FAILURE() << "registration of " << b.name << " unexpectedly succeeded";
  return ContractError("none");
}

TEST(CapabilityCeiling, BatchInvariantKernelsCannotClaimCrossTpBitwise) {
  Registry r;
  const Backend bi = cpu_backend("BI", "bi", "batch_invariant");
  const ContractError e = registration_error(
      r, bi,
      claim("bi", {DeterminismScope::cross_tp_bitwise, DeterminismScope::fixed_topology},
            std::vector<int64_t>{1}));
  EXPECT_EQ(e.code(), ErrorCode::not_supported);
  EXPECT_EQ(e.field(), "capability.determinism_scopes");
  EXPECT_THAT(e.what(), HasSubstr("backend BI declares determinism_scopes=[fixed_topology, "
                                  "cross_tp_bitwise] but its kernels provide "
                                  "determinism_scopes=[fixed_topology]"));
  EXPECT_THAT(e.what(), HasSubstr("register a backend over kernels that provide it"));
  EXPECT_TRUE(r.contract_candidates("cpu").empty());  // nothing was registered
  // Nor any TP: the single-shard op serves TP=1 only, and only the tile order of its own.
  EXPECT_EQ(registration_error(r, bi, claim("bi", {DeterminismScope::fixed_topology})).field(),
            "capability.tp_world_sizes");
  // What the kernels do provide registers, and dispatches.
  r.register_logprob_backend(
      bi, cpu_kernels_capability("batch_invariant", "bi", ImplementationKind::reference));
  EXPECT_EQ(r.contract_candidates("cpu"), std::vector<std::string>{"BI"});
}

TEST(CapabilityCeiling, CanonicalKernelsMayDeclareLessButNotAnotherOrder) {
  Registry r;
  const Backend ref = cpu_backend("REF", "ref", "reference");
  r.register_logprob_backend(ref, claim("ref", {DeterminismScope::fixed_topology}, {{1, 2}}));
  BackendCapability other_order({.backend_id = "ref",
                                 .roles = {Role::train},
                                 .dtypes = {DType::fp32},
                                 .determinism_scopes = {DeterminismScope::cross_tp_bitwise},
                                 .reduction_orders = {ReductionOrder::global_vocab_shard_index}});
  EXPECT_EQ(registration_error(r, ref, other_order).field(), "capability.reduction_orders");
  // The refused re-registration left the earlier capability in place.
  EXPECT_EQ(r.capability("cpu", "REF")->tp_world_sizes(), (std::vector<int64_t>{1, 2}));
}

TEST(CapabilityCeiling, BuiltinBackendsDeclareExactlyWhatTheirKernelsProvide) {
  auto r = Registry::with_builtin_backends();
  for (const std::string& name : r->contract_candidates("cpu")) {
    const auto cap = r->capability("cpu", name);
    ASSERT_TRUE(cap.has_value()) << name;
    const std::string kernels = name == "CPU_BATCH_INVARIANT_LOGP"            ? "batch_invariant"
                                : name == "CPU_REFERENCE_VOCAB_PARALLEL_LOGP" ? "reference"
                                                                              : "canonical";
    EXPECT_EQ(
        cap->to_json(),
        cpu_kernels_capability(kernels, cap->backend_id(), cap->implementation_kind()).to_json());
  }
  EXPECT_THROW(cpu_backend("X", "x", "fast"), ContractError);
}

}  // namespace
}  // namespace detlogp::testing
