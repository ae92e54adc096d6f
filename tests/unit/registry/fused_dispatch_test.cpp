// Contract dispatch of the fused lm_head through the registry (OpKind::fused_linear): a truthful
// capability, provenance naming what runs, no silent fallback for a contract it cannot serve,
// and a candidate list of its own.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "detlogp/fused_dispatch.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/version.hpp"
#include "op/op_test_util.hpp"

namespace detlogp::testing {
namespace {

LogprobContract contract_with(ReductionOrder order, DType dtype = DType::bf16) {
  const Layout layout{.real = 200, .padded = 256, .bounds = {{0, 128}, {128, 256}}};
  MaskSpec mask = MaskSpec::all_active(4);
  ShardingSpec sharding({.tp_rank = 1,
                         .tp_world_size = 2,
                         .vocab_shard_bounds = layout.bounds,
                         .real_vocab_size = layout.real,
                         .padded_vocab_size = layout.padded});
  ReductionSpec reduction({.order = order});
  return LogprobContract({.role = Role::train,
                          .dtype = dtype,
                          .mask = mask,
                          .sharding = sharding,
                          .reduction = reduction,
                          .tile_width = 64});
}

TEST(FusedDispatch, HandsOutTheFusedOpWithProvenance) {
  for (DType dt : {DType::bf16, DType::fp16, DType::fp32}) {
    const FusedDispatchResult d =
        get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree, dt));
    ASSERT_TRUE(d.op);
    EXPECT_EQ(d.capability.backend_id(), kCpuFusedBackendId);
    EXPECT_EQ(d.capability.implementation_kind(), ImplementationKind::production);
    const auto p = nlohmann::json::parse(d.provenance_json);
    EXPECT_EQ(p["op_kind"], kFusedOpKind);
    EXPECT_EQ(p["kernel"], d.op->kernel_name());
    EXPECT_EQ(p["kernel"].get<std::string>().rfind("highway:", 0), 0u);
    EXPECT_EQ(p["contract"]["sharding"]["tp_world_size"], 2);
    EXPECT_EQ(p["actual_backend"], kCpuFusedBackendId);
    EXPECT_EQ(p["backend_enum"], "CPU_FUSED_LINEAR_LOGP");
    EXPECT_EQ(p["platform"], "cpu");
    EXPECT_EQ(p["fallback"], false);
    EXPECT_EQ(p["numerics_version"], kNumericsVersion);
  }
}

TEST(FusedDispatch, APinnedSimdTargetKeepsTheProductionBackend) {
  for (const std::string& kernel : fused_kernel_names()) {
    if (kernel == "scalar-reference") continue;
    const FusedDispatchResult d =
        get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree), kernel);
    EXPECT_EQ(d.op->kernel_name(), kernel);
    EXPECT_EQ(d.op->backend_id(), kCpuFusedBackendId);
    EXPECT_EQ(d.capability.implementation_kind(), ImplementationKind::production);
    EXPECT_EQ(nlohmann::json::parse(d.provenance_json)["kernel"], kernel);
  }
}

TEST(FusedDispatch, TheRegistryHoldsTheFusedKindApart) {
  Registry& r = Registry::global();
  EXPECT_EQ(r.contract_candidates("cpu", OpKind::fused_linear),
            (std::vector<std::string>{"CPU_FUSED_LINEAR_LOGP", "CPU_FUSED_LINEAR_REFERENCE_LOGP"}));
  EXPECT_TRUE(r.contract_candidates("cuda", OpKind::fused_linear).empty());
  for (const std::string& name : r.contract_candidates("cpu")) {
    EXPECT_EQ(name.find("FUSED"), std::string::npos) << name;
  }
  const auto cap = r.capability("cpu", "CPU_FUSED_LINEAR_REFERENCE_LOGP");
  ASSERT_TRUE(cap);
  EXPECT_EQ(cap->backend_id(), kCpuFusedReferenceBackendId);
  EXPECT_EQ(cap->implementation_kind(), ImplementationKind::reference);
  // The policies work as for the logits op.
  const FusedDispatchResult d = r.get_fused_linear_logprob_op(
      contract_with(ReductionOrder::canonical_tile_tree), "reference");
  EXPECT_EQ(d.actual_backend, kCpuFusedReferenceBackendId);
  EXPECT_EQ(d.op->kernel_name(), "scalar-reference");
  EXPECT_FALSE(d.fallback);
  EXPECT_THROW(
      r.get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree), " "),
      ContractError);
}

TEST(FusedDispatch, ARegisteredFusedBackendIsCheckedAndDispatched) {
  Registry r;
  // A capability beyond what the CPU fused kernels provide is refused.
  BackendCapability too_much({.backend_id = "mine",
                              .roles = {Role::train, Role::infer},
                              .dtypes = {DType::bf16},
                              .determinism_scopes = {DeterminismScope::fixed_topology},
                              .reduction_orders = {ReductionOrder::global_vocab_shard_index}});
  try {
    r.register_fused_backend(cpu_fused_backend("MINE", "mine", "scalar-reference"), too_much);
    ADD_FAILURE() << "a capability beyond the kernels was accepted";
  } catch (const ContractError& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_supported);
    EXPECT_EQ(e.field(), "capability.reduction_orders");
  }
  r.register_fused_backend(cpu_fused_backend("MINE", "mine", "scalar-reference"),
                           fused_linear_logprob_capability(ImplementationKind::production, "mine"));
  const FusedDispatchResult d =
      r.get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree), "mine");
  EXPECT_EQ(d.op->backend_id(), "mine");
  EXPECT_EQ(d.backend_name, "MINE");
  // Created once, like every backend.
  EXPECT_EQ(r.get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree)).op,
            d.op);
  // The logits op kind has its own list, and a name belongs to one kind.
  EXPECT_TRUE(r.contract_candidates("cpu").empty());
  try {
    r.register_logprob_backend(
        cpu_backend("MINE", "mine", "reference"),
        cpu_kernels_capability("reference", "mine", ImplementationKind::reference));
    ADD_FAILURE() << "one name registered for two op kinds";
  } catch (const ContractError& e) {
    EXPECT_EQ(e.code(), ErrorCode::duplicate);
    EXPECT_NE(std::string(e.what()).find("fused_linear"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.get_logprob_op(contract_with(ReductionOrder::canonical_tile_tree)),
               std::runtime_error);
}

TEST(FusedDispatch, TheScalarKernelsAreAReferenceBackend) {
  const FusedDispatchResult d = get_fused_linear_logprob_op(
      contract_with(ReductionOrder::canonical_tile_tree), "scalar-reference");
  EXPECT_EQ(d.op->kernel_name(), "scalar-reference");
  EXPECT_EQ(d.capability.implementation_kind(), ImplementationKind::reference);
  EXPECT_THROW(get_fused_linear_logprob_op(contract_with(ReductionOrder::canonical_tile_tree),
                                           "no-such-kernel"),
               ContractError);
}

TEST(FusedDispatch, NeverServesAnotherReductionOrder) {
  try {
    get_fused_linear_logprob_op(contract_with(ReductionOrder::global_vocab_shard_index));
    ADD_FAILURE() << "a contract asking for another order was served";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "CPU_FUSED_LINEAR_LOGP: order=global_vocab_shard_index is unsupported"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace detlogp::testing
