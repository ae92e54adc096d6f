// ForwardOptions::entropy_grad: the entropy as a constant (a logged metric). Same bits as the
// differentiable entropy, same gradients for logp and LSE, and backward refuses grad_entropy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "op_test_util.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

TEST(EntropyGrad, ConstantEntropyKeepsEveryBitAndRejectsItsGradient) {
  const int64_t real = 27, padded = 32, rows = 6;
  const VocabParallelLogprob op(simd_kernels(), "test-canonical");
  const ContractOptions copt{.active = {true, true, true, true, true, false}, .tile_width = 4};
  const std::vector<int64_t> targets = {1, 5, 26, 0, 13, -100};
  const auto logits = make_logits(DType::fp32, rows, real, padded, 2026, 1.0f);
  const Layout layout{real, padded, {{0, 8}, {8, 16}, {16, 32}}};
  const GradInputs g{std::vector<float>(rows, 0.5f), std::vector<float>(rows, -0.25f), {}};
  const TpRun with = run_tp(op, logits, layout, targets, copt, {.entropy = true}, g);
  const TpRun without =
      run_tp(op, logits, layout, targets, copt, {.entropy = true, .entropy_grad = false}, g);
  for (std::size_t r = 0; r < layout.bounds.size(); ++r) {
    EXPECT_EQ(bits(with.ranks[r].result.logp), bits(without.ranks[r].result.logp));
    EXPECT_EQ(bits(with.ranks[r].result.lse), bits(without.ranks[r].result.lse));
    ASSERT_EQ(without.ranks[r].result.entropy.size(), static_cast<std::size_t>(rows));
    EXPECT_EQ(bits(with.ranks[r].result.entropy), bits(without.ranks[r].result.entropy));
  }
  EXPECT_EQ(real_grad_bytes(with.grad, padded), real_grad_bytes(without.grad, padded));

  // A gradient for the constant entropy is a caller bug: rejected, not dropped.
  const LogprobContract c = make_contract(Layout{real, padded, {{0, padded}}}, 0, rows, copt);
  SelfComm self;
  const LogprobResult res = op.forward(logits.shard(0, padded), targets, c, self,
                                       {.entropy = true, .entropy_grad = false});
  std::vector<float> grad(static_cast<std::size_t>(rows * padded));
  const std::vector<float> ge(rows, 1.0f);
  const MutableLogitsView gv{.data = grad.data(),
                             .dtype = DType::fp32,
                             .rows = rows,
                             .cols = padded,
                             .row_stride = padded};
  try {
    op.backward(res, {.grad_entropy = ge}, gv);
    ADD_FAILURE() << "grad_entropy accepted";
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("entropy_grad=false"));
  }
  // The differentiable entropy still takes it.
  const LogprobResult res2 =
      op.forward(logits.shard(0, padded), targets, c, self, {.entropy = true});
  EXPECT_NO_THROW(op.backward(res2, {.grad_entropy = ge}, gv));
}

}  // namespace
}  // namespace detlogp::testing
