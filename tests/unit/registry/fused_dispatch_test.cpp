// Contract dispatch of the fused lm_head: a truthful capability, provenance naming what runs,
// no silent fallback for a contract it cannot serve.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "detlogp/fused_dispatch.hpp"
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
  }
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
    EXPECT_NE(std::string(e.what()).find(std::string(kCpuFusedBackendId)), std::string::npos);
  }
}

}  // namespace
}  // namespace detlogp::testing
